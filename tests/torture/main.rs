//! The torture run: K workers × M resources for a bounded time, using `using()` with fencing
//! and writing to a fenced store several times per acquisition, while a fault schedule kills,
//! pauses and cuts off random minority nodes, restarts nodes without persistence or flushes
//! them (`FLUSHALL`; one, or now and then a majority one after another: no overlap of leases
//! is excused there, the restart quarantine must prevent it), makes node clocks run fast or
//! jump forward (on a minority most of the time, now and then on a majority), and freezes
//! random workers inside their critical sections for longer than their TTL. A checker then
//! verifies the recorded history.
//!
//! The workers run with the **default** restart quarantine, but for a quarter of them (3 s,
//! so that the cluster does not sit out every 60 s quarantine), and another quarter are fresh
//! processes: a new `Redlock` for every acquisition, which saw no restart happen.
//!
//! Every worker runs on its own OS thread with its own single-threaded runtime, so a frozen
//! worker is frozen whole — its extension task included — like a process in a GC pause. Half the
//! workers run in fair mode (they queue on the nodes), half do not: both contend for the same
//! resources.
//!
//! The local run uses five Valkey servers under libfaketime where both are available
//! (`testkit/src/faketime.rs`), so that any node can get a clock fault; elsewhere it runs on
//! redis-server without clock faults and says what is missing.
//!
//! `TORTURE_SECS` sets the duration of each run (default 45 s).

mod faults;
mod history;
mod rwlock;
mod semaphore;
#[path = "../support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use history::{FaultLog, FencedStore, Lease, Write, check};
use rand::Rng;
use redfence::{Error, FencingCounter, MemoryCounter, Redlock};
use support::cluster::{Cluster, ComposeCluster, LocalCluster};
use support::faketime::{Clocks, Pieces};

const WORKERS: usize = 16;
const RESOURCES: usize = 4;
const TTL: Duration = Duration::from_millis(1_000);
const THRESHOLD: Duration = Duration::from_millis(400);
/// The chance that a critical section freezes its worker for longer than the TTL.
const FREEZE_PERCENT: u32 = 4;
/// The restart quarantine of the workers that set one (the others use the default, 60 s):
/// longer than any lease they hold (the TTL, renewed).
pub(crate) const RESTART_QUARANTINE: Duration = Duration::from_secs(3);

/// How a worker makes its `Redlock`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Client {
    /// One `Redlock` for the whole run, with the default restart quarantine.
    Default,
    /// One `Redlock` for the whole run, with [`RESTART_QUARANTINE`].
    ShortQuarantine,
    /// A new `Redlock` (default settings) for every acquisition, closed after it: a process
    /// started after whatever faults came before.
    Fresh,
}

fn run_time() -> Duration {
    let secs = std::env::var("TORTURE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(45);
    Duration::from_secs(secs)
}

#[derive(Default)]
struct Figures {
    acquisitions: AtomicU64,
    /// Those of fresh clients (a new `Redlock` each).
    fresh_acquisitions: AtomicU64,
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
    /// Numbers the acquisitions, to tell a token reused by two of them.
    next_acquisition: AtomicU64,
    leases: Mutex<Vec<Lease>>,
    figures: Figures,
    stop: AtomicBool,
}

/// One worker thread with its own `Redlock` (or one per acquisition, for a [`Client::Fresh`]
/// one); `fair` workers queue on the nodes (fair mode), the others do not, so both kinds
/// contend for the same resources.
fn worker(
    urls: Vec<String>,
    counter: Arc<dyn FencingCounter>,
    shared: Arc<Shared>,
    fair: bool,
    client: Client,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("worker runtime");
    runtime.block_on(async move {
        let build = || {
            let builder = Redlock::builder()
                .nodes(urls.clone())
                .fencing(Arc::clone(&counter))
                .automatic_extension_threshold(THRESHOLD)
                .retry_count(u32::MAX)
                .retry_delay(Duration::from_millis(20))
                .retry_jitter(Duration::from_millis(20))
                .acquire_timeout(Duration::from_secs(2))
                .fair(fair);
            match client {
                Client::ShortQuarantine => builder.restart_quarantine(RESTART_QUARANTINE),
                Client::Default | Client::Fresh => builder,
            }
            .build()
            .expect("config")
        };
        let mut redlock = build();
        let mut rng = rand::rng();
        while !shared.stop.load(Ordering::SeqCst) {
            if client == Client::Fresh {
                redlock.close().await;
                redlock = build();
            }
            let resource = rng.random_range(0..RESOURCES);
            let freeze = rng.random_range(0..100) < FREEZE_PERCENT;
            let writes = rng.random_range(2..=4u32);
            // Which write the worker freezes before, if it freezes.
            let freeze_at = freeze.then(|| rng.random_range(0..writes));
            let work = Duration::from_millis(rng.random_range(5..40)) / writes;
            let freeze_for = TTL * 2 + Duration::from_millis(rng.random_range(0..500));
            let name = format!("torture:{resource}");
            let shared_in = Arc::clone(&shared);
            let result = redlock
                .using(&[name.as_str()], TTL, |signal| async move {
                    let shared = shared_in;
                    let start = Instant::now();
                    let fence = signal.fence().expect("fencing is configured");
                    let acquisition = shared.next_acquisition.fetch_add(1, Ordering::SeqCst);
                    let mut valid_until = start + signal.remaining();
                    let mut frozen = false;
                    for n in 0..writes {
                        tokio::time::sleep(work).await;
                        if freeze_at == Some(n) {
                            // Stop the world: the extension task is frozen too.
                            valid_until = valid_until.min(Instant::now() + signal.remaining());
                            shared.figures.freezes.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(freeze_for);
                            frozen = true;
                        } else if frozen {
                            // Still not looking at the signal: the store must catch these.
                        } else if let Err(lost) = signal.check() {
                            let end = valid_until.min(Instant::now());
                            shared.leases.lock().expect("leases").push(Lease {
                                resource,
                                fence,
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
                        shared.store.write(
                            resource,
                            Write {
                                fence,
                                acquisition,
                                accepted: false,
                                live: !frozen,
                                lease_start: start,
                                at: start,
                            },
                        );
                    }
                    let now = Instant::now();
                    let end = if !frozen && !signal.is_aborted() {
                        now
                    } else {
                        valid_until.min(now)
                    };
                    shared.leases.lock().expect("leases").push(Lease {
                        resource,
                        fence,
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
                    if client == Client::Fresh {
                        let fresh = &shared.figures.fresh_acquisitions;
                        fresh.fetch_add(1, Ordering::SeqCst);
                    }
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

async fn torture(cluster: &mut dyn Cluster, clocks: Option<&Clocks>, name: &str) {
    let duration = run_time();
    let shared = Arc::new(Shared {
        store: FencedStore::default(),
        next_acquisition: AtomicU64::new(0),
        leases: Mutex::new(Vec::new()),
        figures: Figures::default(),
        stop: AtomicBool::new(false),
    });
    let counter = memory_counter();
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| {
            let (urls, counter, shared) =
                (cluster.urls(), Arc::clone(&counter), Arc::clone(&shared));
            let client = match i % 4 {
                0 => Client::ShortQuarantine,
                3 => Client::Fresh,
                _ => Client::Default,
            };
            std::thread::spawn(move || worker(urls, counter, shared, i % 2 == 0, client))
        })
        .collect();
    let faults = FaultLog::default();
    let started = Instant::now();
    faults::schedule(cluster, clocks, &faults, started + duration).await;
    shared.stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().expect("worker thread");
    }
    let (violations, tally) = check(&shared, &faults);
    let f = &shared.figures;
    let counts = faults.counts.lock().expect("faults").clone();
    let clock_faults: u32 = counts
        .iter()
        .filter(|(k, _)| k.starts_with("fast") || k.starts_with("jump"))
        .map(|(_, n)| n)
        .sum();
    let clock_majority: u32 = counts
        .iter()
        .filter(|(k, _)| k.ends_with("(majority)"))
        .map(|(_, n)| n)
        .sum();
    println!(
        "torture [{name}] {:?}: {WORKERS} workers x {RESOURCES} resources; acquisitions {} ({} by fresh clients), contended/timed out {}, \
         unavailable {}; writes accepted {} (acquisitions with 2+ accepted {}), rejected {} (stale wake-ups rejected {}, \
         live writes rejected during faults {}); worker freezes {}, aborted signals {}, lease overlaps during faults {}; \
         faults injected {} (clock faults {clock_faults}, {clock_majority} of them on a majority) {counts:?}; \
         violations {} {violations:?}",
        started.elapsed(),
        f.acquisitions.load(Ordering::SeqCst),
        f.fresh_acquisitions.load(Ordering::SeqCst),
        f.contended.load(Ordering::SeqCst),
        f.unavailable.load(Ordering::SeqCst),
        tally.accepted,
        tally.multi_write_acquisitions,
        tally.rejected,
        tally.stale_rejected,
        tally.live_rejected_in_faults,
        f.freezes.load(Ordering::SeqCst),
        f.aborted_signals.load(Ordering::SeqCst),
        tally.overlaps_in_faults,
        counts.values().sum::<u32>(),
        violations.total(),
    );
    assert_eq!(violations.total(), 0, "[{name}] {violations:?}");
    assert!(
        f.acquisitions.load(Ordering::SeqCst) > 50,
        "[{name}] too little work to judge"
    );
    assert!(
        tally.multi_write_acquisitions > 0,
        "[{name}] no owner had a second write accepted"
    );
    assert!(
        f.freezes.load(Ordering::SeqCst) > 0,
        "[{name}] no worker was frozen"
    );
    if clocks.is_some() {
        assert!(clock_faults > 0, "[{name}] no clock fault was injected");
    }
}

/// Five local servers for a run: Valkey under libfaketime where both are available (so that
/// [`faults::schedule`] can give any node a clock fault), else redis-server without clock faults
/// (said on stderr).
async fn local_servers(name: &str) -> (LocalCluster, Option<Clocks>) {
    match Pieces::find() {
        Ok(pieces) => {
            let (servers, clocks) = Clocks::start(&pieces, 5, &[]);
            (LocalCluster::over(servers).await, Some(clocks))
        }
        Err(missing) => {
            eprintln!(
                "torture [{name}]: no clock faults: missing {missing}; running on redis-server"
            );
            (LocalCluster::start(5).await, None)
        }
    }
}

/// One in-memory fencing counter, to share between every worker of a run (tokens of two
/// counters would repeat).
fn memory_counter() -> Arc<dyn FencingCounter> {
    Arc::new(MemoryCounter::new())
}

/// The `Redlock` of a side workload's workers (semaphore, read-write lock), set up as the main
/// run's: a short node timeout, the restart quarantine, `counter` (the one counter of every
/// worker), quick retries; `fair` ones queue on the nodes.
fn side_redlock(cluster: &dyn Cluster, fair: bool, counter: &Arc<dyn FencingCounter>) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .fair(fair)
        .node_timeout(Duration::from_millis(100))
        .automatic_extension_threshold(THRESHOLD)
        .restart_quarantine(RESTART_QUARANTINE)
        .fencing(Arc::clone(counter))
        .retry_count(50)
        .retry_delay(Duration::from_millis(20))
        .retry_jitter(Duration::from_millis(20))
        .build()
        .expect("config")
}

/// Runs a side workload's `workers` under the main run's faults (kills, pauses, cuts,
/// restarts without persistence on one node or a majority in sequence, clock faults where
/// `clocks` can fake them, now and then on a majority) for at most 30 s, then sets `stop` and
/// waits for every worker. The log says where overlaps are excused, as in the main run: never
/// after a restart, which the restart quarantine must cover.
async fn side_faults(
    cluster: &mut dyn Cluster,
    clocks: Option<&Clocks>,
    stop: &AtomicBool,
    workers: Vec<tokio::task::JoinHandle<()>>,
) -> FaultLog {
    let faults = FaultLog::default();
    let until = Instant::now() + run_time().min(Duration::from_secs(30));
    faults::schedule(cluster, clocks, &faults, until).await;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("a worker ends in time")
            .expect("worker");
    }
    faults
}

/// The two runs share two cores: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torture_local() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (mut cluster, clocks) = local_servers("local").await;
    let name = match clocks {
        Some(_) => "local Valkey, clocks faked",
        None => "local processes",
    };
    torture(&mut cluster, clocks.as_ref(), name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the docker-compose harness; scripts/test.sh runs it with --ignored where Docker works"]
async fn torture_compose() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut cluster = ComposeCluster::up("torture")
        .expect("the docker-compose harness is not available (see above)");
    torture(&mut cluster, None, "docker-compose").await;
}
