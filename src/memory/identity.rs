//! A lock server's identity and memory: `INFO` (run id, uptime, replication id, evicted keys)
//! and `scripts/memory.lua` (the voter's marker and roster, see [`crate::memory`]) in one
//! round trip, read before the first call, after a lost connection, a `NOSCRIPT` or a loss
//! seen, and beside a call at least every [`RECHECK`] or when another voter's marker changed.
//!
//! Two judgements decide whether the server's votes count (see
//! [`RedlockBuilder::restart_quarantine`](crate::RedlockBuilder::restart_quarantine)):
//! - this client's own, of what it saw while connected: a new `run_id` (a restart), a new
//!   replication id (a failover), evicted keys, a marker that vanished, a step of the server's
//!   clock. A loss the marker survived is written back as a new marker, so that every other
//!   client, a fresh process included, sees it too;
//! - the [`MemoryBook`]'s, shared by the voters of one `Redlock`: what the rosters of the
//!   other voters remember of this one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use redis::aio::ConnectionLike;
use redis::{Script, Value};
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::{Flags, MemoryBook, Standing};
use crate::clock;
use reading::{ClockSample, Info, text};

/// How often a server's identity is read again while nothing else suggested a loss (a
/// restart that the connection hid: redis-rs reconnected while idle and another client had
/// already loaded the script again).
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// The memory script, loaded beside the first reading on each server (`SCRIPT LOAD`, which an
/// ACL user with the lock's rules may run; `EVAL` it may not).
const MEMORY_LUA: &str = include_str!("../scripts/memory.lua");
static MEMORY: LazyLock<Script> = LazyLock::new(|| Script::new(MEMORY_LUA));

/// How long a voter that may have forgotten locks does not count, and how much clock drift
/// its readings may show before it counts as a step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct QuarantineRule {
    /// How long a voter's votes do not count after it lost memory; zero turns quarantine off
    /// (and every identity check with it).
    pub(crate) period: Duration,
    /// The lock's drift factor: a server clock that drifts more between two readings stepped.
    pub(crate) drift_factor: f64,
}

/// When a server's identity is read next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Due {
    /// Not now (read recently, quarantine off, or the server cannot tell).
    No,
    /// Before the next call: never read, something suggested a restart, or a marker is to be
    /// replaced; the call's repairs and votes depend on it.
    Before,
    /// Beside the next call (the periodic check, in the same round trip).
    Beside,
}

/// One server's identity and memory as last read, and this client's own quarantine of it.
pub(crate) struct Identity {
    rule: QuarantineRule,
    memory: Arc<MemoryBook>,
    /// This voter's index in `memory`, and what the book says of it without its lock.
    index: usize,
    flags: Arc<Flags>,
    /// This client's own judgement says the votes count (not suspect, no quarantine of its
    /// own): with `flags`, [`Self::standing`] takes no lock (false: look in `state`).
    own_counts: AtomicBool,
    /// The marker's key, and the roster keys' prefix (both after the key prefix).
    marker_key: String,
    roster_prefix: String,
    state: Mutex<State>,
    /// The reading under way, shared by the callers that wait for it.
    under_way: Mutex<Option<Shared<BoxFuture<'static, ()>>>>,
    /// Where readings run (`Redlock::close` waits for them), and how long one may take.
    tasks: TaskTracker,
    bound: Duration,
}

#[derive(Default)]
struct State {
    /// What `INFO` said last.
    info: Option<Info>,
    /// The server's clock at the last memory reading, to catch a step.
    clock: Option<ClockSample>,
    /// When this client's own quarantine ends, if the server is or was quarantined.
    until: Option<Instant>,
    /// When the identity was last read.
    checked_at: Option<Instant>,
    /// Something suggested a restart: read the identity before the next call.
    suspect: bool,
    /// A loss the marker survived: this marker id is replaced by the next reading.
    replace: Option<String>,
    /// The marker id last read (what a batch expects: see `Identity::marker_read`).
    marker: Option<String>,
    /// The memory script is loaded on this server (as far as this client knows).
    loaded: bool,
    /// The server does not answer `INFO` (an ACL without it): never asked again.
    info_refused: bool,
    /// The server does not run the memory script (an ACL without `TIME`, or keys outside
    /// the user's patterns): never asked again.
    memory_refused: bool,
}

/// One reading to make: what it asks, as a pipeline of that many commands.
type Call = (Asked, redis::Pipeline, usize);

/// The calls of one reading, in the order they are pipelined.
struct Asked {
    info: bool,
    load: bool,
    memory: bool,
    /// The marker id this reading replaces, if any.
    replace: Option<String>,
    /// The voters whose roster entries the memory script reads, in order.
    peers: Vec<String>,
}

impl Identity {
    /// A server's identity, quarantined by `rule`, its memory judged in `memory` as the voter
    /// `name` (its address as clients name it), its keys under `key_prefix`.
    /// Its readings run on `tasks`, each bounded by `bound`.
    pub(crate) fn new(
        rule: QuarantineRule,
        memory: Arc<MemoryBook>,
        (name, key_prefix): (&str, &str),
        tasks: TaskTracker,
        bound: Duration,
    ) -> Self {
        let (index, flags) = memory.register(name);
        Identity {
            rule,
            index,
            flags,
            own_counts: AtomicBool::new(true),
            memory,
            marker_key: format!("{key_prefix}{}", super::MARKER),
            roster_prefix: format!("{key_prefix}{}", super::ROSTER),
            state: Mutex::default(),
            under_way: Mutex::default(),
            tasks,
            bound,
        }
    }

    /// This voter's index in its memory book.
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn off(&self, state: &State) -> bool {
        self.rule.period.is_zero() || (state.info_refused && state.memory_refused)
    }

    /// Whether the server's votes count now. A server suspected of a restart (a lost
    /// connection, `NOSCRIPT`) whose identity could not be read since is quarantined too, for
    /// [`RECHECK`] (fail closed): its votes count again once it is read.
    pub(crate) fn standing(&self) -> Standing {
        // The usual case, on every grant: two atomic loads.
        if self.own_counts.load(Ordering::Acquire) && self.flags.counts() {
            return Standing::Counts;
        }
        let own = {
            let state = self.state();
            if self.off(&state) {
                return Standing::Counts;
            }
            if state.suspect {
                return Standing::Quarantined(RECHECK);
            }
            let own = state
                .until
                .and_then(|until| until.checked_duration_since(clock::now()))
                .filter(|d| !d.is_zero())
                .map_or(Standing::Counts, Standing::Quarantined);
            // A quarantine of its own that ended: the fast path from now on.
            self.own_counts
                .store(own == Standing::Counts, Ordering::Release);
            own
        };
        if self.flags.counts() {
            return own;
        }
        own.and(self.memory.standing(self.index))
    }

    /// Whether an extension may repair (set again) a missing key on this server: its votes
    /// count.
    pub(crate) fn repairs(&self) -> bool {
        self.standing() == Standing::Counts
    }

    /// Whether, and how, the identity should be read with the next call.
    pub(crate) fn due(&self) -> Due {
        {
            let state = self.state();
            if self.off(&state) {
                return Due::No;
            }
            match state.checked_at {
                None => return Due::Before,
                Some(_) if state.suspect || state.replace.is_some() => return Due::Before,
                Some(at) if clock::since(at) >= RECHECK => return Due::Beside,
                Some(_) => {}
            }
        }
        if self.flags.news() {
            Due::Beside
        } else {
            Due::No
        }
    }

    /// The marker id last read on this server, to check in a batch of acquisitions or
    /// extensions (see [`Self::marker_read`]), with the marker's key; `None` when quarantine is
    /// off or the memory cannot be read.
    pub(crate) fn marker_to_check(&self) -> Option<(&str, String)> {
        let state = self.state();
        if self.rule.period.is_zero() || state.memory_refused {
            return None;
        }
        Some((&self.marker_key, state.marker.clone()?))
    }

    /// Notes the marker a batch read (`value`, the batch's last reply) where it expected
    /// `expected`: another marker, or none, means that the server lost its memory since it was
    /// last read (a flush), so it is suspect at once (its grants in this batch do not count)
    /// and read before the next call.
    pub(crate) fn marker_read(&self, expected: &str, value: Option<&Value>) {
        let same = match value.and_then(text) {
            Some(marker) => marker
                .strip_prefix(expected)
                .is_some_and(|rest| rest.starts_with('|')),
            None => false,
        };
        if !same {
            tracing::warn!(
                "a lock server's memory marker changed under a batch: its votes do not count \
                 until its memory is read again"
            );
            self.suspect();
        }
    }

    /// Something suggested a restart (a lost connection, `NOSCRIPT`): read the identity
    /// before the next call, loading the memory script first (a restart loses scripts).
    pub(crate) fn suspect(&self) {
        let mut state = self.state();
        state.suspect = true;
        state.loaded = false;
        self.own_counts.store(false, Ordering::Release);
    }

    /// Reads the identity and memory on `conn` (unless quarantine is off or the server cannot
    /// tell), or waits for the reading under way. The reading runs in a task of its own,
    /// bounded like a connect (at least a second), which a caller that gives up (its call's
    /// deadline) does not cancel: a server slower than the node timeout to answer a first
    /// reading is still read, and until it is, the young voters its roster could settle are
    /// [`Standing::Pending`]. A server that refuses `INFO` or the memory script for good (an
    /// ACL, a proxy) is not asked that again; any other failure leaves the check due before
    /// the next call.
    pub(crate) async fn check<C>(self: &Arc<Self>, conn: &C)
    where
        C: ConnectionLike + Clone + Send + 'static,
    {
        let under_way = {
            let mut under_way = self
                .under_way
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match &*under_way {
                Some(reading) => reading.clone(),
                None => {
                    let Some(call) = self.ask() else {
                        return;
                    };
                    self.memory.reading(self.index, true);
                    let (identity, mut conn) = (Arc::clone(self), conn.clone());
                    // In the caller's span (the node's): its lines name the node.
                    let task = self.tasks.spawn(
                        async move {
                            let read = tokio::time::timeout(
                                identity.bound,
                                identity.read(&mut conn, call),
                            );
                            if read.await.is_err() {
                                tracing::debug!("the server's identity could not be read in time");
                                identity.suspect();
                            }
                            identity.memory.reading(identity.index, false);
                            *identity
                                .under_way
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner) = None;
                        }
                        .in_current_span(),
                    );
                    let reading = async move {
                        let _ = task.await;
                    }
                    .boxed()
                    .shared();
                    *under_way = Some(reading.clone());
                    reading
                }
            }
        };
        under_way.await;
    }

    /// One reading of `call` on `conn`.
    async fn read<C: ConnectionLike + Send>(&self, conn: &mut C, call: Call) {
        let (asked, pipeline, count) = call;
        let sent = clock::now();
        let replies = conn.req_packed_commands(&pipeline, 0, count).await;
        let received = clock::now();
        match replies {
            Ok(replies) => self.observe(&asked, replies, sent, received),
            Err(err) => {
                tracing::debug!(%err, "could not read the server's identity");
                self.suspect();
            }
        }
    }

    /// The calls of the next reading: `INFO`, the memory script (loaded first where it may be
    /// missing), with what this client knows of the other voters' markers.
    fn ask(&self) -> Option<Call> {
        let state = self.state();
        if self.off(&state) {
            return None;
        }
        let mut pipeline = redis::pipe();
        let mut asked = Asked {
            info: !state.info_refused,
            load: !state.memory_refused && !state.loaded,
            memory: !state.memory_refused,
            replace: state.replace.clone().filter(|_| !state.memory_refused),
            peers: Vec::new(),
        };
        drop(state);
        if asked.info {
            pipeline.cmd("INFO");
        }
        if asked.load {
            pipeline.cmd("SCRIPT").arg("LOAD").arg(MEMORY_LUA);
        }
        if asked.memory {
            let peers = self.memory.peers_of(self.index);
            let call = pipeline
                .cmd("EVALSHA")
                .arg(MEMORY.get_hash())
                .arg(1 + peers.len())
                .arg(&self.marker_key);
            for (name, _) in &peers {
                call.arg(format!("{}{name}", self.roster_prefix));
            }
            call.arg(crate::random::uuid().simple().to_string())
                .arg(asked.replace.as_deref().unwrap_or(""));
            for (_, seen) in &peers {
                call.arg(seen);
            }
            asked.peers = peers.into_iter().map(|(name, _)| name).collect();
        }
        let count = usize::from(asked.info) + usize::from(asked.load) + usize::from(asked.memory);
        Some((asked, pipeline, count))
    }

    fn give_up(&self, what: &str, why: &str) {
        tracing::warn!(
            what,
            why,
            "the server refuses a call of the restart quarantine: the losses it would show are not quarantined"
        );
    }
}

mod reading;
#[cfg(test)]
mod tests;
