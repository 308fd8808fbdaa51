//! What happened in one run, on true simulated time (Tokio's paused clock, in ms since the
//! run started): the claims of every holder, the fenced writes, the acquisitions' durations,
//! the signals' aborts. The checkers read it; `--trace` prints it beside the servers' requests.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

/// What a claim holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A mutex: nobody else on its resources.
    Exclusive,
    /// One of a semaphore's permits: at most its K at once.
    Permit,
    /// A read-write lock's read side: beside other readers, never a writer.
    Read,
    /// A read-write lock's write side: nobody else.
    Write,
}

/// A span of true time in which a holder counted on its lock: from when it learnt it held
/// it to the end of the validity it believed in.
#[derive(Clone, Debug)]
pub struct Claim {
    /// What it holds.
    pub mode: Mode,
    /// Which client and operation (for messages).
    pub who: String,
    /// The lock's token.
    pub token: String,
    /// The resources it locks.
    pub resources: Vec<String>,
    /// Its fencing token.
    pub fence: Option<u64>,
    /// When the holder learnt it held the lock (ms).
    pub from: f64,
    /// Where the validity it counted on ended, or when it let go, if sooner (ms).
    pub until: f64,
}

/// A write offered to the fenced store.
#[derive(Clone, Debug)]
pub struct Write {
    /// Which client and operation.
    pub who: String,
    /// The resource written.
    pub resource: String,
    /// The fence it carried.
    pub fence: u64,
    /// When (ms).
    pub at: f64,
    /// Whether the store took it.
    pub accepted: bool,
}

/// Everything a run recorded.
#[derive(Default)]
pub struct Record {
    /// Every holder's claim.
    pub claims: Vec<Claim>,
    /// Every write offered to the fenced store.
    pub writes: Vec<Write>,
    /// Acquisitions that took longer than their bound: (who, took ms, bound ms).
    pub late: Vec<(String, f64, f64)>,
    /// Signals that aborted after the validity their holder believed in: (who, at, until).
    pub late_aborts: Vec<(String, f64, f64)>,
    /// Grants, of every kind.
    pub grants: u64,
    /// Faults injected.
    pub faults: u64,
    /// The run's events, when tracing: (time, line).
    pub events: Vec<(f64, String)>,
}

/// The shared record of a run and its clock.
#[derive(Clone)]
pub struct History {
    start: Instant,
    record: Arc<Mutex<Record>>,
    tracing: bool,
}

impl History {
    /// A record starting now.
    pub fn new(tracing: bool) -> Self {
        History {
            start: Instant::now(),
            record: Arc::default(),
            tracing,
        }
    }

    /// Now, in ms of true time since the run started.
    pub fn now(&self) -> f64 {
        self.at(Instant::now())
    }

    /// `instant` in ms since the run started.
    pub fn at(&self, instant: Instant) -> f64 {
        instant.saturating_duration_since(self.start).as_secs_f64() * 1000.0
            - self.start.saturating_duration_since(instant).as_secs_f64() * 1000.0
    }

    /// A lock's `expires_at` (on the same clock) in ms since the run started.
    pub fn at_std(&self, instant: std::time::Instant) -> f64 {
        self.at(Instant::from_std(instant))
    }

    /// The record, to add to.
    pub fn record(&self) -> MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes an event for the trace.
    pub fn event(&self, line: impl FnOnce() -> String) {
        if self.tracing {
            let now = self.now();
            self.record().events.push((now, line()));
        }
    }
}
