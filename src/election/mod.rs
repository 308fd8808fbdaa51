//! Leader election with terms: [`Redlock::election`](crate::Redlock::election) and
//! [`Election`] (whose docs tell how it works).

mod builder;
mod campaign;
mod identity;
mod leadership;
mod observe;
mod record;
mod renewal;
#[cfg(test)]
mod tests;

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;

pub use builder::ElectionBuilder;
pub use identity::default_identity;
pub use leadership::Leadership;

use crate::Redlock;
use crate::error::Error;
use crate::inner::Shared;
use builder::{Hooks, Timing};

/// A leader, as the nodes record it: who leads, and in which term.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Leader {
    /// The candidate's identity, as given to [`Redlock::election`](crate::Redlock::election)
    /// (by default [`default_identity`]).
    pub identity: String,
    /// The term: the fencing token the leader's lock was issued. Strictly greater than every
    /// earlier leader's term.
    pub term: u64,
}

impl fmt::Display for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (term {})", self.identity, self.term)
    }
}

/// One candidate in a leader election, built by
/// [`Redlock::election`](crate::Redlock::election). Cheap to clone (an `Arc` inside): keep a
/// clone to [`resign`](Election::resign) from outside [`run`](Election::run), or to watch the
/// leader.
///
/// ```no_run
/// use std::time::Duration;
/// use redfence::{Error, MemoryCounter, Redlock};
///
/// # async fn schedule_jobs(_term: u64) -> Result<(), Error> { Ok(()) }
/// # async fn run() -> Result<(), Error> {
/// let redlock = Redlock::builder()
///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     // The terms. Every candidate must share ONE counter: a MemoryCounter is per process,
///     // so candidates in two processes would each get term 1. Use a PostgresCounter
///     // (redfence-postgres).
///     .fencing(MemoryCounter::new())
///     .build()?;
/// let election = redlock
///     .election("scheduler", None) // identity: host name + random UUID
///     .lease(Duration::from_secs(15))
///     .renew_deadline(Duration::from_secs(10))
///     .retry_period(Duration::from_secs(2))
///     .build()?;
/// election
///     .run(|leadership| async move {
///         loop {
///             tokio::select! {
///                 lost = leadership.lost() => return Err(lost), // stop writing now
///                 done = schedule_jobs(leadership.term()) => done?,
///             }
///         }
///     })
///     .await
/// # }
/// ```
///
/// # How it works
///
/// A candidate campaigns by trying to take a lock on the resource `election:{NAME}` (the
/// Redis key is the builder's key prefix, then that name; the braces make it a Redis
/// Cluster hash tag). The candidate that gets it leads, with the lock's **fencing token as
/// its term**: terms strictly increase from one leader to the next, so the storage the
/// leader writes to can reject a deposed leader's late writes (see [`crate::fence`]).
///
/// While it leads, a renewal loop extends the lock to `lease` every `retry_period`. When
/// renewal has failed for `renew_deadline` (measured from the start of the last successful
/// round), the [`Leadership`] signal fires — `lease − renew_deadline` before the lease can run
/// out, never after — and the leader steps down. The timing rule is client-go's:
/// `lease > renew_deadline > 1.2 × retry_period`.
///
/// Beside the lock, the leader keeps a record at `election:{NAME}:leader` (plus the key
/// prefix): `"{term} {token} {identity}"`, written on every node whose lock key still holds
/// its token, with the lease as TTL, re-armed after every renewal and deleted when it steps
/// down. [`Election::leader`] counts a node's record only if its token matches the lock key
/// on that node, so a stale record never names a leader. The lock's own value stays the
/// random token: plain locks keep the node-redlock wire format.
#[derive(Clone)]
pub struct Election {
    inner: Arc<Inner>,
}

/// What every clone of an [`Election`] shares.
struct Inner {
    redlock: Redlock,
    shared: Arc<Shared>,
    name: String,
    /// The lock's resource name, `election:{NAME}`.
    resource: String,
    /// The lock's Redis key (with the key prefix).
    lock_key: Arc<str>,
    /// The leader record's Redis key (with the key prefix).
    record_key: Arc<str>,
    identity: String,
    timing: Timing,
    rejoin: bool,
    hooks: Hooks,
    /// The term this candidate leads now, for [`Election::resign`].
    current: Mutex<Option<Leadership>>,
}

impl Election {
    /// The election's name, as given.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.inner.identity
    }

    /// The Redis key of the election's lock: the key prefix, then `election:{NAME}`.
    pub fn lock_key(&self) -> &str {
        &self.inner.lock_key
    }

    /// The Redis key of the leader record: the lock key, then `:leader`.
    pub fn record_key(&self) -> &str {
        &self.inner.record_key
    }

    /// The lease: the TTL of the lock, renewed every retry period.
    pub fn lease(&self) -> Duration {
        self.inner.timing.lease
    }

    /// How long renewal may fail before the leader steps down.
    pub fn renew_deadline(&self) -> Duration {
        self.inner.timing.renew_deadline
    }

    /// How often a candidate tries to become leader, and a leader to renew.
    pub fn retry_period(&self) -> Duration {
        self.inner.timing.retry_period
    }

    /// Campaigns until elected, then runs `routine` with the [`Leadership`] of that term.
    ///
    /// - **Campaign.** One acquisition attempt every `retry_period` while another candidate
    ///   leads or the nodes fail; it never gives up on its own.
    /// - **Lead.** Once elected, the leader's record is written, the
    ///   [`on_started_leading`](ElectionBuilder::on_started_leading) hook runs, and the
    ///   routine starts. The lock is renewed in the background; the [`Leadership`] signal
    ///   fires when renewal has failed for `renew_deadline`, when a majority answers that the
    ///   lock is not ours, or on [`resign`](Election::resign).
    /// - **Step down.** When the routine returns, or as soon as the signal fired, the record
    ///   is deleted and the lock released, so another candidate can take over at its next
    ///   attempt. The routine is never dropped: it should stop writing when the signal fires
    ///   (`tokio::select!` on [`Leadership::lost`]) and return. `run` waits for it, then runs
    ///   [`on_stopped_leading`](ElectionBuilder::on_stopped_leading).
    /// - **Then** (builder's [`rejoin`](ElectionBuilder::rejoin), default `false`): without
    ///   rejoin, `run` returns the routine's result. With rejoin, a routine that returned
    ///   `Ok` ends `run` with it; after an `Err` (leadership lost, or any failure), the
    ///   candidate waits one `retry_period` and campaigns again.
    ///
    /// Dropping the future returned by `run` ends the candidacy: a term in progress is
    /// released in the background and `on_stopped_leading` runs. To shut down, drop it, then
    /// call [`Redlock::close`](crate::Redlock::close), which waits for that step-down: the
    /// next leader is elected within about a `retry_period` (up to 1.2× with the jitter), not
    /// after the lease.
    ///
    /// # Errors
    ///
    /// The routine's error, unchanged. Errors of the election itself go through `E::from`:
    /// [`Error::Closed`] after [`Redlock::close`](crate::Redlock::close), and
    /// [`Error::InvalidInput`] if the fencing counter rejects the election's resource name.
    /// Contention, node failures and fencing failures are retried, never returned.
    ///
    /// # Panics
    ///
    /// Panics when called outside a Tokio runtime (the renewal task is spawned on it). A
    /// panic of the routine is resumed after the lock is handed to its background release.
    pub async fn run<T, E, F, Fut>(&self, routine: F) -> Result<T, E>
    where
        F: FnMut(Leadership) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        campaign::run(&self.inner, routine).await
    }

    /// Steps down at once if this candidate leads: the [`Leadership`] signal fires with
    /// [`LossReason::Resigned`](crate::LossReason::Resigned), and the record and the lock are
    /// released, so another candidate takes over at its next attempt (within one
    /// `retry_period`) instead of waiting out the lease. Returns once the lock is released
    /// (each node bounded by the node timeout); does nothing when not leading.
    ///
    /// The routine keeps running until it sees the signal: stop writing before resigning,
    /// or rely on the term to fence late writes.
    pub async fn resign(&self) {
        let current = self.inner.current.lock().ok().and_then(|c| c.clone());
        if let Some(leadership) = current {
            leadership.resign().await;
        }
    }

    /// The current leader, read from every node (each call bounded by the node timeout):
    /// `Some` when a majority of nodes hold the same leader's lock token and its record,
    /// `None` when no leader holds a majority (none elected, a handover in progress, or a
    /// record not written yet).
    ///
    /// **Advisory**: a snapshot, stale as soon as it returns. Never decide to write from it;
    /// the leader's term fences its writes.
    ///
    /// # Errors
    ///
    /// [`Error::QuorumUnreachable`] when fewer than a majority of nodes answered (`granted`
    /// then counts the nodes that answered).
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        record::read(
            &self.inner.shared,
            &self.inner.lock_key,
            &self.inner.record_key,
        )
        .await
    }

    /// A stream of leader changes: [`leader`](Election::leader) polled every
    /// `retry_period`, yielding the first answer and then each change (`None` when nobody
    /// leads). Reads that fail (no majority answered) are skipped, but once none has
    /// succeeded for a whole `lease` after a leader was named, `None` is yielded: that leader
    /// may be gone, and is no longer named. Never ends; drop it to stop polling.
    pub fn observe(&self) -> impl Stream<Item = Option<Leader>> + Send + 'static {
        observe::changes(self.clone())
    }
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.inner.name)
            .field("identity", &self.inner.identity)
            .field("lock_key", &self.inner.lock_key)
            .field("timing", &self.inner.timing)
            .field("rejoin", &self.inner.rejoin)
            .finish()
    }
}
