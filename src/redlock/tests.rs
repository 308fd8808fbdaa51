//! `Redlock` over fake nodes on a paused clock: retries, deadlines, fail-closed fencing,
//! release on drop, cancellation, the extension task and `close()`, each in milliseconds of
//! real time. The real-server suites keep the wire, script and fault coverage.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::*;
use crate::error::{BoxError, FencingError, LossReason};
use crate::fence::FencingCounter;
use crate::node::Op;
use crate::testing::fake::{Fake, FakeNode};
use crate::{Backoff, RedlockBuilder};

const MS: Duration = Duration::from_millis(1);
const TTL: Duration = Duration::from_secs(10);

/// `n` healthy fake nodes and a `Redlock` over them built from `builder`.
fn over(n: usize, builder: RedlockBuilder) -> (Vec<Arc<FakeNode>>, Redlock) {
    builder.build_over_fakes(n)
}

fn holders(fakes: &[Arc<FakeNode>], key: &str) -> usize {
    fakes.iter().filter(|f| f.holder(key).is_some()).count()
}

fn attempts(fakes: &[Arc<FakeNode>]) -> usize {
    fakes[0]
        .calls()
        .iter()
        .filter(|op| **op == Op::Acquire)
        .count()
}

#[tokio::test(start_paused = true)]
async fn acquire_retries_until_the_other_owner_expires() {
    let builder =
        RedlockBuilder::new().backoff(Backoff::fixed(100 * MS, Duration::ZERO).retries(10));
    let (fakes, redlock) = over(3, builder);
    for f in &fakes {
        f.put("r", "someone else", 350 * MS);
    }
    let t0 = Instant::now();
    let lock = redlock.acquire(&["r"], TTL).await.expect("acquired");
    // Refused at 0, 100, 200 and 300 ms; granted at 400 ms.
    assert_eq!(t0.elapsed(), 400 * MS);
    assert_eq!(attempts(&fakes), 5);
    // Granted by a majority; the last node may still be on its way.
    assert!(holders(&fakes, "r") >= 2);
    lock.release().await.expect("release");
    assert_eq!(holders(&fakes, "r"), 0);
}

#[tokio::test(start_paused = true)]
async fn contention_reports_the_final_attempt_count() {
    let builder = RedlockBuilder::new().backoff(Backoff::fixed(10 * MS, Duration::ZERO).retries(4));
    let (fakes, redlock) = over(3, builder);
    for f in &fakes {
        f.put("r", "someone else", TTL);
    }
    let err = redlock.acquire(&["r"], TTL).await.expect_err("held");
    assert!(
        matches!(
            err,
            Error::Contended {
                attempts: 5,
                denied: 3,
                nodes: 3,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(attempts(&fakes), 5);
    // try_acquire makes exactly one attempt.
    let err = redlock.try_acquire(&["r"], TTL).await.expect_err("held");
    assert!(
        matches!(err, Error::Contended { attempts: 1, .. }),
        "{err:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn acquire_timeout_stops_retrying_before_the_deadline() {
    let builder = RedlockBuilder::new()
        .backoff(Backoff::fixed(100 * MS, Duration::ZERO).retries(u32::MAX))
        .acquire_timeout(350 * MS);
    let (fakes, redlock) = over(3, builder);
    for f in &fakes {
        f.put("r", "someone else", TTL);
    }
    let t0 = Instant::now();
    let err = redlock.acquire(&["r"], TTL).await.expect_err("held");
    match err {
        Error::AcquireTimeout { attempts, last, .. } => {
            // Attempts at 0, 100, 200 and 300 ms; the next would start past 350 ms.
            assert_eq!(attempts, 4);
            assert!(matches!(
                last.as_deref(),
                Some(Error::Contended { attempts: 4, .. })
            ));
        }
        other => panic!("expected AcquireTimeout, got {other:?}"),
    }
    assert_eq!(t0.elapsed(), 300 * MS);
}

/// A counter that fails, or never answers.
struct BrokenCounter {
    hang: bool,
    calls: AtomicU32,
}

impl FencingCounter for BrokenCounter {
    fn next_fence<'a>(&'a self, _: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let hang = self.hang;
        Box::pin(async move {
            if hang {
                std::future::pending::<()>().await;
            }
            Err("the counter's database is down".into())
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_counter_fails_closed_and_releases_everywhere() {
    for hang in [false, true] {
        let counter = Arc::new(BrokenCounter {
            hang,
            calls: AtomicU32::new(0),
        });
        let builder = RedlockBuilder::new()
            .fencing(Arc::clone(&counter))
            .fencing_timeout(200 * MS);
        let (fakes, redlock) = over(3, builder);
        let err = redlock.acquire(&["r"], TTL).await.expect_err("no token");
        match (&err, hang) {
            (Error::Fencing(FencingError::Timeout(t)), true) => assert_eq!(*t, 200 * MS),
            (Error::Fencing(FencingError::Counter(_)), false) => {}
            other => panic!("unexpected {other:?}"),
        }
        // Final: not retried, and nothing is left locked.
        assert_eq!(counter.calls.load(Ordering::SeqCst), 1);
        assert_eq!(holders(&fakes, "r"), 0);
        assert!(fakes.iter().all(|f| f.calls().contains(&Op::Release)));
    }
}

#[tokio::test(start_paused = true)]
async fn a_dropped_lock_is_released_and_close_waits_for_it() {
    let (fakes, redlock) = over(3, RedlockBuilder::new());
    let lock = redlock.acquire(&["r"], TTL).await.expect("acquired");
    assert!(holders(&fakes, "r") >= 2);
    drop(lock);
    // The release runs in the background; close() returns only once it has.
    redlock.close().await;
    assert_eq!(holders(&fakes, "r"), 0);
    // Closed: no new acquisition, in any clone.
    let err = redlock
        .clone()
        .acquire(&["s"], TTL)
        .await
        .expect_err("closed");
    assert!(matches!(err, Error::Closed), "{err:?}");
    let err = redlock.try_acquire(&["s"], TTL).await.expect_err("closed");
    assert!(matches!(err, Error::Closed), "{err:?}");
    assert_eq!(holders(&fakes, "s"), 0);
}

#[tokio::test(start_paused = true)]
async fn close_waits_for_stragglers_on_a_hung_node_at_most_a_node_timeout() {
    let builder = RedlockBuilder::new().node_timeout(50 * MS);
    let (fakes, redlock) = over(3, builder);
    // The third node hangs on the acquire, then answers again: the release queued behind the
    // hung call goes out once it timed out.
    fakes[2].set(Op::Acquire, Fake::Never);
    let lock = redlock.acquire(&["r"], TTL).await.expect("two of three");
    drop(lock);
    let t0 = Instant::now();
    redlock.close().await;
    assert!(t0.elapsed() <= 50 * MS, "{:?}", t0.elapsed());
    assert_eq!(holders(&fakes, "r"), 0);
    assert!(fakes[2].calls().contains(&Op::Release));
}

#[tokio::test(start_paused = true)]
async fn close_waits_for_a_release_a_node_that_stays_hung_never_confirmed_until_its_ttl() {
    let builder = RedlockBuilder::new().node_timeout(50 * MS);
    let (fakes, redlock) = over(3, builder);
    fakes[2].set_all(Fake::Never);
    let lock = redlock.acquire(&["r"], TTL).await.expect("two of three");
    drop(lock);
    let t0 = Instant::now();
    redlock.close().await;
    // The release is sent again until its lock's TTL has passed (its key is gone by then).
    assert!(t0.elapsed() >= TTL, "{:?}", t0.elapsed());
    assert!(t0.elapsed() <= TTL + 2 * 1_000 * MS, "{:?}", t0.elapsed());
    assert_eq!(holders(&fakes, "r"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_acquire_leaves_nothing_locked() {
    let (fakes, redlock) = over(3, RedlockBuilder::new().node_timeout(500 * MS));
    for f in &fakes {
        f.set(Op::Acquire, Fake::Slow(100 * MS));
    }
    let cut = tokio::time::timeout(50 * MS, redlock.acquire(&["r"], TTL)).await;
    assert!(cut.is_err(), "the acquire should still be in flight");
    redlock.close().await;
    assert_eq!(holders(&fakes, "r"), 0);
    assert!(fakes.iter().all(|f| f.calls().contains(&Op::Release)));
}

#[tokio::test(start_paused = true)]
async fn the_extension_task_keeps_the_lock_then_aborts_when_a_majority_fails() {
    let builder = RedlockBuilder::new().automatic_extension_threshold(200 * MS);
    let (fakes, redlock) = over(3, builder);
    let ttl = Duration::from_secs(1);
    let checker = &fakes;
    let (err, held_for) = redlock
        .using(&["job"], ttl, |signal| async move {
            let t0 = Instant::now();
            // Five TTLs on healthy nodes: extended all along.
            tokio::time::sleep(5 * ttl).await;
            assert!(!signal.is_aborted());
            assert_eq!(holders(checker, "job"), 3);
            let extends = checker[0]
                .calls()
                .iter()
                .filter(|op| **op == Op::Extend)
                .count();
            assert!(extends >= 5, "{extends} extensions");
            // Two of three nodes start failing: the signal aborts before the lock expires.
            for f in &checker[..2] {
                f.set(Op::Extend, Fake::Fail);
            }
            let err = signal.aborted().await;
            assert!(
                signal.remaining() > Duration::ZERO,
                "aborted only at expiry"
            );
            Ok::<_, Error>((err, t0.elapsed()))
        })
        .await
        .expect("using");
    assert!(
        matches!(
            err,
            Error::LockLost {
                reason: LossReason::Unconfirmed { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(held_for < 5 * ttl + ttl, "{held_for:?}");
    // The scope released what was left.
    assert_eq!(holders(&fakes, "job"), 0);
}
