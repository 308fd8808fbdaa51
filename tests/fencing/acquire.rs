//! Through `acquire`, with any counter: increasing fences, and failing closed when the
//! counter fails, hangs, or answers after the lock expired.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use redfence::{BoxError, Error, FencingCounter, FencingError, MemoryCounter};

use crate::support::{Servers, TestRedlock};
use crate::{TTL, no_key_left};

/// A counter whose every call fails.
struct Failing;

impl FencingCounter for Failing {
    fn next_fence<'a>(&'a self, _: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>> {
        Box::pin(async { Err("the ledger database is read-only".into()) })
    }
}

/// A counter that answers after a delay (or never, with `None`).
struct Slow(Option<Duration>);

impl FencingCounter for Slow {
    fn next_fence<'a>(&'a self, _: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>> {
        let delay = self.0;
        Box::pin(async move {
            match delay {
                Some(delay) => tokio::time::sleep(delay).await,
                None => std::future::pending::<()>().await,
            }
            Ok(1)
        })
    }
}

#[tokio::test]
async fn locks_carry_increasing_fences_and_multi_resource_fences_exceed_each_resource() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .fencing(MemoryCounter::new())
        .build()
        .expect("config");
    let fence = |resources: &'static [&'static str]| {
        let redlock = redlock.clone();
        async move {
            let lock = redlock.acquire(resources, TTL).await.expect("acquire");
            let fence = lock.fence().expect("a fence");
            lock.release().await.expect("release");
            fence
        }
    };
    let a1 = fence(&["a"]).await;
    let a2 = fence(&["a"]).await;
    let b1 = fence(&["b"]).await;
    assert!(a2 > a1);
    let ab = fence(&["a", "b"]).await;
    assert!(ab > a2 && ab > b1, "{ab} vs a {a2}, b {b1}");
    let b2 = fence(&["b"]).await;
    assert!(b2 > ab);
    let ca = fence(&["c", "a"]).await;
    assert!(ca > ab);

    // Without a counter, locks carry no fence.
    let plain = servers.redlock();
    let lock = plain.acquire(&["a"], TTL).await.expect("acquire");
    assert_eq!(lock.fence(), None);
    lock.release().await.expect("release");
}

#[tokio::test]
async fn a_failing_counter_fails_closed_and_leaves_no_key() {
    let servers = Servers::start(3);
    let redlock = servers.builder().fencing(Failing).build().expect("config");
    let err = redlock
        .acquire(&["invoice:1", "invoice:2"], TTL)
        .await
        .expect_err("no token, no lock");
    match &err {
        Error::Fencing(FencingError::Counter(e)) => {
            assert!(e.to_string().contains("read-only"), "{e}")
        }
        other => panic!("expected Fencing(Counter), got {other:?}"),
    }
    assert!(!err.is_retryable() && !err.is_lock_lost());
    assert!(err.to_string().contains("fencing"), "{err}");
    // The quorum was reached, then released on every node.
    assert!(no_key_left(&servers).await);
}

/// A counter that hands out 0, which is not a token.
struct Zero;

impl FencingCounter for Zero {
    fn next_fence<'a>(&'a self, _: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>> {
        Box::pin(async { Ok(0) })
    }
}

#[tokio::test]
async fn a_counter_that_returns_zero_fails_closed() {
    let servers = Servers::start(3);
    let redlock = servers.builder().fencing(Zero).build().expect("config");
    let err = redlock
        .acquire(&["invoice:1"], TTL)
        .await
        .expect_err("0 is not a token");
    assert!(
        matches!(&err, Error::Fencing(FencingError::Counter(e)) if e.to_string().contains("returned 0")),
        "{err:?}"
    );
    assert!(no_key_left(&servers).await);
}

#[tokio::test]
async fn a_hanging_counter_hits_the_fencing_timeout() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .fencing(Slow(None))
        .fencing_timeout(Duration::from_millis(200))
        .build()
        .expect("config");
    let started = Instant::now();
    let err = redlock
        .acquire(&["job"], TTL)
        .await
        .expect_err("the counter never answers");
    assert!(
        matches!(err, Error::Fencing(FencingError::Timeout(t)) if t == Duration::from_millis(200)),
        "{err:?}"
    );
    // Not retried: one attempt, bounded by the fencing timeout (generous margin).
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(no_key_left(&servers).await);
}

#[tokio::test]
async fn a_counter_answering_after_the_lock_expired_fails_closed() {
    let servers = Servers::start(3);
    // The fencing timeout is long, but the lock's validity (~150 ms) bounds the call.
    let redlock = servers
        .builder()
        .fencing(Slow(Some(Duration::from_secs(2))))
        .fencing_timeout(Duration::from_secs(10))
        .build()
        .expect("config");
    let started = Instant::now();
    let err = redlock
        .acquire(&["job"], Duration::from_millis(150))
        .await
        .expect_err("expired before the token");
    assert!(
        matches!(err, Error::Fencing(FencingError::LockExpired)),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(no_key_left(&servers).await);
}
