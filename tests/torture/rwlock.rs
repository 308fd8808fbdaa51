//! The read-write lock torture run: 16 workers share one lock through `RwLock::using_read` and
//! `using_write` (one hold in four a write) on five nodes, under the main run's fault schedule
//! (kills, pauses, cuts, restarts without persistence on one node or a majority in sequence,
//! clock faults where clocks can be faked). Each worker records the window in which its hold
//! was valid (from the routine's start to its end, kept only if the signal had not aborted by
//! then); the check is that no writer's window meets another window, a reader's or a
//! writer's, except inside a fault window the main run excuses too (never after a restart).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use redfence::{Error, Redlock, Signal};

use super::history::{FencedStore, check_store, write_under};

const WORKERS: usize = 16;
const TTL: Duration = Duration::from_millis(1_000);
const NAME: &str = "rwlock";

/// A valid hold: its window, and whether it was the write.
type Window = (Instant, Instant, bool);

#[derive(Default)]
struct Record {
    windows: Mutex<Vec<Window>>,
    /// What the writers wrote, with their fences (twice each: as they start and end).
    store: FencedStore,
    next_write: AtomicU64,
    aborted: AtomicU64,
    failed: AtomicU64,
    stop: AtomicBool,
}

/// The routine of one hold: works a while, then records its window unless the signal aborted.
async fn hold(
    record: Arc<Record>,
    signal: Signal,
    work: Duration,
    write: bool,
) -> Result<(), Error> {
    let start = Instant::now();
    let writer = write.then(|| record.next_write.fetch_add(1, Ordering::SeqCst));
    if let Some(acquisition) = writer {
        write_under(&record.store, 0, &signal, acquisition, start);
    }
    tokio::time::sleep(work).await;
    if let Some(acquisition) = writer {
        write_under(&record.store, 0, &signal, acquisition, start);
    }
    let end = Instant::now();
    if signal.is_aborted() {
        record.aborted.fetch_add(1, Ordering::SeqCst);
    } else if let Ok(mut windows) = record.windows.lock() {
        windows.push((start, end, write));
    }
    Ok(())
}

async fn worker(redlock: Redlock, record: Arc<Record>) {
    let Ok(lock) = redlock.rwlock("torture:config") else {
        panic!("a valid rwlock");
    };
    while !record.stop.load(Ordering::SeqCst) {
        let (work, write) = {
            let mut rng = rand::rng();
            (
                Duration::from_millis(rng.random_range(5..120)),
                rng.random_range(0..4) == 0,
            )
        };
        let record2 = Arc::clone(&record);
        let outcome = if write {
            lock.using_write(TTL, |signal| hold(record2, signal, work, true))
                .await
        } else {
            lock.using_read(TTL, |signal| hold(record2, signal, work, false))
                .await
        };
        if outcome.is_err() {
            record.failed.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Pairs of windows where a writer met another holder (half-open windows).
fn violations(windows: &[Window]) -> Vec<(Window, Window)> {
    let mut sorted = windows.to_vec();
    sorted.sort_by_key(|w| w.0);
    let mut found = Vec::new();
    for (i, a) in sorted.iter().enumerate() {
        for b in &sorted[i + 1..] {
            if b.0 >= a.1 {
                break;
            }
            if a.2 || b.2 {
                found.push((*a, *b));
            }
        }
    }
    found
}

#[test]
fn the_check_finds_a_writer_beside_a_reader() {
    let t = Instant::now();
    let ms = |n| t + Duration::from_millis(n);
    let readers = [(ms(0), ms(10), false), (ms(5), ms(15), false)];
    assert!(violations(&readers).is_empty());
    let touching = [(ms(0), ms(10), true), (ms(10), ms(20), false)];
    assert!(violations(&touching).is_empty());
    let beside = [
        (ms(0), ms(10), false),
        (ms(30), ms(40), false),
        (ms(8), ms(12), true),
    ];
    assert_eq!(violations(&beside).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torture_local_rwlock() {
    let _turn = super::ONE_AT_A_TIME.lock().await;
    let (mut cluster, clocks) = super::local_servers(NAME).await;
    let redlock = super::side_redlock(&cluster, false, &super::memory_counter());
    let record = Arc::new(Record::default());
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| tokio::spawn(worker(redlock.clone(), Arc::clone(&record))))
        .collect();
    let faults = super::side_faults(&mut cluster, clocks.as_ref(), &record.stop, workers).await;
    let windows = record.windows.lock().expect("windows").clone();
    let (excused, found): (Vec<_>, Vec<_>) = violations(&windows)
        .into_iter()
        .partition(|(a, b)| faults.excuses_overlap(a.0.max(b.0), a.1.min(b.1)));
    let writes = windows.iter().filter(|w| w.2).count();
    let most = super::support::most_at_once(
        windows
            .iter()
            .filter(|w| !w.2)
            .map(|&(start, end, _)| (start, end)),
    );
    let (fenced, tally) = check_store(&record.store, &faults);
    let counts = faults.counts.lock().expect("faults").clone();
    println!(
        "torture [{NAME}] {WORKERS} workers: {} holds ({writes} writes, {} reads), {} aborted, {} not acquired; \
         faults {counts:?}; most readers at once {most}; a writer beside a holder during faults {}; violations {}; \
         fenced writes accepted {}, rejected {} (stale {}), fencing violations {} {fenced:?}",
        windows.len(),
        windows.len() - writes,
        record.aborted.load(Ordering::SeqCst),
        record.failed.load(Ordering::SeqCst),
        excused.len(),
        found.len(),
        tally.accepted,
        tally.rejected,
        tally.stale_rejected,
        fenced.total(),
    );
    assert_eq!(fenced.total(), 0, "fenced writes: {fenced:?}");
    assert!(
        found.is_empty(),
        "a writer beside another holder outside faults: {:?}",
        &found[..found.len().min(5)]
    );
    assert!(windows.len() > 50, "too little work to judge");
    assert!(writes > 5, "too few writes to judge");
    assert!(most >= 2, "readers never held side by side");
    redlock.close().await;
}
