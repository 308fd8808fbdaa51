//! What the lease keeper keeps for a leader's term: the election's lock, extended to the
//! lease through [`Lock::extend`] on the election's [`Timing`](super::timing::Timing), the
//! leader record re-armed after every renewal, and the step-down — record deleted, lock
//! released — when the term ends.

use std::sync::Arc;
use std::time::Instant;

use tokio::time::Instant as TokioInstant;

use super::builder::Inner;
use super::record::{self, Leader};
use crate::error::Error;
use crate::events::Event;
use crate::inner::Shared;
use crate::lease::{Holding, Lease};
use crate::lock::Lock;
use crate::node::GuardedWrite;

/// A leader's lock, as the keeper holds it, with what its record needs.
pub(super) struct Renewal {
    lock: Lock,
    shared: Arc<Shared>,
    leader: Leader,
    lock_key: Arc<str>,
    record_key: Arc<str>,
    /// The record's value, `"{term} {token} {identity}"`.
    value: String,
}

impl Renewal {
    pub(super) fn new(lock: Lock, inner: &Inner, leader: Leader) -> Self {
        let value = record::encode(&leader, lock.token());
        Renewal {
            lock,
            shared: Arc::clone(&inner.shared),
            leader,
            lock_key: Arc::clone(&inner.lock_key),
            record_key: Arc::clone(&inner.record_key),
            value,
        }
    }

    /// A write of the leader record (`None`: its deletion) guarded by the lock's token.
    pub(super) fn record(&self, value: Option<String>) -> GuardedWrite {
        record::guarded(
            &self.lock_key,
            &self.record_key,
            self.lock.token(),
            value,
            self.lock.ttl(),
        )
    }

    /// Writes the record on every node (advisory: how many made it).
    pub(super) async fn write_record(&self) -> usize {
        let write = self.record(Some(self.value.clone()));
        record::write_everywhere(&self.shared, write).await
    }
}

impl Holding for Renewal {
    fn expires_at(&self) -> Instant {
        self.lock.expires_at()
    }

    async fn extend(&mut self) -> Result<(), Error> {
        let lease = self.lock.ttl();
        self.lock.extend(lease).await
    }

    /// Re-arms the record. It is advisory: a slow node must not hold up the next renewal
    /// (with a node timeout near the retry period it could push that renewal past the
    /// deadline), so the write is cut off when the next round is due.
    async fn renewed(&mut self, _lease: &Lease, next: Instant) {
        let _ = tokio::time::timeout_at(TokioInstant::from_std(next), self.write_record()).await;
    }

    fn failed(&mut self, error: &Error) {
        // A loss ends the term (logged as such); anything else is retried.
        if !error.is_lock_lost() {
            tracing::warn!(leader = %self.leader, %error, remaining = ?self.lock.remaining(), "renewal failed; retrying");
        }
    }

    /// Deletes the record while the lock is still ours, then releases the lock.
    async fn release(self, resources: &[String]) {
        if !self.lock.is_expired() {
            let delete = self.record(None);
            record::write_everywhere(&self.shared, delete).await;
        }
        if let Err(error) = self.lock.release().await {
            tracing::warn!(leader = %self.leader, %error, "stepping down: release failed; the lock expires at the end of its lease");
            self.shared.config.events.emit(Event::ReleaseFailed {
                resources: resources.to_vec(),
                error,
            });
        }
    }
}
