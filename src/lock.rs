//! `Lock`: a held lock, to extend and release.

use std::fmt;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::acquisition::Acquired;
use crate::clock;
use crate::error::{Error, LossReason};
use crate::guard::DropGuard;
use crate::inner::{Held, validate_ttl};
use crate::metrics::{HoldEnd, HoldTimer, TypeLabel};
use crate::node::Op;
use crate::quorum::{self, Until};
use crate::trace;

/// A lock held on a majority of nodes, until [`expires_at`](Lock::expires_at).
///
/// Extend it with [`extend`](Lock::extend) and release it with [`release`](Lock::release).
/// A `Lock` dropped without `release` releases itself in the background (when dropped inside
/// a Tokio runtime; otherwise its keys expire at the end of their TTL).
///
/// Holding a `Lock` is not proof of ownership at the moment of a write: a process can pause
/// past [`expires_at`](Lock::expires_at) at any point. Send [`fence`](Lock::fence) with every
/// write to storage that checks it.
#[must_use = "a lock is released as soon as it is dropped"]
pub struct Lock {
    /// Released in the background when dropped before `release` has finished.
    held: DropGuard<Held>,
    expires_at: Instant,
    fence: Option<u64>,
    /// How long it is held, for the metrics.
    hold: HoldTimer,
}

impl Lock {
    pub(crate) fn new(acquired: Acquired, ty: TypeLabel) -> Self {
        Lock {
            held: DropGuard::new(acquired.held, Held::release_in_background),
            expires_at: acquired.expires_at,
            fence: acquired.fence,
            hold: HoldTimer::start(ty),
        }
    }

    /// Ownership is gone (an extension found the lock lost, or `using()` aborted): ends the
    /// hold for the metrics.
    pub(crate) fn hold_lost(&mut self) {
        self.hold.end(HoldEnd::Lost, self.expires_at);
    }

    /// The resources this lock holds, as given (without the key prefix).
    pub fn resources(&self) -> &[String] {
        &self.held.target.resources
    }

    /// The owner token: 128 random bits as 32 hex digits, the value stored at every key.
    pub fn token(&self) -> &str {
        &self.held.token
    }

    /// The fencing token issued for this acquisition, if a counter is configured. Send it with
    /// every write; the storage must reject a write whose fence is smaller than the last
    /// one it accepted.
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// The TTL the lock was acquired or last extended with.
    pub fn ttl(&self) -> Duration {
        self.held.target.ttl
    }

    /// The instant, on this process's monotonic clock, when the lock's validity ends: the
    /// start of the winning round plus the TTL minus the drift allowance.
    pub fn expires_at(&self) -> Instant {
        self.expires_at
    }

    /// How much validity is left (zero once expired).
    pub fn remaining(&self) -> Duration {
        self.expires_at.saturating_duration_since(clock::now())
    }

    /// Whether the validity has run out.
    pub fn is_expired(&self) -> bool {
        clock::now() >= self.expires_at
    }

    /// Extends the lock to `ttl` from now on a majority of nodes (compare-and-`PEXPIRE`), and
    /// recomputes the validity the same way `acquire` does.
    ///
    /// A failed extension never releases anything. But the nodes that did apply it may now
    /// expire the keys sooner than before (when `ttl` is shorter than what was left), so after
    /// a failed or dropped extension the lock reports no more validity than the keys may have:
    /// `min(old expiry, start of the round + ttl - drift)`. With a `ttl` at least as long as
    /// the remaining validity (the usual case) that is the old expiry.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidInput`] for a TTL `acquire` would reject; nothing is sent and the lock
    ///   is unchanged.
    /// - [`Error::LockLost`] when the lock has already expired locally, or a majority answered
    ///   that its keys no longer hold our token.
    /// - [`Error::QuorumUnreachable`] when too many nodes failed to confirm it.
    /// - [`Error::NoValidity`] when the majority answered too late.
    pub async fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        let span = trace::extend_span(&self.held.target.resources, self.quorum());
        let started = clock::now();
        let result = self.extend_round(ttl).instrument(span.clone()).await;
        if result.as_ref().is_err_and(Error::is_lock_lost) {
            // Nothing is left to count on once the nodes said the keys are not ours:
            // `remaining()` is zero and `is_expired()` true from now on.
            self.expires_at = self.expires_at.min(clock::now());
            self.hold_lost();
        }
        trace::outcome(&span, result.as_ref().map(|()| "extended"), started);
        result
    }

    async fn extend_round(&mut self, ttl: Duration) -> Result<(), Error> {
        let drift_factor = self.held.shared.config.drift_factor;
        let ttl = validate_ttl(ttl, drift_factor)?;
        if self.is_expired() {
            return Err(self.lost(LossReason::Expired));
        }
        let start = clock::now();
        // Where the keys may expire once any node applied this round: from the round's start
        // (before any node saw it), minus the drift allowance. Set before the first await, so
        // that a failed round, and a call dropped half-way, leave the lock no more validity
        // than that (never more than it had).
        let bound = start + ttl.saturating_sub(quorum::drift(ttl, drift_factor));
        if !crate::plant::on(crate::plant::Plant::ShorteningExtend) {
            self.expires_at = self.expires_at.min(bound);
        }
        // Whatever this round's outcome, a node it reached keeps the keys up to `ttl`.
        self.held.longest_ttl = self.held.longest_ttl.max(ttl);
        let round = self.held.round(Op::Extend, ttl, Until::Granted).await;
        let elapsed = clock::since(start);
        let tally = round.into_tally();
        tally.trace();
        if !tally.reached() {
            return Err(tally.extend_error(&self.held.target.resources));
        }
        match quorum::validity(ttl, elapsed, drift_factor) {
            Some(valid) => {
                // `start + elapsed + valid` is `bound`: the validity counts from the start.
                self.expires_at = start + elapsed + valid;
                self.held.target.ttl = ttl;
                Ok(())
            }
            None => Err(Error::NoValidity {
                ttl,
                elapsed,
                drift: quorum::drift(ttl, drift_factor),
            }),
        }
    }

    /// Releases the lock: compare-and-delete on every node, so only keys that still hold our
    /// token are deleted (never the next owner's). Returns once a majority answered; the other
    /// nodes finish in the background.
    ///
    /// Releasing a lock that has already expired is not an error.
    ///
    /// # Errors
    ///
    /// [`Error::QuorumUnreachable`] when a majority of nodes could not be reached; the keys
    /// there expire at the end of their TTL.
    pub async fn release(self) -> Result<(), Error> {
        self.release_until(Until::Answered).await
    }

    /// Releases like [`release`](Lock::release), but waits for every node to answer or time
    /// out, so that no call of this lock is left running when it returns (for `using()`).
    pub(crate) async fn release_all(self) -> Result<(), Error> {
        self.release_until(Until::All).await
    }

    async fn release_until(mut self, until: Until) -> Result<(), Error> {
        self.hold.end(HoldEnd::Released, self.expires_at);
        let span = trace::release_span(&self.held.target.resources, self.quorum());
        let started = clock::now();
        let ttl = self.held.longest_ttl;
        let round = self
            .held
            .round(Op::Release, ttl, until)
            .instrument(span.clone())
            .await;
        let tally = round.into_tally();
        let _entered = span.enter();
        tally.trace();
        // Only now: a release dropped half-way still releases in the background.
        self.held.disarm();
        let result = if tally.answered() >= tally.quorum() {
            Ok(())
        } else {
            Err(tally.unreachable())
        };
        trace::outcome(&span, result.as_ref().map(|()| "released"), started);
        result
    }

    fn quorum(&self) -> usize {
        quorum::quorum(self.held.shared.nodes.len())
    }

    fn lost(&self, reason: LossReason) -> Error {
        Error::LockLost {
            resources: self.held.target.resources.to_vec(),
            reason,
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // After `release` or a loss, this records nothing.
        self.hold.end(HoldEnd::Dropped, self.expires_at);
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("resources", &self.held.target.resources)
            .field("token", &self.held.token)
            .field("fence", &self.fence)
            .field("remaining", &self.remaining())
            .finish()
    }
}
