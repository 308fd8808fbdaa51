//! A release given up (its call timed out, or its connection was lost) still reaches the node:
//! a node's queue sends it again, after a reconnect if need be, and `Redlock::close` waits for
//! it. No lock key outlives `close()`, whatever the connections went through.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::future::join_all;
use redfence::Redlock;
use support::{Servers, TestRedlock};

/// Long enough that no key expires during a test: a key found after `close()` was left there.
const TTL: Duration = Duration::from_secs(60);

/// The lock keys a node holds (not the waiting marks a refused acquire leaves beside a key).
fn lock_keys(servers: &Servers, i: usize) -> Vec<String> {
    servers
        .keys(i)
        .into_iter()
        .filter(|key| !key.ends_with(":redfence:waiting"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_tiny_node_timeout_and_killed_connections_no_lock_key_outlives_close() {
    let servers = Arc::new(Servers::start(3));
    // 200 µs: most calls are given up before the node answers, and their replies come late.
    let redlock = servers
        .builder()
        .node_timeout(Duration::from_micros(200))
        .retry_count(2)
        .build()
        .expect("config");
    let stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(AtomicUsize::new(0));
    // Every node's client connections killed every 20 ms, ours among them.
    let killer = {
        let (servers, stop, kills) = (Arc::clone(&servers), Arc::clone(&stop), Arc::clone(&kills));
        tokio::task::spawn_blocking(move || {
            while !stop.load(Ordering::Relaxed) {
                for i in 0..3 {
                    let _: redis::Value = servers.cmd(i, &["CLIENT", "KILL", "TYPE", "normal"]);
                }
                kills.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let granted = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + Duration::from_secs(2);
    let workers = (0..16).map(|w| {
        let (redlock, granted) = (redlock.clone(), Arc::clone(&granted));
        async move {
            let mut i = 0;
            while Instant::now() < until {
                i += 1;
                if let Ok(lock) = redlock.acquire(&[format!("killed:{w}:{i}")], TTL).await {
                    granted.fetch_add(1, Ordering::Relaxed);
                    let _ = lock.release().await;
                }
            }
        }
    });
    join_all(workers).await;
    stop.store(true, Ordering::Relaxed);
    killer.await.expect("killer");
    assert!(kills.load(Ordering::Relaxed) >= 10, "the faults ran");
    redlock.close().await;
    for i in 0..3 {
        assert_eq!(
            lock_keys(&servers, i),
            Vec::<String>::new(),
            "node {i} holds lock keys after close() ({} locks granted, {} kill rounds)",
            granted.load(Ordering::Relaxed),
            kills.load(Ordering::Relaxed)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_to_a_node_paused_for_twelve_seconds_land_before_close_returns() {
    let servers = Servers::start(3);
    let redlock: Redlock = servers.one_attempt(Duration::from_millis(100));
    support::warm_up(&redlock).await;
    // Long names (3 KB), so that what waits for the paused node is more than a few packets.
    let names: Vec<String> = (0..50)
        .map(|i| format!("paused:{i}:{}", "n".repeat(3_000)))
        .collect();
    let mut locks = Vec::new();
    for name in &names {
        locks.push(redlock.acquire(&[name], TTL).await.expect("acquire"));
    }
    // (A majority answered each acquire; the third node's answer may still be on its way.)
    assert!(
        support::eventually(|| lock_keys(&servers, 0).len() == names.len()).await,
        "node 0 holds every lock"
    );
    servers.pause(0);
    // Each release is answered by the two others, and given up on the paused node.
    for lock in locks {
        lock.release().await.expect("a majority released");
    }
    // More locks meanwhile, granted by the two others and released.
    for i in 0..20 {
        let lock = redlock
            .acquire(&[format!("meanwhile:{i}")], TTL)
            .await
            .expect("a majority grants");
        lock.release().await.expect("release");
    }
    tokio::time::sleep(Duration::from_secs(12)).await;
    servers.resume(0);
    let closing = Instant::now();
    redlock.close().await;
    assert_eq!(
        lock_keys(&servers, 0),
        Vec::<String>::new(),
        "the paused node holds lock keys after close() (which took {:?})",
        closing.elapsed()
    );
    for i in 1..3 {
        assert_eq!(lock_keys(&servers, i), Vec::<String>::new(), "node {i}");
    }
}

/// A release queued on a hung node behind a call in flight, with `close()`'s flush right behind
/// it: the batch that carries both times out, the release is to be sent again, and `close()`
/// waits for it (before, the failed batch answered the flush: `close()` returned while the node
/// was still paused, and the key outlived the process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_waits_for_a_release_that_shared_a_failed_batch_with_its_flush() {
    let servers = Arc::new(Servers::start(3));
    let redlock = servers.one_attempt(Duration::from_millis(300));
    support::warm_up(&redlock).await;
    let lock = redlock.acquire(&["victim"], TTL).await.expect("acquire");
    assert!(support::eventually(|| servers.get(0, "victim").is_some()).await);
    servers.pause(0);
    // A call in flight on node 0 (granted by the two others).
    let blocker = redlock
        .try_acquire(&["blocker"], TTL)
        .await
        .expect("a majority grants");
    // The release is queued on node 0 behind it; nodes 1 and 2 answer it.
    lock.release().await.expect("a majority released");
    let paused_for = Duration::from_secs(3);
    let started = Instant::now();
    let resumer = {
        let servers = Arc::clone(&servers);
        std::thread::spawn(move || {
            std::thread::sleep(paused_for);
            servers.resume(0);
        })
    };
    tokio::time::timeout(Duration::from_secs(30), redlock.close())
        .await
        .expect("close() returns once the node answers");
    let closed_after = started.elapsed();
    resumer.join().expect("resumer");
    assert!(
        closed_after >= paused_for,
        "close() returned after {closed_after:?}, while node 0 was paused"
    );
    assert_eq!(
        servers.get(0, "victim"),
        None,
        "the released key is gone from node 0"
    );
    blocker.release().await.ok();
}
