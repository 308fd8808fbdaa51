//! The torture run's history and its checker: the fenced store every worker writes to, the
//! leases as their holders saw them, the fault windows, and the verdict over all of them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Instant;

use super::Shared;

/// One write offered to the fenced store, in the order the store saw them.
#[derive(Clone, Debug)]
pub(super) struct Write {
    pub(super) fence: u64,
    /// Which acquisition wrote it (numbered by the test, apart from the fence).
    pub(super) acquisition: u64,
    pub(super) accepted: bool,
    /// The writer was live: not frozen, and its signal said the lock was held right before.
    pub(super) live: bool,
    /// When the writer's lease began, and when it wrote.
    pub(super) lease_start: Instant,
    pub(super) at: Instant,
}

/// A lease as its holder saw it: from the start of its routine until the routine ended or
/// the validity it last knew of ran out, whichever came first.
#[derive(Clone, Debug)]
pub(super) struct Lease {
    pub(super) resource: usize,
    pub(super) fence: u64,
    pub(super) start: Instant,
    pub(super) end: Instant,
}

/// The protected storage: accepts a write unless its fence is smaller than the last one it
/// accepted for that resource (what `last_fence <= $fence` does in SQL): an owner may write
/// again with its own token, a replaced owner's token is always smaller.
#[derive(Default)]
pub(super) struct FencedStore {
    inner: Mutex<StoreInner>,
}

#[derive(Default)]
struct StoreInner {
    pub(super) last: HashMap<usize, u64>,
    pub(super) history: HashMap<usize, Vec<Write>>,
}

impl FencedStore {
    pub(super) fn write(&self, resource: usize, mut write: Write) -> bool {
        let mut inner = self.inner.lock().expect("store");
        let last = inner.last.get(&resource).copied().unwrap_or(0);
        write.accepted = write.fence >= last;
        write.at = Instant::now();
        if write.accepted {
            inner.last.insert(resource, write.fence);
        }
        let accepted = write.accepted;
        inner.history.entry(resource).or_default().push(write);
        accepted
    }
}

/// A side workload's write (semaphore, read-write lock) under `signal`: with its fence, live
/// unless the signal has aborted.
pub(super) fn write_under(
    store: &FencedStore,
    resource: usize,
    signal: &redfence::Signal,
    acquisition: u64,
    lease_start: Instant,
) {
    let Some(fence) = signal.fence() else {
        panic!("a fenced hold has a token");
    };
    store.write(
        resource,
        Write {
            fence,
            acquisition,
            accepted: false,
            live: !signal.is_aborted(),
            lease_start,
            at: lease_start,
        },
    );
}

/// When faults were active; an overlap of leases inside one is the known price of Redlock,
/// outside one it is a bug.
#[derive(Default)]
pub(super) struct FaultLog {
    /// Each fault's window, and whether an overlap of leases inside it is excused (a clock
    /// fault, a kill, a pause, a cut: not a restart, which the restart quarantine covers).
    pub(super) windows: Mutex<Vec<(Instant, Instant, bool)>>,
    pub(super) counts: Mutex<BTreeMap<String, u32>>,
}

impl FaultLog {
    pub(super) fn record(
        &self,
        kind: String,
        start: Instant,
        end: Instant,
        excuses_overlaps: bool,
    ) {
        self.windows
            .lock()
            .expect("faults")
            .push((start, end, excuses_overlaps));
        *self.counts.lock().expect("faults").entry(kind).or_default() += 1;
    }

    /// Whether any fault was active between `from` and `to`.
    pub(super) fn active_during(&self, from: Instant, to: Instant) -> bool {
        self.any_during(from, to, |_| true)
    }

    /// Whether a fault that excuses an overlap of leases was active between `from` and `to`.
    pub(super) fn excuses_overlap(&self, from: Instant, to: Instant) -> bool {
        self.any_during(from, to, |excuses| excuses)
    }

    fn any_during(&self, from: Instant, to: Instant, counts: impl Fn(bool) -> bool) -> bool {
        self.windows
            .lock()
            .expect("faults")
            .iter()
            .any(|&(start, end, excuses)| counts(excuses) && start <= to && from <= end)
    }
}

/// What fencing guarantees, and what Redlock guarantees outside faults: each must stay 0.
#[derive(Debug, Default)]
pub(super) struct Violations {
    /// An accepted write whose fence is smaller than one accepted before it.
    pub(super) stale_write_accepted: u64,
    /// A later acquisition's accepted fence not above the earlier ones.
    pub(super) accepted_not_increasing: u64,
    /// One fence handed to two acquisitions.
    pub(super) fence_reused: u64,
    /// A write rejected although no larger fence had been accepted (the store's contract).
    pub(super) fresh_write_rejected: u64,
    /// A live owner's write rejected with no fault active during its lease.
    pub(super) live_write_rejected: u64,
    /// Two leases on a resource overlapping with no fault active.
    pub(super) overlapping_leases: u64,
}

impl Violations {
    pub(super) fn total(&self) -> u64 {
        self.stale_write_accepted
            + self.accepted_not_increasing
            + self.fence_reused
            + self.fresh_write_rejected
            + self.live_write_rejected
            + self.overlapping_leases
    }
}

/// What the checker counted besides violations.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) accepted: u64,
    pub(super) rejected: u64,
    /// Writes by owners that had been frozen past their lease, rejected.
    pub(super) stale_rejected: u64,
    /// Acquisitions that had two or more writes accepted.
    pub(super) multi_write_acquisitions: u64,
    /// What the faults cost, as Redlock documents it: live writes rejected, and leases that
    /// overlapped, while a fault was active.
    pub(super) live_rejected_in_faults: u64,
    pub(super) overlaps_in_faults: u64,
}

pub(super) fn check(shared: &Shared, faults: &FaultLog) -> (Violations, Tally) {
    let (mut v, t) = check_store(&shared.store, faults);
    // No two live leases on a resource overlapped while no fault that excuses it was active
    // (restarts do not: the restart quarantine keeps a restarted node's votes out).
    let leases = shared.leases.lock().expect("leases");
    let mut t = t;
    for (i, a) in leases.iter().enumerate() {
        for b in &leases[i + 1..] {
            if a.resource != b.resource {
                continue;
            }
            let (from, to) = (a.start.max(b.start), a.end.min(b.end));
            if from >= to {
                continue;
            }
            if faults.excuses_overlap(from, to) {
                t.overlaps_in_faults += 1;
            } else {
                eprintln!(
                    "overlap outside faults on resource {} (fences {} and {}): {a:?} and {b:?}",
                    a.resource, a.fence, b.fence
                );
                v.overlapping_leases += 1;
            }
        }
    }
    (v, t)
}

/// What fencing guarantees, over the store's history alone (the side workloads check their
/// own overlaps).
pub(super) fn check_store(store: &FencedStore, faults: &FaultLog) -> (Violations, Tally) {
    let mut v = Violations::default();
    let mut t = Tally::default();
    let inner = store.inner.lock().expect("store");
    for writes in inner.history.values() {
        let mut last_accepted = 0u64;
        let mut last_acquisition = None;
        let mut acquisition_of: HashMap<u64, u64> = HashMap::new();
        let mut accepted_per_acquisition: HashMap<u64, u32> = HashMap::new();
        for w in writes {
            // Tokens are unique per acquisition.
            if *acquisition_of.entry(w.fence).or_insert(w.acquisition) != w.acquisition {
                v.fence_reused += 1;
            }
            if w.accepted {
                t.accepted += 1;
                *accepted_per_acquisition.entry(w.acquisition).or_default() += 1;
                if w.fence < last_accepted {
                    v.stale_write_accepted += 1;
                } else if w.fence == last_accepted && last_acquisition != Some(w.acquisition) {
                    v.accepted_not_increasing += 1;
                }
                last_accepted = last_accepted.max(w.fence);
                last_acquisition = Some(w.acquisition);
                continue;
            }
            t.rejected += 1;
            if w.fence >= last_accepted {
                v.fresh_write_rejected += 1;
            }
            if !w.live {
                t.stale_rejected += 1;
            } else if faults.active_during(w.lease_start, w.at) {
                t.live_rejected_in_faults += 1;
            } else {
                eprintln!(
                    "live write rejected outside faults: {w:?}, last accepted {last_accepted}"
                );
                v.live_write_rejected += 1;
            }
        }
        t.multi_write_acquisitions += accepted_per_acquisition
            .values()
            .filter(|&&n| n >= 2)
            .count() as u64;
    }
    drop(inner);
    (v, t)
}
