//! The semaphore torture run: 16 workers (half in fair mode, waiting in the semaphore's line) share
//! K = 3 permits through `Semaphore::using` on five nodes, under the main run's fault schedule
//! (kills, pauses, cuts, restarts without persistence on one node or a majority in sequence, clock
//! faults where clocks can be faked). Each worker records the window in which its permit was valid
//! (from the routine's start to its end, kept only if the signal had not aborted by then); the
//! check is that no instant lies in more than K windows, except inside a fault window the main run
//! excuses too (never after a restart: the workers' restart quarantine must prevent it).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use redfence::{Error, Redlock};

use super::history::{FencedStore, check_store, write_under};

const NAME: &str = "semaphore";
const PERMITS: u32 = 3;
const WORKERS: usize = 16;
const TTL: Duration = Duration::from_millis(1_000);

#[derive(Default)]
struct Record {
    windows: Mutex<Vec<(Instant, Instant)>>,
    /// What the holders wrote, by slot, with the slot's fences (as they start and end).
    store: FencedStore,
    next_write: AtomicU64,
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
                    let slot = slot_of(&signal);
                    let acquisition = record.next_write.fetch_add(1, Ordering::SeqCst);
                    write_under(&record.store, slot, &signal, acquisition, start);
                    tokio::time::sleep(work).await;
                    write_under(&record.store, slot, &signal, acquisition, start);
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

/// The slot a permit's signal holds: the number that ends its one resource.
fn slot_of(signal: &redfence::Signal) -> usize {
    signal
        .resources()
        .first()
        .and_then(|r| r.rsplit(':').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a slot resource: {:?}", signal.resources()))
}

/// The instants where more than K windows meet, as (from, to) spans: each starts where a
/// window opens beyond K and ends with the first of the open windows to close.
fn excesses(windows: &[(Instant, Instant)]) -> Vec<(Instant, Instant)> {
    let mut sorted = windows.to_vec();
    sorted.sort_by_key(|w| w.0);
    let mut open: Vec<Instant> = Vec::new();
    let mut found = Vec::new();
    for (start, end) in sorted {
        // Half-open windows: one that ends at this start has closed.
        open.retain(|&e| e > start);
        open.push(end);
        if open.len() > PERMITS as usize {
            let first_end = open.iter().copied().min().unwrap_or(end);
            found.push((start, first_end));
        }
    }
    found
}

#[test]
fn the_check_finds_more_than_k_at_once() {
    let t = Instant::now();
    let ms = |n| t + Duration::from_millis(n);
    let k: Vec<_> = (0..u64::from(PERMITS)).map(|i| (ms(i), ms(100))).collect();
    assert!(excesses(&k).is_empty());
    let mut more = k.clone();
    more.push((ms(50), ms(60)));
    assert_eq!(excesses(&more), [(ms(50), ms(60))]);
    more.push((ms(100), ms(110)));
    assert_eq!(
        excesses(&more).len(),
        1,
        "a window that starts as others end is not beside them"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torture_local_semaphore() {
    let _turn = super::ONE_AT_A_TIME.lock().await;
    let (mut cluster, clocks) = super::local_servers(NAME).await;
    // Half the workers wait in the semaphore's line (fair mode), half go round at will.
    let counter = super::memory_counter();
    let redlocks = [
        super::side_redlock(&cluster, false, &counter),
        super::side_redlock(&cluster, true, &counter),
    ];
    let record = Arc::new(Record::default());
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| tokio::spawn(worker(redlocks[i % 2].clone(), Arc::clone(&record))))
        .collect();
    let faults = super::side_faults(&mut cluster, clocks.as_ref(), &record.stop, workers).await;
    let windows = record.windows.lock().expect("windows").clone();
    let (excused, violations): (Vec<_>, Vec<_>) = excesses(&windows)
        .into_iter()
        .partition(|&(from, to)| faults.excuses_overlap(from, to));
    let counts = faults.counts.lock().expect("faults").clone();
    let (fenced, tally) = check_store(&record.store, &faults);
    let most = super::support::most_at_once(windows.iter().copied());
    println!(
        "fenced writes by slot: accepted {}, rejected {} (stale {}); fencing violations {} {fenced:?}",
        tally.accepted,
        tally.rejected,
        tally.stale_rejected,
        fenced.total(),
    );
    assert_eq!(fenced.total(), 0, "fenced writes: {fenced:?}");
    println!(
        "torture [{NAME}] K={PERMITS}, {WORKERS} workers: {} permits used, {} aborted, {} not acquired; \
         faults {counts:?}; most at once {}, more than K during faults {}; violations {}",
        windows.len(),
        record.aborted.load(Ordering::SeqCst),
        record.failed.load(Ordering::SeqCst),
        most,
        excused.len(),
        violations.len(),
    );
    assert!(
        violations.is_empty(),
        "more than {PERMITS} permits valid at once outside faults: {:?}",
        &violations[..violations.len().min(5)]
    );
    assert!(windows.len() > 50, "too little work to judge");
    assert!(most >= 2, "permits never ran side by side");
    for redlock in redlocks {
        redlock.close().await;
    }
}
