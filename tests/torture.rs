//! The torture run: K workers × M resources for a bounded time, using `using()` with fencing
//! and writing to a fenced store, while a fault schedule kills, pauses, restarts and cuts off
//! random minority nodes and freezes random workers inside their critical sections for
//! longer than their TTL. A checker then verifies the recorded history.
//!
//! Every worker runs on its own OS thread with its own single-threaded runtime, so a frozen
//! worker is frozen whole — its extension task included — like a process in a GC pause.
//!
//! `TORTURE_SECS` sets the duration of each run (default 45 s).

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use redfence::{Error, FencingCounter, MemoryCounter, Redlock};
use support::cluster::{Cluster, ComposeCluster, LocalCluster};

const WORKERS: usize = 16;
const RESOURCES: usize = 4;
const TTL: Duration = Duration::from_millis(1_000);
const THRESHOLD: Duration = Duration::from_millis(400);
/// The chance that a critical section freezes its worker for longer than the TTL.
const FREEZE_PERCENT: u32 = 4;

fn run_time() -> Duration {
    let secs = std::env::var("TORTURE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(45);
    Duration::from_secs(secs)
}

/// One write offered to the fenced store, in the order the store saw them.
#[derive(Clone, Debug)]
struct Write {
    fence: u64,
    accepted: bool,
    /// The writer had been frozen past its lease right before this write.
    after_freeze: bool,
}

/// A lease as its holder saw it: from the start of its routine until the routine ended or
/// the validity it last knew of ran out, whichever came first.
#[derive(Clone, Debug)]
struct Lease {
    resource: usize,
    start: Instant,
    end: Instant,
}

/// The protected storage: accepts a write only if its fence is greater than the last one it
/// accepted for that resource (what `last_fence < $fence` does in SQL).
#[derive(Default)]
struct FencedStore {
    inner: Mutex<StoreInner>,
}

#[derive(Default)]
struct StoreInner {
    last: HashMap<usize, u64>,
    history: HashMap<usize, Vec<Write>>,
}

impl FencedStore {
    fn write(&self, resource: usize, fence: u64, after_freeze: bool) -> bool {
        let mut inner = self.inner.lock().expect("store");
        let last = inner.last.get(&resource).copied().unwrap_or(0);
        let accepted = fence > last;
        if accepted {
            inner.last.insert(resource, fence);
        }
        inner.history.entry(resource).or_default().push(Write {
            fence,
            accepted,
            after_freeze,
        });
        accepted
    }
}

/// When faults were active; an overlap of leases inside one is the known price of Redlock,
/// outside one it is a bug.
#[derive(Default)]
struct FaultLog {
    windows: Mutex<Vec<(Instant, Instant)>>,
    counts: Mutex<HashMap<&'static str, u32>>,
}

impl FaultLog {
    fn record(&self, kind: &'static str, start: Instant, end: Instant) {
        self.windows.lock().expect("faults").push((start, end));
        *self.counts.lock().expect("faults").entry(kind).or_default() += 1;
    }

    fn active_during(&self, from: Instant, to: Instant) -> bool {
        self.windows
            .lock()
            .expect("faults")
            .iter()
            .any(|&(start, end)| start <= to && from <= end)
    }
}

#[derive(Default)]
struct Figures {
    acquisitions: AtomicU64,
    contended: AtomicU64,
    unavailable: AtomicU64,
    freezes: AtomicU64,
    aborted_signals: AtomicU64,
}

/// What a worker's critical section tells `using()`.
#[derive(Debug)]
enum WorkError {
    Lock(Error),
}

impl From<Error> for WorkError {
    fn from(e: Error) -> Self {
        WorkError::Lock(e)
    }
}

struct Shared {
    store: FencedStore,
    leases: Mutex<Vec<Lease>>,
    figures: Figures,
    stop: AtomicBool,
}

fn worker(urls: Vec<String>, counter: Arc<dyn FencingCounter>, shared: Arc<Shared>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("worker runtime");
    runtime.block_on(async move {
        let redlock = Redlock::builder()
            .nodes(urls)
            .fencing(counter)
            .automatic_extension_threshold(THRESHOLD)
            .retry_count(u32::MAX)
            .retry_delay(Duration::from_millis(20))
            .retry_jitter(Duration::from_millis(20))
            .acquire_timeout(Duration::from_secs(2))
            .build()
            .expect("config");
        let mut rng = rand::rng();
        while !shared.stop.load(Ordering::SeqCst) {
            let resource = rng.random_range(0..RESOURCES);
            let freeze = rng.random_range(0..100) < FREEZE_PERCENT;
            let work = Duration::from_millis(rng.random_range(5..40));
            let freeze_for = TTL * 2 + Duration::from_millis(rng.random_range(0..500));
            let name = format!("torture:{resource}");
            let shared_in = Arc::clone(&shared);
            let result = redlock
                .using(&[name.as_str()], TTL, |signal| async move {
                    let shared = shared_in;
                    let start = Instant::now();
                    let fence = signal.fence().expect("fencing is configured");
                    tokio::time::sleep(work).await;
                    let mut valid_until = Instant::now() + signal.remaining();
                    if freeze {
                        // Stop the world: the extension task is frozen too.
                        shared.figures.freezes.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(freeze_for);
                    } else if let Err(lost) = signal.check() {
                        let end = valid_until.min(Instant::now());
                        shared.leases.lock().expect("leases").push(Lease {
                            resource,
                            start,
                            end,
                        });
                        shared
                            .figures
                            .aborted_signals
                            .fetch_add(1, Ordering::SeqCst);
                        return Err(lost.into());
                    } else {
                        valid_until = Instant::now() + signal.remaining();
                    }
                    // Written without looking at the signal again: the store must catch it.
                    shared.store.write(resource, fence, freeze);
                    let now = Instant::now();
                    let end = if !freeze && !signal.is_aborted() {
                        now
                    } else {
                        valid_until.min(now)
                    };
                    shared.leases.lock().expect("leases").push(Lease {
                        resource,
                        start,
                        end,
                    });
                    if signal.is_aborted() {
                        shared
                            .figures
                            .aborted_signals
                            .fetch_add(1, Ordering::SeqCst);
                    }
                    Ok::<(), WorkError>(())
                })
                .await;
            match result {
                Ok(()) => {
                    shared.figures.acquisitions.fetch_add(1, Ordering::SeqCst);
                }
                Err(WorkError::Lock(Error::Contended { .. } | Error::AcquireTimeout { .. })) => {
                    shared.figures.contended.fetch_add(1, Ordering::SeqCst);
                }
                Err(WorkError::Lock(e)) if e.is_lock_lost() => {
                    shared.figures.acquisitions.fetch_add(1, Ordering::SeqCst);
                }
                Err(WorkError::Lock(_)) => {
                    shared.figures.unavailable.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    });
}

/// Injects faults on random minorities until `until`, then heals everything.
async fn fault_schedule(cluster: &mut dyn Cluster, log: &FaultLog, until: Instant) {
    let mut rng = rand::rng();
    while Instant::now() < until {
        let count = rng.random_range(1..=2);
        let mut nodes: Vec<usize> = (0..cluster.len()).collect();
        for i in (1..nodes.len()).rev() {
            nodes.swap(i, rng.random_range(0..=i));
        }
        let nodes = &nodes[..count];
        let kind = ["kill", "pause", "disconnect", "restart"][rng.random_range(0..4)];
        let hold = Duration::from_millis(rng.random_range(300..2_500));
        let start = Instant::now();
        for &i in nodes {
            match kind {
                "kill" => cluster.kill(i),
                "pause" => cluster.pause(i),
                "disconnect" => cluster.disconnect(i),
                _ => {
                    cluster.kill(i);
                    cluster.restart(i);
                }
            }
        }
        tokio::time::sleep(hold).await;
        for &i in nodes {
            match kind {
                "kill" => cluster.restart(i),
                "pause" => cluster.resume(i),
                "disconnect" => cluster.connect(i),
                _ => {}
            }
        }
        // A node that restarted empty forgot its locks: their owners may be shadowed until
        // the longest lease has run out. Queued commands also land a little after a heal.
        let end = Instant::now() + TTL + Duration::from_millis(500);
        log.record(kind, start, end);
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..1_500))).await;
    }
}

#[derive(Debug, Default)]
struct Violations {
    accepted_not_increasing: u64,
    stale_write_accepted: u64,
    fresh_write_rejected: u64,
    overlapping_leases: u64,
}

impl Violations {
    fn total(&self) -> u64 {
        self.accepted_not_increasing
            + self.stale_write_accepted
            + self.fresh_write_rejected
            + self.overlapping_leases
    }
}

fn check(shared: &Shared, faults: &FaultLog) -> (Violations, u64, u64, u64) {
    let mut v = Violations::default();
    let (mut accepted, mut rejected, mut stale_wakeups_rejected) = (0, 0, 0);
    let inner = shared.store.inner.lock().expect("store");
    for writes in inner.history.values() {
        let mut last_accepted = 0u64;
        for w in writes {
            // (1) accepted fences strictly increase.
            if w.accepted {
                accepted += 1;
                if w.fence <= last_accepted {
                    v.accepted_not_increasing += 1;
                }
                last_accepted = last_accepted.max(w.fence);
            } else {
                rejected += 1;
                if w.after_freeze {
                    stale_wakeups_rejected += 1;
                }
                // (2) a write is rejected only when its fence is not greater than one accepted.
                if w.fence > last_accepted {
                    v.fresh_write_rejected += 1;
                }
            }
            // (2) every write whose fence was not greater than an accepted one was rejected.
            if w.accepted
                && writes
                    .iter()
                    .take_while(|x| !std::ptr::eq(*x, w))
                    .any(|x| x.accepted && x.fence >= w.fence)
            {
                v.stale_write_accepted += 1;
            }
        }
    }
    drop(inner);
    // (3) no two live leases on a resource overlapped while no fault was active.
    let leases = shared.leases.lock().expect("leases");
    for (i, a) in leases.iter().enumerate() {
        for b in &leases[i + 1..] {
            if a.resource != b.resource {
                continue;
            }
            let (from, to) = (a.start.max(b.start), a.end.min(b.end));
            if from < to && !faults.active_during(from, to) {
                eprintln!(
                    "overlap outside faults on resource {}: {a:?} and {b:?}",
                    a.resource
                );
                v.overlapping_leases += 1;
            }
        }
    }
    (v, accepted, rejected, stale_wakeups_rejected)
}

async fn torture(cluster: &mut dyn Cluster) {
    let name = cluster.name();
    let duration = run_time();
    let shared = Arc::new(Shared {
        store: FencedStore::default(),
        leases: Mutex::new(Vec::new()),
        figures: Figures::default(),
        stop: AtomicBool::new(false),
    });
    let counter: Arc<dyn FencingCounter> = Arc::new(MemoryCounter::new());
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (urls, counter, shared) =
                (cluster.urls(), Arc::clone(&counter), Arc::clone(&shared));
            std::thread::spawn(move || worker(urls, counter, shared))
        })
        .collect();
    let faults = FaultLog::default();
    let started = Instant::now();
    fault_schedule(cluster, &faults, started + duration).await;
    shared.stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().expect("worker thread");
    }
    let (violations, accepted, rejected, stale_rejected) = check(&shared, &faults);
    let f = &shared.figures;
    let counts = faults.counts.lock().expect("faults").clone();
    println!(
        "torture [{name}] {:?}: {WORKERS} workers x {RESOURCES} resources; acquisitions {}, contended/timed out {}, \
         unavailable {}; writes accepted {accepted}, rejected {rejected} (stale wake-ups rejected {stale_rejected}); \
         worker freezes {}, aborted signals {}; faults injected {} {counts:?}; violations {} {violations:?}",
        started.elapsed(),
        f.acquisitions.load(Ordering::SeqCst),
        f.contended.load(Ordering::SeqCst),
        f.unavailable.load(Ordering::SeqCst),
        f.freezes.load(Ordering::SeqCst),
        f.aborted_signals.load(Ordering::SeqCst),
        counts.values().sum::<u32>(),
        violations.total(),
    );
    assert_eq!(violations.total(), 0, "[{name}] {violations:?}");
    assert!(
        f.acquisitions.load(Ordering::SeqCst) > 50,
        "[{name}] too little work to judge"
    );
    assert!(
        f.freezes.load(Ordering::SeqCst) > 0,
        "[{name}] no worker was frozen"
    );
}

/// The two runs share two cores: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torture_local() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut cluster = LocalCluster::start(5).await;
    torture(&mut cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torture_compose() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(mut cluster) = ComposeCluster::up("torture") else {
        return;
    };
    torture(&mut cluster).await;
}
