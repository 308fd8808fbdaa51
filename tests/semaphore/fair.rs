//! Fair mode: the waiters take turns through the semaphore's line. A waiter gives up at the
//! acquire timeout and leaves the line, waiters of several processes are served in arrival
//! order, and a `try_acquire` does not pass a waiter in line.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redfence::{Error, Redlock};

use crate::support::{self, PATIENT, Servers, TestRedlock, eventually};
use crate::{TTL, gave_up_between, served};

/// Permits held for a whole test.
const LONG: Duration = Duration::from_secs(60);

/// In fair mode a waiter behind the line's holder gives up at the acquire timeout (on the
/// line's name), and leaves its place in the line's queue on every node.
#[tokio::test]
async fn a_fair_waiter_gives_up_at_the_acquire_timeout_and_leaves_the_line() {
    let servers = Servers::start(3);
    let fair = |timeout| {
        servers
            .builder()
            .fair(true)
            .node_timeout(PATIENT)
            .retry_count(10_000)
            .acquire_timeout(timeout)
            .build()
            .expect("config")
    };
    let (first, second) = (fair(LONG), fair(Duration::from_millis(1500)));
    let held = first
        .semaphore("line-timeout", 1)
        .expect("semaphore")
        .acquire(TTL)
        .await
        .expect("the permit");
    // A waiter of the first client takes the line and goes round the full slot.
    let going_round = tokio::spawn({
        let sem = first.semaphore("line-timeout", 1).expect("semaphore");
        async move { sem.acquire(TTL).await }
    });
    assert!(
        eventually(|| servers.on_every_node("line-timeout:semaphore:line", Option::is_some)).await,
        "the first waiter holds the line"
    );
    let queue = "line-timeout:semaphore:line:redfence:queue";
    let before: Vec<i64> = (0..3).map(|n| servers.cmd(n, &["ZCARD", queue])).collect();
    let started = Instant::now();
    let sem = second.semaphore("line-timeout", 1).expect("semaphore");
    match sem.acquire(TTL).await {
        Err(Error::AcquireTimeout { last, .. }) => match last.as_deref() {
            Some(Error::Contended { resources, .. }) => {
                assert_eq!(*resources, ["line-timeout:semaphore:line"]);
            }
            other => panic!("the line held it up, not {other:?}"),
        },
        other => panic!("expected AcquireTimeout, got {other:?}"),
    }
    // The line's waiter gives up when its next retry delay (10-20 ms here) would end past the
    // timeout, so up to one delay early.
    gave_up_between(
        started,
        Duration::from_millis(1400),
        Duration::from_secs(10),
    );
    // Its place is left on every node: no more places than before it came.
    assert!(
        eventually(|| (0..3).all(|n| servers.cmd::<i64>(n, &["ZCARD", queue]) <= before[n])).await,
        "the waiter left a place in the line's queue"
    );
    held.release().await.expect("release");
    let permit = served(
        going_round,
        Duration::from_secs(30),
        "the first waiter is served",
    )
    .await;
    permit.release().await.expect("release");
}

/// Fair mode across processes: eight waiters, each with its own client (as eight processes)
/// and starting once the one before has its place in the semaphore's line on every node, get
/// their permits in that order. They poll rarely (every 400 ms), so the order comes from the
/// line: its holder goes round the slots, the others wait their turn in the nodes' queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mode_serves_waiters_of_several_processes_in_arrival_order() {
    fn micros_since_epoch() -> u128 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_micros()
    }
    let servers = Servers::start(3);
    let clients: Vec<Redlock> = (0..8)
        .map(|_| servers.fair(Duration::from_millis(400)))
        .collect();
    for client in &clients {
        support::warm_up(client).await;
    }
    // Both permits held by a client outside fair mode: one for the whole test, one released
    // when every waiter is in line.
    let other = servers.patient().semaphore("fair", 2).expect("semaphore");
    let kept = other.acquire(LONG).await.expect("first permit");
    let first = other.acquire(LONG).await.expect("second permit");
    let queue = "fair:semaphore:line:redfence:queue";
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    // Queue places are scored by the waiter's wall clock when it started waiting (µs); the
    // line's holder may drop out of the queue once its place's lease ends, so count only the
    // places taken after waiter 0 held the line.
    let mut since = String::new();
    for (i, client) in clients.iter().enumerate() {
        let sem = client.semaphore("fair", 2).expect("semaphore");
        let order = Arc::clone(&order);
        waiters.push(tokio::spawn(async move {
            let permit = sem.acquire(TTL).await.expect("every waiter gets a permit");
            order.lock().expect("order").push(i);
            tokio::time::sleep(Duration::from_millis(5)).await;
            permit.release().await.expect("release");
        }));
        if i == 0 {
            // Waiter 0 takes the line and goes round the full slots.
            assert!(
                eventually(|| servers.on_every_node("fair:semaphore:line", Option::is_some)).await,
                "waiter 0 holds the line"
            );
            since = format!("{}", micros_since_epoch());
            continue;
        }
        // Waiter i has its place on every node before waiter i + 1 starts. Its place is
        // taken when it first asks for the line, after a round trip to claim the size, so
        // waiters started together could take theirs in any order.
        let in_line = || {
            (0..3).all(|n| servers.cmd::<i64>(n, &["ZCOUNT", queue, &since, "+inf"]) == i as i64)
        };
        assert!(
            eventually(in_line).await,
            "waiter {i} did not take its place"
        );
    }
    first.release().await.expect("release");
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(60), waiter)
            .await
            .expect("the waiters are served in time")
            .expect("waiter");
    }
    assert_eq!(*order.lock().expect("order"), (0..8).collect::<Vec<_>>());
    kept.release().await.expect("release");
    // The line was left (its queue too) and every slot released: only the size key is left
    // on each node, and waiting marks, which expire on their own (a line granted by a
    // majority while a straggler refused it leaves the straggler's mark).
    let left = |n| {
        let mut keys = servers.keys(n);
        keys.retain(|key| !key.ends_with(":redfence:waiting"));
        keys
    };
    assert!(
        eventually(|| (0..3).all(|n| left(n) == ["fair:semaphore:size"])).await,
        "keys left: {:?}",
        (0..3).map(left).collect::<Vec<_>>()
    );
}

/// In fair mode a `try_acquire` respects the line: with a waiter in line (here going round
/// the full slots), it is refused on the line's name, although a try of the slots alone
/// would have found none free either way; once nobody waits, it gets a free slot at once.
#[tokio::test]
async fn a_fair_try_acquire_does_not_pass_a_waiter_in_line() {
    let servers = Servers::start(3);
    let client = servers.fair(Duration::from_millis(50));
    let sem = client.semaphore("queued", 1).expect("semaphore");
    let held = sem.acquire(TTL).await.expect("the permit");
    // That acquisition gave its line up in the background: gone everywhere before the waiter
    // comes, so that the line seen next is the waiter's.
    assert!(
        eventually(|| servers.on_every_node("queued:semaphore:line", Option::is_none)).await,
        "the line was given up with the permit"
    );
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire(TTL).await }
    });
    assert!(
        eventually(|| servers.on_every_node("queued:semaphore:line", Option::is_some)).await,
        "the waiter holds the line"
    );
    match sem.try_acquire(TTL).await {
        Err(Error::Contended { resources, .. }) => {
            assert_eq!(resources, ["queued:semaphore:line"]);
        }
        other => panic!("a try passed the waiter in line: {other:?}"),
    }
    held.release().await.expect("release");
    let permit = served(waiter, Duration::from_secs(30), "the waiter is served").await;
    assert_eq!(permit.slot(), 0);
    permit.release().await.expect("release");
    // Nobody waits: a try gets the free slot.
    let permit = sem.try_acquire(TTL).await.expect("a free slot");
    permit.release().await.expect("release");
}
