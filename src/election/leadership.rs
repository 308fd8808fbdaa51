//! [`Leadership`]: what the routine of [`Election::run`](super::Election::run) sees of its
//! term — a view of the lease keeper's [`LeaseState`] — and the [`Tenure`] that state
//! carries for it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::record::Leader;
use crate::clock;
use crate::error::{Error, LossReason};
use crate::lease::{Closing, LeaseState, Subject, Times, View};

/// One term of leadership, handed to the routine of [`Election::run`](super::Election::run):
/// the term (the fencing token to send with every write), the leader's identity, and a
/// signal that fires when leadership can no longer be guaranteed.
///
/// The signal fires **before the lease can run out**: when renewal has failed for the
/// renew deadline (counted from the start of the last successful renewal, which is also
/// where the lease counts from), when a majority of nodes answered that the lock is not
/// ours, or on [`resign`](Leadership::resign). It is checked against the clock too, so it
/// fires on time even if the renewal task cannot run. Once fired it stays fired.
///
/// Cheap to clone (an `Arc` inside), `Send + Sync`.
#[derive(Clone)]
pub struct Leadership {
    pub(super) state: View<Tenure>,
}

impl Leadership {
    /// The term: this leadership's fencing token. Strictly greater than every earlier
    /// leader's term; send it with every write to storage that rejects smaller ones.
    pub fn term(&self) -> u64 {
        self.state.subject().leader.term
    }

    /// This leader's identity.
    pub fn identity(&self) -> &str {
        &self.state.subject().leader.identity
    }

    /// The leader: identity and term.
    pub fn leader(&self) -> &Leader {
        &self.state.subject().leader
    }

    /// Whether leadership is over (or can no longer be guaranteed). Never goes back to
    /// `false`.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// Resolves once leadership is over, at once if it already is, with the reason (the same
    /// as [`error`](Leadership::error)). For `tokio::select!`; cancel-safe.
    pub async fn lost(&self) -> Error {
        self.state.lost().await
    }

    /// `Ok(())` while leading; the reason (as [`error`](Leadership::error)) once leadership
    /// is over. Call it before every step that must not run without leadership.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] once leadership is over.
    pub fn check(&self) -> Result<(), Error> {
        self.state.check()
    }

    /// Why leadership is over: [`Error::LockLost`] with [`LossReason::Unconfirmed`]
    /// (renewal failed for the renew deadline), [`LossReason::NotHeld`] (a majority said the
    /// lock is not ours), [`LossReason::Expired`], or [`LossReason::Resigned`] (resigned, or
    /// the term ended). `None` while leading.
    pub fn error(&self) -> Option<Error> {
        self.state.cloned_error()
    }

    /// How long leadership is guaranteed without another successful renewal, unless it is
    /// lost first (the signal fires: a majority answered that the lock is gone, or a resign;
    /// the term then steps down, and another candidate may lead): the time left until the
    /// renew deadline (zero once lost). Grows back after every renewal.
    pub fn remaining(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.state
            .deadline()
            .saturating_duration_since(clock::now())
    }

    /// Steps down at once: the signal fires with [`LossReason::Resigned`], and the leader's
    /// record and lock are released, so another candidate takes over at its next attempt
    /// instead of waiting out the lease. Returns once the release has answered (each node
    /// bounded by the node timeout) or the term had already ended.
    pub async fn resign(&self) {
        self.state.abort(self.state.loss(LossReason::Resigned));
        self.state.stop();
        self.state.ended().await;
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("leader", self.leader())
            .field("remaining", &self.remaining())
            .field("error", &self.state.recorded_error())
            .finish()
    }
}

/// What a [`Leadership`] knows of its term beside the lease: the leader; and where it
/// announces the end of the term (a log line).
pub(super) struct Tenure {
    pub(super) leader: Leader,
}

impl Tenure {
    /// The lease state of a term held until `times`: lost at the renew deadline at the
    /// latest, and ended by the step-down as `Resigned`, logged like any end of leadership.
    pub(super) fn lease(self, resource: String, times: Times) -> LeaseState<Tenure> {
        let closing = Closing {
            reason: LossReason::Resigned,
            announce: true,
        };
        LeaseState::new(Arc::from(vec![resource]), self, closing, times)
    }
}

impl Subject for Tenure {
    fn announce(&self, _resources: &[String], error: &Error) {
        tracing::info!(leader = %self.leader, %error, "leadership ended");
    }
}
