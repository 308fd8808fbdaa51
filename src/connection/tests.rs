use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;

use super::server::{asks_again, is_not_master};
use super::*;

#[test]
fn the_reconnect_delay_doubles_up_to_its_cap() {
    assert_eq!(reconnect_delay(1), Duration::from_millis(100));
    assert_eq!(reconnect_delay(2), Duration::from_millis(200));
    assert_eq!(reconnect_delay(5), Duration::from_millis(1600));
    assert_eq!(reconnect_delay(6), MAX_RECONNECT_DELAY);
    assert_eq!(reconnect_delay(u32::MAX), MAX_RECONNECT_DELAY);
}

/// The error a server's reply `line` (without its CRLF) makes, as redis-rs gives it.
fn server_error(line: &str) -> RedisError {
    match redis::parse_redis_value(format!("{line}\r\n").as_bytes()) {
        Ok(redis::Value::ServerError(err)) => err.into(),
        other => panic!("not an error reply: {other:?}"),
    }
}

#[test]
fn only_connect_time_failures_need_a_new_connection() {
    let auth = server_error("-WRONGPASS invalid username-password pair");
    assert!(needs_new_connection(&auth));
    // A handshake that failed on the client's side, as redis-rs reports it.
    #[cfg(feature = "tls-rustls")]
    {
        let untrusted = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        assert!(needs_new_connection(&RedisError::from(untrusted)));
    }
    let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    assert!(!needs_new_connection(&io));
    assert!(!needs_new_connection(&server_error(
        "-WRONGTYPE Operation against a key holding the wrong kind of value"
    )));
}

#[test]
fn a_sentinel_source_asks_again_after_a_demotion_or_a_lost_connection() {
    let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
    assert!(asks_again(&io));
    assert!(is_not_master(Some("READONLY")));
    assert!(is_not_master(Some("NOREPLICAS")));
    assert!(!is_not_master(Some("BUSY")));
    assert!(!is_not_master(None));
    assert!(!asks_again(&server_error(
        "-WRONGTYPE Operation against a key holding the wrong kind of value"
    )));
}

/// A `make` that counts its calls and, after `delay`, fails or returns the call's number.
fn maker(
    calls: &Arc<AtomicU32>,
    delay: Duration,
    fail: bool,
) -> impl FnOnce() -> BoxFuture<'static, Result<u32, RedisError>> + Send + 'static {
    let calls = Arc::clone(calls);
    move || {
        Box::pin(async move {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(delay).await;
            if fail {
                Err(RedisError::from(std::io::Error::from(
                    std::io::ErrorKind::ConnectionRefused,
                )))
            } else {
                Ok(n)
            }
        })
    }
}

/// What a caller gets now: the held connection, or one made at once.
async fn got(holder: &Holder<u32>, calls: &Arc<AtomicU32>) -> Result<(u64, u32), NodeFailure> {
    holder
        .get_or_make(maker(calls, Duration::ZERO, false))
        .await
}

#[tokio::test(start_paused = true)]
async fn callers_waiting_on_a_failed_attempt_share_its_error() {
    let holder = Arc::new(Holder::<u32>::new(Duration::from_secs(1)));
    let calls = Arc::new(AtomicU32::new(0));
    let waiting: Vec<_> = (0..5)
        .map(|_| {
            let (holder, make) = (
                Arc::clone(&holder),
                maker(&calls, Duration::from_millis(100), true),
            );
            tokio::spawn(async move { holder.get_or_make(make).await })
        })
        .collect();
    for caller in waiting {
        assert!(caller.await.expect("task").is_err());
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "one attempt for five callers"
    );
    // A caller that comes after the failure tries again.
    let made = got(&holder, &calls).await;
    assert_eq!(made.expect("made"), (1, 2));
}

#[tokio::test(start_paused = true)]
async fn a_making_outlives_the_caller_that_gave_up() {
    let holder = Holder::<u32>::new(Duration::from_secs(1));
    let calls = Arc::new(AtomicU32::new(0));
    let slow = holder.get_or_make(maker(&calls, Duration::from_millis(500), false));
    assert!(
        tokio::time::timeout(Duration::from_millis(100), slow)
            .await
            .is_err()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(holder.current(), Some((1, 1)), "made after the caller left");
}

#[tokio::test(start_paused = true)]
async fn a_refusal_at_connect_time_is_returned_until_its_backoff_passed() {
    let holder = Holder::<u32>::new(Duration::from_secs(1));
    let calls = Arc::new(AtomicU32::new(0));
    let refused = || {
        let calls = Arc::clone(&calls);
        move || {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Err(server_error("-WRONGPASS invalid password")))
        }
    };
    assert!(holder.get_or_make(refused()).await.is_err());
    // Within the backoff (100 ms): the same error, no new attempt.
    let again = holder.get_or_make(refused()).await;
    let again = again.expect_err("refused");
    assert_eq!(again.redis().and_then(RedisError::code), Some("WRONGPASS"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_connection_is_forgotten_only_by_its_own_generation() {
    let holder = Holder::<u32>::new(Duration::from_secs(1));
    let calls = Arc::new(AtomicU32::new(0));
    let (first, _) = got(&holder, &calls).await.expect("made");
    holder.forget(first);
    let (second, conn) = got(&holder, &calls).await.expect("made again");
    assert_eq!((second, conn), (2, 2));
    // A late forget for the first connection leaves the second alone.
    holder.forget(first);
    let again = got(&holder, &calls).await.expect("held");
    assert_eq!(again, (2, 2));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    holder.forget(second);
    let third = got(&holder, &calls).await.expect("made a third time");
    assert_eq!(third, (3, 3));
}

#[tokio::test(start_paused = true)]
async fn a_renewal_serves_the_old_connection_until_the_new_one_is_made() {
    let timeout = Duration::from_secs(1);
    let holder = Holder::<u32>::new(timeout);
    let calls = Arc::new(AtomicU32::new(0));
    let first = got(&holder, &calls).await.expect("made");
    assert_eq!(first, (1, 1));
    holder.renew(1, maker(&calls, Duration::from_millis(500), false));
    // Under way: callers keep the first connection, and a second renewal does nothing.
    holder.renew(1, maker(&calls, Duration::ZERO, false));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let now = got(&holder, &calls).await;
    assert_eq!(now.expect("held"), (1, 1));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let now = got(&holder, &calls).await;
    assert_eq!(now.expect("renewed"), (2, 2));
    assert_eq!(calls.load(Ordering::SeqCst), 2, "one renewal");
    // Spaced from the end of the last one, and never for an old generation.
    holder.renew(2, maker(&calls, Duration::ZERO, false));
    holder.renew(1, maker(&calls, Duration::ZERO, false));
    tokio::time::sleep(timeout).await;
    holder.renew(1, maker(&calls, Duration::ZERO, false));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "none for an old generation"
    );
    // A failed renewal leaves the connection in place.
    holder.renew(2, maker(&calls, Duration::ZERO, true));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let now = got(&holder, &calls).await;
    assert_eq!(now.expect("kept"), (2, 2));
}

#[tokio::test(start_paused = true)]
async fn a_renewal_never_replaces_a_newer_connection_and_fills_a_forgotten_one() {
    let holder = Holder::<u32>::new(Duration::from_secs(1)).renewals_spaced(Duration::ZERO);
    let calls = Arc::new(AtomicU32::new(0));
    let made = got(&holder, &calls).await;
    assert_eq!(made.expect("made"), (1, 1));
    // Forgotten while renewing, and made again by a call: the renewal is dropped.
    holder.renew(1, maker(&calls, Duration::from_millis(500), false));
    holder.forget(1);
    let again = got(&holder, &calls).await;
    assert_eq!(again.expect("made again"), (2, 3));
    tokio::time::sleep(Duration::from_millis(600)).await;
    let now = got(&holder, &calls).await;
    assert_eq!(
        now.expect("kept"),
        (2, 3),
        "not replaced by the late renewal"
    );
    // Forgotten while renewing, and no call since: the renewal takes its place.
    holder.renew(2, maker(&calls, Duration::from_millis(500), false));
    holder.forget(2);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let now = got(&holder, &calls).await;
    assert_eq!(now.expect("renewed"), (3, 4));
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}
