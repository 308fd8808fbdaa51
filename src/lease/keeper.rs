//! The keeper: one task per kept lease that waits until its [`Schedule`] says, renews through
//! the [`Holding`]'s extend round, records the outcome in the [`LeaseState`], and releases the
//! lock when the holder is done (or, as the holder chose, as soon as the lease is lost).

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use super::schedule::{self, Cause, Lease, Schedule, Step};
use super::state::{LeaseState, Subject, Times};
use crate::clock;
use crate::error::Error;
use crate::guard::DropGuard;

/// What the keeper keeps alive, and how: a held lock (or any later primitive's hold) with
/// its extend round and its release.
pub(crate) trait Holding: Send + 'static {
    /// The end of the hold's validity now, also after a failed or cut-off round (never
    /// overstated).
    fn expires_at(&self) -> Instant;

    /// One renewal round. `Ok`: renewed, [`expires_at`](Holding::expires_at) moved on. An
    /// error for which [`Error::is_lock_lost`] holds means ownership is gone; any other
    /// is retried as the schedule says. The keeper cuts a round off at its deadline.
    fn extend(&mut self) -> impl Future<Output = Result<(), Error>> + Send;

    /// A round renewed the lease (its state already says so): reports it, and does any
    /// advisory follow-up (election re-arms its leader record), which should be done by
    /// `next`, when the next round is due. The keeper drops it if the holder stops first.
    fn renewed(&mut self, lease: &Lease, next: Instant) -> impl Future<Output = ()> + Send;

    /// A round failed with `error`, or was cut off at its deadline (then `error` is the
    /// loss it causes).
    fn failed(&mut self, error: &Error);

    /// The lease was lost: the keeper renews no more.
    fn lost(&mut self) {}

    /// Releases the hold once the keeper is done with it.
    fn release(self, resources: &[String]) -> impl Future<Output = ()> + Send;
}

/// When a lost lease is released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnLoss {
    /// At once (a leader steps down as soon as it may no longer lead).
    Release,
    /// Once the holder stops (`using()`: the routine may still be winding down).
    HoldUntilStopped,
}

/// How the renewal loop ended.
enum End {
    /// The holder asked to stop.
    Stopped,
    /// The lease is lost: renewal is over.
    GaveUp,
}

/// Keeps `holding` alive on `schedule` until its holder stops (see
/// [`LeaseState::stop`]) or the lease is lost, then releases it. However this task ends
/// (even dropped with its runtime), the state is closed and marked ended.
pub(crate) async fn keep<H, S, T>(
    mut holding: H,
    schedule: S,
    lease: Lease,
    state: Arc<LeaseState<T>>,
    on_loss: OnLoss,
) where
    H: Holding,
    S: Schedule,
    T: Subject,
{
    let _ended = DropGuard::new(Arc::clone(&state), |state| {
        state.close();
        state.mark_ended();
    });
    if let End::GaveUp = renew_until_stopped(&mut holding, &schedule, lease, &state).await {
        holding.lost();
        if on_loss == OnLoss::HoldUntilStopped {
            state.stopping().await;
        }
    }
    state.close();
    holding.release(state.resources()).await;
}

async fn renew_until_stopped<H, S, T>(
    holding: &mut H,
    schedule: &S,
    mut lease: Lease,
    state: &LeaseState<T>,
) -> End
where
    H: Holding,
    S: Schedule,
    T: Subject,
{
    loop {
        if state.error().is_some() {
            // Lost as seen from outside (the deadline passed, or the leader resigned).
            return End::GaveUp;
        }
        let now = clock::now();
        let by = match schedule.step(now, &lease) {
            Step::Abort { at, cause } if at <= now => {
                state.abort(match cause {
                    Cause::Limit(limit) => Error::RenewalLimit {
                        resources: state.resources().to_vec(),
                        limit,
                    },
                    Cause::Expired | Cause::Unconfirmed => state.unconfirmed(lease.expires_at, now),
                });
                return End::GaveUp;
            }
            Step::Extend { at, by }
                if schedule::start_of(at, &lease, schedule.on_grid()) <= now =>
            {
                by
            }
            // A first round waits for its grid instant; a retry or an abort for its own.
            step => {
                let wake = match step {
                    Step::Extend { at, .. } => schedule::start_of(at, &lease, schedule.on_grid()),
                    Step::Abort { at, .. } => at,
                };
                tokio::select! {
                    biased;
                    () = state.stopping() => return End::Stopped,
                    () = sleep_until(wake) => {}
                }
                continue;
            }
        };
        let started = now;
        let outcome = tokio::select! {
            biased;
            () = state.stopping() => return End::Stopped,
            outcome = tokio::time::timeout_at(tokio::time::Instant::from_std(by), holding.extend()) => outcome,
        };
        match outcome {
            Ok(Ok(())) => {
                lease.renewed(started, holding.expires_at());
                state.renewed(Times {
                    deadline: schedule.deadline(&lease),
                    expires_at: lease.expires_at,
                });
                let next = schedule.step(clock::now(), &lease).at();
                tokio::select! {
                    biased;
                    () = state.stopping() => return End::Stopped,
                    () = holding.renewed(&lease, next) => {}
                }
            }
            Ok(Err(error)) => {
                holding.failed(&error);
                if error.is_lock_lost() {
                    // A majority said the keys are not ours, or the validity ran out.
                    state.abort(error);
                    return End::GaveUp;
                }
                lease.failed_round = Some(started);
            }
            Err(_) => {
                // The round outlived its deadline: nothing confirmed the lease in time. It
                // was cut short, so there are no per-node errors to report.
                let error = state.unconfirmed(lease.expires_at, clock::now());
                holding.failed(&error);
                state.abort(error);
                return End::GaveUp;
            }
        }
    }
}

/// Sleeps until `at` on a Tokio timer of this task's own.
async fn sleep_until(at: Instant) {
    tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
}
