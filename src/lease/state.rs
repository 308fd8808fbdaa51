//! The one state of a kept lease, shared by its keeper and its views (`using()`'s
//! [`Signal`](crate::Signal), election's [`Leadership`](crate::Leadership)): until when the
//! lease is guaranteed and when it expires, why it was lost (set once), whether its holder
//! asked it to end, and whether the keeper has ended.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use tokio::sync::watch;

use crate::clock;
use crate::error::{Error, LossReason};

/// What a view knows of the lease beside its times (a `Signal`'s token and fence, a
/// `Leadership`'s leader), and how it announces a loss.
pub(crate) trait Subject: Send + Sync + 'static {
    /// Reports the first loss of the lease (an event, a log line). Called once, and never
    /// for an unannounced [`Closing`].
    fn announce(&self, resources: &[String], error: &Error);
}

/// How a lease ends when its holder is done with it (the routine returned, the term ended).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Closing {
    /// The reason views see afterwards (`Released`, `Resigned`), unless the lease was lost
    /// before.
    pub(crate) reason: LossReason,
    /// Whether that end is announced like a loss.
    pub(crate) announce: bool,
}

/// Until when the lease holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Times {
    /// Past it, the lease is lost even if its keeper could not run (its schedule's
    /// [`deadline`](super::Schedule::deadline)).
    pub(crate) deadline: Instant,
    /// The end of the lock's validity (the deadline is not after it).
    pub(crate) expires_at: Instant,
}

/// Where the holder and the keeper stand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Kept alive.
    Kept,
    /// The holder asked the keeper to stop (the work ended, the leader resigned).
    Stopping,
    /// The keeper has ended: the lock is released (or handed to its background release).
    Ended,
}

/// The one state of a kept lease: its times, the loss (set once, by the first abort), and
/// the phase of its holder and keeper. Views read it; the keeper moves it on.
pub(crate) struct LeaseState<T> {
    resources: Arc<[String]>,
    subject: T,
    closing: Closing,
    /// Moved on by every renewal; a change (or a forced notification on abort) wakes
    /// [`lost`](LeaseState::lost).
    times: watch::Sender<Times>,
    /// Set once, by the first abort.
    error: OnceLock<Error>,
    phase: watch::Sender<Phase>,
}

impl<T: Subject> LeaseState<T> {
    /// The state of a lease held on `resources` until `times`.
    pub(crate) fn new(
        resources: Arc<[String]>,
        subject: T,
        closing: Closing,
        times: Times,
    ) -> Self {
        LeaseState {
            resources,
            subject,
            closing,
            times: watch::Sender::new(times),
            error: OnceLock::new(),
            phase: watch::Sender::new(Phase::Kept),
        }
    }

    /// What the view knows beside the times.
    pub(crate) fn subject(&self) -> &T {
        &self.subject
    }

    /// The resources the lease holds, as given.
    pub(crate) fn resources(&self) -> &Arc<[String]> {
        &self.resources
    }

    /// The end of the lock's validity, as of the last renewal.
    pub(crate) fn expires_at(&self) -> Instant {
        self.times.borrow().expires_at
    }

    /// Until when the lease is guaranteed without another renewal.
    pub(crate) fn deadline(&self) -> Instant {
        self.times.borrow().deadline
    }

    /// The loss, if any; aborts once the deadline has passed (`Unconfirmed` while validity
    /// is left, `Expired` after), so that a starved keeper cannot leave the lease held.
    pub(crate) fn error(&self) -> Option<&Error> {
        if let Some(error) = self.error.get() {
            return Some(error);
        }
        let Times {
            deadline,
            expires_at,
        } = *self.times.borrow();
        let now = clock::now();
        if now >= deadline {
            return Some(self.abort(self.unconfirmed(expires_at, now)));
        }
        None
    }

    /// The loss recorded so far, without looking at the clock (for `Debug`).
    pub(crate) fn recorded_error(&self) -> Option<&Error> {
        self.error.get()
    }

    /// Resolves once the lease is lost, at once if it already is, with the reason (as
    /// [`error`](LeaseState::error)). Cancel-safe.
    pub(crate) async fn lost(&self) -> Error {
        let mut changes = self.times.subscribe();
        loop {
            // Mark the current times seen *before* looking at the error: an abort that
            // happens after the look then shows up as a change.
            let deadline = changes.borrow_and_update().deadline;
            if let Some(error) = self.error() {
                return error.clone();
            }
            let sleep = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline));
            tokio::pin!(sleep);
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        // Unreachable (the sender lives in this state); never spin.
                        (&mut sleep).await;
                    }
                }
                () = &mut sleep => {}
            }
        }
    }

    /// `LockLost` on this lease's resources, for `reason`.
    pub(crate) fn loss(&self, reason: LossReason) -> Error {
        Error::LockLost {
            resources: self.resources.to_vec(),
            reason,
        }
    }

    /// `Unconfirmed` with the validity left at `now`, or `Expired` when none is.
    pub(crate) fn unconfirmed(&self, expires_at: Instant, now: Instant) -> Error {
        let remaining = expires_at.saturating_duration_since(now);
        self.loss(if remaining.is_zero() {
            LossReason::Expired
        } else {
            LossReason::Unconfirmed { remaining }
        })
    }

    /// Loses the lease, unless it already is: announces the first loss and wakes the
    /// views waiting for it. Returns the loss that stands (the first).
    pub(crate) fn abort(&self, error: Error) -> &Error {
        self.set(error, true)
    }

    /// Ends the lease as its [`Closing`] says, unless it was lost before.
    pub(crate) fn close(&self) {
        let reason = self.closing.reason.clone();
        self.set(self.loss(reason), self.closing.announce);
    }

    fn set(&self, error: Error, announce: bool) -> &Error {
        let mut first = false;
        let stored = self.error.get_or_init(|| {
            first = true;
            error
        });
        if first {
            if announce {
                self.subject.announce(&self.resources, stored);
            }
            self.times.send_modify(|_| {});
        }
        stored
    }

    /// A renewal moved the times on (ignored once the lease is lost). Wakes
    /// [`lost`](LeaseState::lost) only if a view waits there (one that subscribes meanwhile
    /// reads the new times on its own), since this comes for every lease every round.
    pub(crate) fn renewed(&self, times: Times) {
        if self.error.get().is_some() {
            return;
        }
        self.times.send_if_modified(|value| {
            *value = times;
            self.times.receiver_count() > 0
        });
    }

    /// Asks the keeper to stop renewing and release (idempotent).
    pub(crate) fn stop(&self) {
        self.phase.send_if_modified(|phase| {
            let keep = *phase == Phase::Kept;
            if keep {
                *phase = Phase::Stopping;
            }
            keep
        });
    }

    /// Resolves once the holder asked the keeper to stop (or the keeper ended).
    pub(crate) async fn stopping(&self) {
        let mut phase = self.phase.subscribe();
        // Err only if the sender is gone, which it never is while this state lives.
        let _ = phase.wait_for(|phase| *phase != Phase::Kept).await;
    }

    /// The keeper has ended: the lease is released, or handed to its background release.
    pub(crate) fn mark_ended(&self) {
        self.phase.send_replace(Phase::Ended);
    }

    /// Resolves once the keeper has ended.
    pub(crate) async fn ended(&self) {
        let mut phase = self.phase.subscribe();
        let _ = phase.wait_for(|phase| *phase == Phase::Ended).await;
    }
}

/// Asks the keeper of its lease to stop when dropped: the holder's end of the work, however
/// it ends (returned, panicked, or its future dropped).
pub(crate) struct StopOnDrop<T: Subject>(pub(crate) Arc<LeaseState<T>>);

impl<T: Subject> Drop for StopOnDrop<T> {
    fn drop(&mut self) {
        self.0.stop();
    }
}
