//! Hot resources against real redis-server processes: waiters in one `Redlock` are served in
//! FIFO order, a release wakes a waiter in another `Redlock` (another process, as far as the
//! nodes can tell) through its release message, a dropped subscription falls back to
//! polling, cancelled waiters leave nothing behind, and no two holders ever overlap.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use redfence::{Backoff, Redlock};
use support::{Servers, TestRedlock, eventually};

const TTL: Duration = Duration::from_secs(10);

/// A `Redlock` that polls rarely: a waiter woken much sooner than `delay` was woken by a
/// release, not by its schedule.
fn slow_polling(servers: &Servers, delay: Duration, retries: u32) -> Redlock {
    servers
        .builder()
        .backoff(Backoff::fixed(delay, Duration::ZERO).retries(retries))
        .build()
        .expect("config")
}

/// Subscribers to `key`'s release channel on every node.
fn subscribers(servers: &Servers, key: &str) -> Vec<i64> {
    (0..servers.len())
        .map(|n| servers.release_subscribers(n, key))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_in_one_process_are_served_in_arrival_order() {
    let servers = Servers::start(3);
    let redlock = slow_polling(&servers, Duration::from_millis(500), 20);
    support::warm_up(&redlock).await;
    let first = redlock.acquire(&["fifo"], TTL).await.expect("first");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..8 {
        let (redlock, order) = (redlock.clone(), Arc::clone(&order));
        waiters.push(tokio::spawn(async move {
            let lock = redlock
                .acquire(&["fifo"], TTL)
                .await
                .expect("every waiter gets the lock");
            order.lock().expect("order").push(i);
            tokio::time::sleep(Duration::from_millis(5)).await;
            lock.release().await.expect("release");
        }));
        // Far longer than a task needs to join the line: waiter i is in line before i + 1.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let released = Instant::now();
    first.release().await.expect("release");
    for waiter in waiters {
        waiter.await.expect("waiter");
    }
    assert_eq!(*order.lock().expect("order"), (0..8).collect::<Vec<_>>());
    // Each hand-off inside the process is a local wake-up, not a 500 ms poll.
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "8 hand-offs took {:?}",
        released.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_in_another_process_wakes_the_waiter_long_before_its_retry_delay() {
    let servers = Servers::start(3);
    let holder = servers.redlock();
    let delay = Duration::from_secs(3);
    let waiter = slow_polling(&servers, delay, 5);
    support::warm_up(&holder).await;
    support::warm_up(&waiter).await;
    let lock = holder.acquire(&["notified"], TTL).await.expect("holder");
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            let lock = waiter.acquire(&["notified"], TTL).await.expect("waiter");
            (Instant::now(), lock)
        }
    });
    // The waiter failed its first attempt and subscribed on every node.
    assert!(
        eventually(|| subscribers(&servers, "notified").iter().all(|&n| n == 1)).await,
        "subscribers: {:?}",
        subscribers(&servers, "notified")
    );
    let released = Instant::now();
    lock.release().await.expect("release");
    let (acquired, lock) = waiting.await.expect("waiter task");
    let latency = acquired.duration_since(released);
    assert!(
        latency < delay / 6,
        "the waiter took {latency:?} after the release (its retry delay is {delay:?})"
    );
    lock.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_subscription_falls_back_to_polling_and_then_resubscribes() {
    let servers = Servers::start(3);
    let holder = servers.redlock();
    let waiter = slow_polling(&servers, Duration::from_millis(400), 50);
    support::warm_up(&holder).await;
    support::warm_up(&waiter).await;
    let lock = holder.acquire(&["dropped"], TTL).await.expect("holder");
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire(&["dropped"], TTL).await }
    });
    assert!(eventually(|| subscribers(&servers, "dropped").iter().all(|&n| n == 1)).await);
    // Cut every subscriber connection, then release at once: the message is lost.
    for n in 0..servers.len() {
        let _: i64 = servers.cmd(n, &["CLIENT", "KILL", "TYPE", "pubsub"]);
    }
    lock.release().await.expect("release");
    // The waiter still gets the lock, on its schedule.
    let lock = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter polled its way to the lock")
        .expect("waiter task")
        .expect("acquired");
    lock.release().await.expect("release");
    // And the subscriber came back: a later waiter is woken by messages again.
    let lock = holder
        .acquire(&["dropped"], TTL)
        .await
        .expect("holder again");
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire(&["dropped"], TTL).await }
    });
    assert!(
        eventually(|| subscribers(&servers, "dropped").iter().all(|&n| n == 1)).await,
        "resubscribed: {:?}",
        subscribers(&servers, "dropped")
    );
    lock.release().await.expect("release");
    let lock = waiting.await.expect("waiter task").expect("acquired");
    lock.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_cancelled_in_line_leave_no_trace() {
    let servers = Servers::start(3);
    let holder = servers.redlock();
    let waiters = slow_polling(&servers, Duration::from_millis(300), 50);
    support::warm_up(&holder).await;
    support::warm_up(&waiters).await;
    let lock = holder.acquire(&["cancelled"], TTL).await.expect("holder");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (waiters, order) = (waiters.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let lock = waiters.acquire(&["cancelled"], TTL).await.expect("waiter");
            order.lock().expect("order").push(i);
            lock.release().await.expect("release");
        }));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(eventually(|| subscribers(&servers, "cancelled").iter().all(|&n| n == 1)).await);
    // Cancel the head of the line and two in the middle.
    for i in [0, 2, 3] {
        tasks[i].abort();
    }
    lock.release().await.expect("release");
    for (i, task) in tasks.into_iter().enumerate() {
        match task.await {
            Ok(()) => assert!(![0, 2, 3].contains(&i), "waiter {i} was cancelled"),
            Err(err) => assert!(err.is_cancelled() && [0, 2, 3].contains(&i)),
        }
    }
    assert_eq!(*order.lock().expect("order"), vec![1, 4, 5]);
    // No key, and (after the idle linger) no subscription is left on any node.
    assert!(eventually(|| (0..3).all(|n| servers.keys(n).is_empty())).await);
    assert!(
        eventually(|| subscribers(&servers, "cancelled").iter().all(|&n| n == 0)).await,
        "subscribers left: {:?}",
        subscribers(&servers, "cancelled")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contending_holders_never_overlap() {
    const PER_TASK: usize = 12;
    let servers = Servers::start(3);
    // Two managers, as two processes: local lines in each, messages between them.
    let managers = [
        slow_polling(&servers, Duration::from_millis(200), 100),
        slow_polling(&servers, Duration::from_millis(200), 100),
    ];
    for manager in &managers {
        support::warm_up(manager).await;
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let acquisitions = Arc::new(Mutex::new(vec![0usize; 8]));
    let tasks = (0..8).map(|task| {
        let redlock = managers[task % 2].clone();
        let (inside, overlaps, acquisitions) = (
            Arc::clone(&inside),
            Arc::clone(&overlaps),
            Arc::clone(&acquisitions),
        );
        tokio::spawn(async move {
            for _ in 0..PER_TASK {
                let lock = redlock.acquire(&["exclusive"], TTL).await.expect("acquire");
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                lock.release().await.expect("release");
                acquisitions.lock().expect("count")[task] += 1;
            }
        })
    });
    for task in join_all(tasks).await {
        task.expect("task");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders overlapped");
    assert!(
        acquisitions
            .lock()
            .expect("count")
            .iter()
            .all(|&n| n == PER_TASK)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mode_serves_waiters_of_several_processes_in_arrival_order() {
    let servers = Servers::start(3);
    // Four managers, as four processes; they poll rarely, so order comes from the queue.
    let managers: Vec<Redlock> = (0..4)
        .map(|_| servers.fair(Duration::from_millis(400)))
        .collect();
    for manager in &managers {
        support::warm_up(manager).await;
    }
    // Held outside fair mode: not in the nodes' line, which then holds the waiters alone.
    let first = servers
        .builder()
        .build()
        .expect("config")
        .acquire(&["fair"], TTL)
        .await
        .expect("first");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..8 {
        let (redlock, order) = (managers[(i + 1) % 4].clone(), Arc::clone(&order));
        waiters.push(tokio::spawn(async move {
            let lock = redlock
                .acquire(&["fair"], TTL)
                .await
                .expect("every waiter gets the lock");
            order.lock().expect("order").push(i);
            tokio::time::sleep(Duration::from_millis(5)).await;
            lock.release().await.expect("release");
        }));
        // Waiter i has its place on every node before waiter i + 1 starts. (Within a
        // process, only the head of its own line stands in the nodes' line: four at most.)
        let places = (i as i64 + 1).min(4);
        let in_line =
            || (0..3).all(|n| servers.cmd::<i64>(n, &["ZCARD", "fair:redfence:queue"]) == places);
        assert!(
            eventually(in_line).await,
            "waiter {i} did not take its place"
        );
    }
    first.release().await.expect("release");
    for waiter in waiters {
        waiter.await.expect("waiter");
    }
    assert_eq!(*order.lock().expect("order"), (0..8).collect::<Vec<_>>());
    // Every place was left: no queue is left on any node.
    assert!(
        eventually(|| (0..3).all(|n| servers.keys(n).is_empty())).await,
        "keys left: {:?}",
        (0..3).map(|n| servers.keys(n)).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_queue_never_grants_past_a_waiter_ahead_until_its_lease_ends() {
    let servers = Servers::start(3);
    let redlock = servers.fair(Duration::from_millis(50));
    support::warm_up(&redlock).await;
    // A waiter that took its place and crashed: ahead of everyone, lease 1.5 s.
    let lease_end: i64 = {
        let (secs, micros): (String, String) = servers.cmd(0, &["TIME"]);
        secs.parse::<i64>().expect("secs") * 1000 + micros.parse::<i64>().expect("µs") / 1000 + 1500
    };
    for n in 0..3 {
        let _: i64 = servers.cmd(n, &["ZADD", "ghost:redfence:queue", "1", "crashed-waiter"]);
        let _: i64 = servers.cmd(
            n,
            &[
                "ZADD",
                "ghost:redfence:alive",
                &lease_end.to_string(),
                "crashed-waiter",
            ],
        );
    }
    // The lock is free, but it is not this waiter's turn.
    let refused = redlock.try_acquire(&["ghost"], TTL).await;
    assert!(
        matches!(refused, Err(redfence::Error::Contended { .. })),
        "granted past a waiter ahead: {refused:?}"
    );
    assert!(servers.on_every_node("ghost", Option::is_none));
    // Once the crashed waiter's lease has ended, it is dropped and the lock is granted.
    let lock = redlock
        .acquire(&["ghost"], TTL)
        .await
        .expect("granted after the lease");
    let (secs, micros): (String, String) = servers.cmd(0, &["TIME"]);
    let now = secs.parse::<i64>().expect("secs") * 1000 + micros.parse::<i64>().expect("µs") / 1000;
    assert!(
        now >= lease_end,
        "granted {} ms before the lease ended",
        lease_end - now
    );
    lock.release().await.expect("release");
    assert!(eventually(|| (0..3).all(|n| servers.keys(n).is_empty())).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_holders_across_processes_never_overlap_and_all_get_their_share() {
    const PER_TASK: usize = 10;
    let servers = Servers::start(3);
    let managers: Vec<Redlock> = (0..2)
        .map(|_| servers.fair(Duration::from_millis(200)))
        .collect();
    for manager in &managers {
        support::warm_up(manager).await;
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let tasks = (0..8).map(|task| {
        let redlock = managers[task % 2].clone();
        let (inside, overlaps) = (Arc::clone(&inside), Arc::clone(&overlaps));
        tokio::spawn(async move {
            for _ in 0..PER_TASK {
                let lock = redlock
                    .acquire(&["fair-exclusive"], TTL)
                    .await
                    .expect("acquire");
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                lock.release().await.expect("release");
            }
        })
    });
    for task in join_all(tasks).await {
        task.expect("every task got the lock PER_TASK times");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders overlapped");
    assert!(eventually(|| (0..3).all(|n| servers.keys(n).is_empty())).await);
}
