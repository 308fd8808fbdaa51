//! The semaphore torture run: 16 workers share K = 3 permits through `Semaphore::using` on
//! five nodes, while one random node at a time is paused, or killed and restarted empty after
//! the TTL has passed (so that it forgets only expired keys). Each worker records the window
//! in which its permit was valid (from the routine's start to its end, kept only if the signal
//! had not aborted by then); the check is that no instant lies in more than K windows.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use redfence::{Error, Redlock};

use super::support::cluster::{Cluster, LocalCluster};

const PERMITS: u32 = 3;
const WORKERS: usize = 16;
const TTL: Duration = Duration::from_millis(1_000);
const THRESHOLD: Duration = Duration::from_millis(400);

#[derive(Default)]
struct Record {
    windows: Mutex<Vec<(Instant, Instant)>>,
    aborted: AtomicU64,
    failed: AtomicU64,
    stop: AtomicBool,
}

async fn worker(redlock: Redlock, record: Arc<Record>) {
    let Ok(sem) = redlock.semaphore("torture:jobs", PERMITS) else {
        panic!("a valid semaphore");
    };
    while !record.stop.load(Ordering::SeqCst) {
        let work = Duration::from_millis(rand::rng().random_range(5..120));
        let outcome = sem
            .using(TTL, |signal| {
                let record = Arc::clone(&record);
                async move {
                    let start = Instant::now();
                    tokio::time::sleep(work).await;
                    let end = Instant::now();
                    if signal.is_aborted() {
                        record.aborted.fetch_add(1, Ordering::SeqCst);
                    } else if let Ok(mut windows) = record.windows.lock() {
                        windows.push((start, end));
                    }
                    Ok::<_, Error>(())
                }
            })
            .await;
        if outcome.is_err() {
            record.failed.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The most windows that share one instant.
fn most_at_once(windows: &[(Instant, Instant)]) -> i32 {
    let mut events: Vec<(Instant, i32)> = windows
        .iter()
        .flat_map(|&(start, end)| [(start, 1), (end, -1)])
        .collect();
    events.sort_by_key(|&(at, delta)| (at, delta));
    let (mut open, mut most) = (0, 0);
    for (_, delta) in events {
        open += delta;
        most = most.max(open);
    }
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torture_local_semaphore() {
    let _turn = super::ONE_AT_A_TIME.lock().await;
    let mut cluster = LocalCluster::start(5).await;
    let redlock = Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(100))
        .automatic_extension_threshold(THRESHOLD)
        .retry_count(50)
        .retry_delay(Duration::from_millis(20))
        .retry_jitter(Duration::from_millis(20))
        .build()
        .expect("config");
    let record = Arc::new(Record::default());
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| tokio::spawn(worker(redlock.clone(), Arc::clone(&record))))
        .collect();
    let until = Instant::now() + super::run_time().min(Duration::from_secs(20));
    let mut faults = 0;
    while Instant::now() < until {
        let (node, pause, hold) = {
            let mut rng = rand::rng();
            (
                rng.random_range(0..cluster.len()),
                rng.random_bool(0.5),
                Duration::from_millis(rng.random_range(200..1_500)),
            )
        };
        if pause {
            cluster.pause(node);
            tokio::time::sleep(hold).await;
            cluster.resume(node);
        } else {
            // Down for longer than any lease: it comes back empty having lost only expired keys.
            cluster.kill(node);
            tokio::time::sleep(TTL + hold).await;
            cluster.restart(node);
        }
        faults += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    record.stop.store(true, Ordering::SeqCst);
    for w in workers {
        tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("a worker ends in time")
            .expect("worker");
    }
    let windows = record.windows.lock().expect("windows").clone();
    let most = most_at_once(&windows);
    println!(
        "torture [semaphore] K={PERMITS}, {WORKERS} workers: {} permits used, {} aborted, {} not acquired, {faults} faults; most at once {most}",
        windows.len(),
        record.aborted.load(Ordering::SeqCst),
        record.failed.load(Ordering::SeqCst),
    );
    assert!(
        most <= PERMITS as i32,
        "{most} permits valid at one instant"
    );
    assert!(windows.len() > 50, "too little work to judge");
    assert!(most >= 2, "permits never ran side by side");
    redlock.close().await;
}
