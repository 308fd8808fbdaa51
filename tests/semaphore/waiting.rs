//! Waiting for a permit: a release frees a slot for a waiter, waiters are woken by a release
//! (not polling) and served in order, and `acquire` gives up at the acquire timeout.

use std::time::{Duration, Instant};

use redfence::Error;

use crate::support::{PATIENT, Servers, TestRedlock, eventually};
use crate::{TTL, gave_up_between, served};

#[tokio::test]
async fn a_release_frees_a_slot_for_a_waiter() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .node_timeout(PATIENT)
        .retry_count(10_000)
        .build()
        .expect("config");
    let sem = redlock.semaphore("pool", 2).expect("semaphore");
    let a = sem.acquire(TTL).await.expect("a");
    let b = sem.acquire(TTL).await.expect("b");
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire(TTL).await }
    });
    // Still waiting after several retry rounds.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter got a permit while two were held"
    );
    let freed = b.slot();
    b.release().await.expect("release");
    let permit = served(
        waiter,
        Duration::from_secs(10),
        "the waiter gets the freed slot in time",
    )
    .await;
    assert_eq!(permit.slot(), freed);
    assert_ne!(permit.slot(), a.slot());
    drop(a);
    permit.release().await.expect("release");
}

/// With every permit held, `acquire` gives up at `acquire_timeout` (and `try_acquire` at
/// once), saying the slots were contended.
#[tokio::test]
async fn acquire_gives_up_at_the_acquire_timeout() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .node_timeout(PATIENT)
        .retry_count(10_000)
        .acquire_timeout(Duration::from_millis(1500))
        .build()
        .expect("config");
    let sem = redlock.semaphore("full", 2).expect("semaphore");
    let held = [
        sem.acquire(TTL).await.expect("a"),
        sem.acquire(TTL).await.expect("b"),
    ];
    let started = Instant::now();
    match sem.acquire(TTL).await {
        Err(Error::AcquireTimeout { last, attempts, .. }) => {
            assert!(attempts >= 2, "every slot was tried: {attempts}");
            assert!(
                matches!(last.as_deref(), Some(Error::Contended { .. })),
                "{last:?}"
            );
        }
        other => panic!("expected AcquireTimeout, got {other:?}"),
    }
    gave_up_between(
        started,
        Duration::from_millis(1500),
        Duration::from_secs(10),
    );
    assert!(matches!(
        sem.try_acquire(TTL).await,
        Err(Error::Contended { .. })
    ));
    drop(held);
}

/// Waiting for a permit is not polling: with a 30 s retry delay, a waiter gets the slot
/// another client released (announced by the nodes) and then the one a permit of its own
/// process released (woken in process) within seconds, and two waiters of one process are
/// served in the order they came.
#[tokio::test]
async fn waiters_are_woken_by_a_release_and_served_in_order() {
    let servers = Servers::start(3);
    let (ours, theirs) = (servers.slow_retries(), servers.slow_retries());
    let sem = ours.semaphore("woken", 1).expect("semaphore");
    let other = theirs.semaphore("woken", 1).expect("semaphore");
    let held = other.acquire(TTL).await.expect("the other client's permit");
    let slot = sem.slots()[0].clone();
    let before: Vec<i64> = (0..3)
        .map(|i| servers.release_subscribers(i, &slot))
        .collect();
    let first = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire(TTL).await }
    });
    // The first waiter went round once and waits (its try marked the slot).
    assert!(
        eventually(|| {
            let mark = format!("{slot}:redfence:waiting");
            servers.keys(0).contains(&mark)
        })
        .await,
        "the first waiter tried the slot"
    );
    // It listens on every node before the release (a message sent earlier is missed, and the
    // waiter would poll: here after its 30 s retry delay).
    assert!(
        eventually(|| (0..3).all(|i| servers.release_subscribers(i, &slot) > before[i])).await,
        "the first waiter subscribed"
    );
    let second = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire(TTL).await }
    });
    // (The second waits in the process's line behind the first, which keeps its turn.)
    held.release().await.expect("release");
    let permit = served(
        first,
        Duration::from_secs(10),
        "the first waiter is woken, not left to its 30 s retry delay",
    )
    .await;
    assert!(!second.is_finished(), "one permit, one holder");
    permit.release().await.expect("release");
    let permit = served(
        second,
        Duration::from_secs(10),
        "the second waiter is woken by its process's release",
    )
    .await;
    permit.release().await.expect("release");
}
