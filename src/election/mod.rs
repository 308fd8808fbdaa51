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
mod timing;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::Stream;

pub use builder::{Election, ElectionBuilder};
pub use identity::default_identity;
pub use leadership::Leadership;
pub use record::Leader;

use crate::error::Error;

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
    /// (each node bounded by the node timeout); does nothing when not leading, except that a
    /// term won by an attempt in flight when it is called starts resigned (its routine sees
    /// the signal fired, and its lock is released at once).
    ///
    /// The routine keeps running until it sees the signal: stop writing before resigning,
    /// or rely on the term to fence late writes.
    pub async fn resign(&self) {
        // Counted first: a term won by an attempt in flight now, not registered yet, sees the
        // count change and starts resigned (see `campaign::lead`).
        self.inner.resigns.fetch_add(1, Ordering::SeqCst);
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
        observe::changes(Arc::clone(&self.inner))
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
