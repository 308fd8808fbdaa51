//! [`Leadership`]: what the routine of [`Election::run`](super::Election::run) sees of its
//! term, and the state it shares with the renewal task.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::record::Leader;
use crate::clock;
use crate::error::{Error, LossReason};

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
    pub(super) state: Arc<TermState>,
}

impl Leadership {
    /// The term: this leadership's fencing token. Strictly greater than every earlier
    /// leader's term; send it with every write to storage that rejects smaller ones.
    pub fn term(&self) -> u64 {
        self.state.leader.term
    }

    /// This leader's identity.
    pub fn identity(&self) -> &str {
        &self.state.leader.identity
    }

    /// The leader: identity and term.
    pub fn leader(&self) -> &Leader {
        &self.state.leader
    }

    /// Whether leadership is over (or can no longer be guaranteed). Never goes back to
    /// `false`.
    pub fn is_lost(&self) -> bool {
        self.state.error().is_some()
    }

    /// Resolves once leadership is over, at once if it already is, with the reason (the same
    /// as [`error`](Leadership::error)). For `tokio::select!`; cancel-safe.
    pub async fn lost(&self) -> Error {
        let mut changes = self.state.deadline.subscribe();
        loop {
            // Mark the deadline seen before looking at the error: a later abort shows up as
            // a change.
            let deadline = changes.borrow_and_update().deadline;
            if let Some(error) = self.state.error() {
                return error.clone();
            }
            let sleep = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline));
            tokio::pin!(sleep);
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        // Unreachable (the sender lives in the shared state); never spin.
                        (&mut sleep).await;
                    }
                }
                () = &mut sleep => {}
            }
        }
    }

    /// `Ok(())` while leading; the reason (as [`error`](Leadership::error)) once leadership
    /// is over. Call it before every step that must not run without leadership.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] once leadership is over.
    pub fn check(&self) -> Result<(), Error> {
        match self.state.error() {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }

    /// Why leadership is over: [`Error::LockLost`] with [`LossReason::Unconfirmed`]
    /// (renewal failed for the renew deadline), [`LossReason::NotHeld`] (a majority said the
    /// lock is not ours), [`LossReason::Expired`], or [`LossReason::Resigned`] (resigned, or
    /// the term ended). `None` while leading.
    pub fn error(&self) -> Option<Error> {
        self.state.error().cloned()
    }

    /// How long leadership is guaranteed without another successful renewal: the time left
    /// until the renew deadline (zero once lost). Grows back after every renewal.
    pub fn remaining(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.state
            .deadline
            .borrow()
            .deadline
            .saturating_duration_since(clock::now())
    }

    /// Steps down at once: the signal fires with [`LossReason::Resigned`], and the leader's
    /// record and lock are released, so another candidate takes over at its next attempt
    /// instead of waiting out the lease. Returns once the release has answered (each node
    /// bounded by the node timeout) or the term had already ended.
    pub async fn resign(&self) {
        self.state.abort(self.state.lost(LossReason::Resigned));
        self.state.resign.send_replace(true);
        let mut stepped_down = self.state.stepped_down.subscribe();
        // Err only if the sender is gone, which it never is while `state` lives.
        let _ = stepped_down.wait_for(|done| *done).await;
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("leader", &self.state.leader)
            .field("remaining", &self.remaining())
            .field("error", &self.state.error.get())
            .finish()
    }
}

/// Until when leadership holds without another renewal, and the lock's own validity end.
#[derive(Clone, Copy, Debug)]
pub(super) struct Deadline {
    /// The start of the last successful round plus the renew deadline.
    pub(super) deadline: Instant,
    /// The lock's validity end (the deadline is before it).
    pub(super) expires_at: Instant,
}

/// What a [`Leadership`] and the renewal task share.
pub(super) struct TermState {
    pub(super) leader: Leader,
    resource: String,
    /// Moved on by every successful renewal; a change (or a forced notification) wakes
    /// [`Leadership::lost`].
    pub(super) deadline: watch::Sender<Deadline>,
    /// Set once, when leadership ends.
    error: OnceLock<Error>,
    /// Set by `resign`: the renewal task steps down at once.
    pub(super) resign: watch::Sender<bool>,
    /// Set by the renewal task once it has stepped down (or ended any other way).
    pub(super) stepped_down: watch::Sender<bool>,
}

impl TermState {
    pub(super) fn new(leader: Leader, resource: String, deadline: Deadline) -> Self {
        TermState {
            leader,
            resource,
            deadline: watch::Sender::new(deadline),
            error: OnceLock::new(),
            resign: watch::Sender::new(false),
            stepped_down: watch::Sender::new(false),
        }
    }

    /// Why leadership ended, if it did; ends it with `Unconfirmed` once the deadline has
    /// passed, so that a starved renewal task cannot leave the signal unfired.
    pub(super) fn error(&self) -> Option<&Error> {
        if let Some(error) = self.error.get() {
            return Some(error);
        }
        let Deadline {
            deadline,
            expires_at,
        } = *self.deadline.borrow();
        let now = clock::now();
        if now >= deadline {
            let remaining = expires_at.saturating_duration_since(now);
            let reason = if remaining.is_zero() {
                LossReason::Expired
            } else {
                LossReason::Unconfirmed { remaining }
            };
            return Some(self.abort(self.lost(reason)));
        }
        None
    }

    pub(super) fn lost(&self, reason: LossReason) -> Error {
        Error::LockLost {
            resources: vec![self.resource.clone()],
            reason,
        }
    }

    /// Ends leadership, unless it already ended, and wakes the waiters.
    pub(super) fn abort(&self, error: Error) -> &Error {
        let mut first = false;
        let stored = self.error.get_or_init(|| {
            first = true;
            error
        });
        if first {
            tracing::info!(leader = %self.leader, error = %stored, "leadership ended");
            self.deadline.send_modify(|_| {});
        }
        stored
    }

    /// A successful renewal moved the deadline on (unless leadership already ended).
    pub(super) fn renewed(&self, deadline: Deadline) {
        if self.error.get().is_none() {
            self.deadline.send_replace(deadline);
        }
    }

    /// The renewal task has stepped down.
    pub(super) fn mark_stepped_down(&self) {
        self.stepped_down.send_replace(true);
    }
}
