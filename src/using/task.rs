//! The extension task of `using()`: waits (on the `Redlock`'s shared
//! [`Alarms`](crate::alarms::Alarms)) until the [`Policy`] says, extends, records the outcome,
//! and releases the lock when the scope ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::policy::{Cause, Lease, Policy, Step};
use super::signal::State;
use crate::clock;
use crate::error::{Error, LossReason};
use crate::events::Event;
use crate::guard::DropGuard;
use crate::lock::Lock;

/// How the extension loop ended.
enum End {
    /// `using` is done with the lock.
    Stopped,
    /// The signal aborted: extension is over, the lock waits for the end of the scope.
    GaveUp,
}

/// Keeps the lock alive until told to stop (or until it gives up), then releases it.
pub(super) async fn extension_task(
    mut lock: Lock,
    lease: Lease,
    state: Arc<State>,
    policy: Policy,
    mut stop: oneshot::Receiver<()>,
) {
    // However this task ends (even aborted with its runtime), the signal stops saying "held".
    let _finish = DropGuard::new(Arc::clone(&state), |state| state.finish());
    if let End::GaveUp = extend_until_stopped(&mut lock, lease, &state, &policy, &mut stop).await {
        lock.hold_lost();
        // Whether `using` sent nothing and dropped the sender, or was dropped: both end it.
        let _ = stop.await;
    }
    state.finish();
    let resources = state.resources.to_vec();
    if let Err(error) = lock.release_all().await {
        state.events.emit(Event::ReleaseFailed { resources, error });
    }
}

async fn extend_until_stopped(
    lock: &mut Lock,
    mut lease: Lease,
    state: &State,
    policy: &Policy,
    stop: &mut oneshot::Receiver<()>,
) -> End {
    loop {
        if state.error().is_some() {
            // Aborted from outside (the signal saw the validity run out).
            return End::GaveUp;
        }
        let now = clock::now();
        let step = policy.step(now, &lease);
        let by = match step {
            Step::Abort { at, cause } if at <= now => {
                let error = match cause {
                    Cause::Limit(limit) => Error::RenewalLimit {
                        resources: state.resources.to_vec(),
                        limit,
                    },
                    Cause::Expired | Cause::Unconfirmed => unconfirmed(state, lease.expires_at),
                };
                state.abort(error);
                return End::GaveUp;
            }
            Step::Extend { at, by } if start_of(at, &lease) <= now => by,
            Step::Extend { at, .. } if lease.failed_round.is_none() => {
                // On the shared timer: rounds on the same grid instant share its one entry.
                let at = tokio::time::Instant::from_std(on_grid(at));
                tokio::select! {
                    biased;
                    _ = &mut *stop => return End::Stopped,
                    () = wait_on_grid(lock, at) => {}
                }
                continue;
            }
            // A retry, or an abort off the grid: an instant of this lock alone, on a timer of
            // its own, freed as soon as the scope ends (a shared entry would stay until the
            // instant). Moved back to the grid, retries that fail at once (a refused
            // connection) would run back to back.
            Step::Extend { at, .. } | Step::Abort { at, .. } => {
                tokio::select! {
                    biased;
                    _ = &mut *stop => return End::Stopped,
                    () = tokio::time::sleep_until(tokio::time::Instant::from_std(at)) => {}
                }
                continue;
            }
        };
        let deadline = tokio::time::Instant::from_std(by);
        let round_started = now;
        let outcome = tokio::select! {
            biased;
            _ = &mut *stop => return End::Stopped,
            outcome = tokio::time::timeout_at(deadline, lock.extend(policy.ttl)) => outcome,
        };
        match outcome {
            Ok(Ok(())) => {
                lease.expires_at = lock.expires_at();
                lease.extensions = lease.extensions.saturating_add(1);
                lease.failed_round = None;
                state.extended(lease.expires_at);
                state
                    .events
                    .extended(&state.resources, lease.extensions, lock.remaining());
            }
            Ok(Err(error)) => {
                state.events.emit(Event::ExtensionFailed {
                    resources: state.resources.to_vec(),
                    error: error.clone(),
                    remaining: lock.remaining(),
                });
                if error.is_lock_lost() {
                    // A majority said the keys are not ours, or the validity ran out.
                    state.abort(error);
                    return End::GaveUp;
                }
                lease.failed_round = Some(round_started);
            }
            Err(_) => {
                // The round outlived its deadline: nothing confirmed the lock in time. The
                // round was cut short, so there are no per-node errors to report.
                let error = unconfirmed(state, lease.expires_at);
                state.events.emit(Event::ExtensionFailed {
                    resources: state.resources.to_vec(),
                    error: error.clone(),
                    remaining: lock.remaining(),
                });
                state.abort(error);
                return End::GaveUp;
            }
        }
    }
}

/// `Unconfirmed` with the validity left, or `Expired` when none is.
fn unconfirmed(state: &State, expires_at: Instant) -> Error {
    let remaining = expires_at.saturating_duration_since(clock::now());
    state.lost(if remaining.is_zero() {
        LossReason::Expired
    } else {
        LossReason::Unconfirmed { remaining }
    })
}

/// When a round planned for `at` starts: a first round on the grid, a retry at `at`.
fn start_of(at: Instant, lease: &Lease) -> Instant {
    if lease.failed_round.is_some() {
        at
    } else {
        on_grid(at)
    }
}

/// The grid first extension rounds are aligned to.
const GRID: Duration = Duration::from_millis(25);

/// `at`, moved back to the previous multiple of [`GRID`] (counted from a process-wide
/// origin): rounds of many locks that fall due within the same 25 ms then wait on the same
/// instant of the shared timer, start together, and their requests go to each node in one
/// batched call. Never later than `at`, so the policy's deadlines hold.
fn on_grid(at: Instant) -> Instant {
    let origin = clock::origin();
    match at.checked_duration_since(origin) {
        Some(since) => {
            let grid = GRID.as_nanos();
            let back = since.as_nanos() % grid;
            at - Duration::from_nanos(u64::try_from(back).unwrap_or(0))
        }
        None => at,
    }
}

/// The Alarms A/B's one knob (temporary): `REDFENCE_TIMER=tokio` waits for grid instants on a
/// Tokio timer per task instead of the shared [`Alarms`](crate::alarms::Alarms).
static TOKIO_TIMER: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::env::var("REDFENCE_TIMER").is_ok_and(|v| v == "tokio"));

/// Waits for a grid instant, on the shared timer or (the A/B's other side) a timer of its own.
async fn wait_on_grid(lock: &Lock, at: tokio::time::Instant) {
    if *TOKIO_TIMER {
        tokio::time::sleep_until(at).await;
    } else {
        lock.alarms().at(at).await;
    }
}
