//! `using()`: scoped locking with automatic extension, an abort signal and bounded renewal.
//!
//! [`Redlock::using`](crate::Redlock::using) acquires a lock, runs the caller's routine with a [`Signal`], and keeps
//! the lock alive meanwhile with the crate's lease keeper ([`crate::lease`]), which it stops,
//! joins and uses to release the lock when the routine ends. The [`Signal`] is a view of the
//! keeper's state.
//!
//! The keeper follows a [`Policy`], a pure function from the lease (acquisition, expiry,
//! extensions made, last failure) and the current instant to the next
//! [`Step`](crate::lease::Step): extend at some instant with a deadline, or abort at some
//! instant. Keeping the decisions pure lets them be tested without a clock; the keeper only
//! sleeps, calls [`Lock::extend`](crate::Lock::extend), and records the outcome.
//!
//! Timeline of one lease, with `threshold` the builder's `automatic_extension_threshold`:
//!
//! ```text
//!  acquired                      extend from here      confirm by     expires
//!     |------------------------------|--- retries ---|--------------|
//!                                    <---- lead ----><-- threshold -->
//! ```
//!
//! The first extension round starts `lead` before the remaining validity reaches the
//! threshold (`lead` is the threshold, or half the time above it for short TTLs), so that a
//! failed round can be retried quickly while more than the threshold is left. If no round
//! has succeeded when the remaining validity falls below the threshold, ownership can no
//! longer be guaranteed: the signal aborts, with `threshold` of validity still left for the
//! routine to stop, and extension stops for good.

mod policy;
mod scoped;
mod signal;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

pub(crate) use policy::Policy;
pub use signal::Signal;

use crate::config::Config;
use crate::error::Error;
use crate::guard::Finishing;
use crate::lease::{self, Lease, OnLoss, StopOnDrop};
use crate::lock::Lock;
use scoped::Scoped;
use signal::Ticket;

/// When a scope returns, relative to its lock's release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Release {
    /// Once every node answered the release (`using()`: the lock is free when it returns).
    Awaited,
    /// At once, the release going on in the background (`Redlock::close` waits for it): for
    /// a primitive's own lock whose caller must not wait on a slow node (a semaphore's line,
    /// given up with the permit the caller came for).
    InBackground,
}

/// A primitive's `using()` (a read-write lock's side, a semaphore's permit): refuses a `ttl`
/// the lease keeper cannot keep ([`Policy::checked`], before `acquire` is polled), then runs
/// `routine` in [`scope_with`] over the lock `acquire` gives, its release awaited.
pub(crate) async fn acquire_and_scope<T, E: From<Error>, Fut: Future<Output = Result<T, E>>>(
    config: &Config,
    tasks: &TaskTracker,
    ttl: Duration,
    acquire: impl Future<Output = Result<Lock, Error>>,
    routine: impl FnOnce(Signal) -> Fut,
) -> Result<T, E> {
    let policy = Policy::checked(config, ttl).map_err(|error| E::from(error.into()))?;
    let lock = acquire.await.map_err(E::from)?;
    scope_with(lock, policy, config, tasks, Release::Awaited, routine).await
}

/// Runs `routine` with a [`Signal`] while a lease keeper keeps `lock` alive; then stops the
/// keeper, which releases the lock, and returns the routine's result (or resumes its panic)
/// once the release is done, or at once ([`Release`]). Dropped midway, the keeper still
/// releases, and `Redlock::close` (through `tasks`) waits for it.
pub(crate) async fn scope_with<T, E: From<Error>, Fut: Future<Output = Result<T, E>>>(
    lock: Lock,
    policy: Policy,
    config: &Config,
    tasks: &TaskTracker,
    release: Release,
    routine: impl FnOnce(Signal) -> Fut,
) -> Result<T, E> {
    let resources: Arc<[String]> = Arc::from(lock.resources());
    let lease = Lease::new(lock.expires_at(), lock.ttl(), config.drift_factor);
    let ticket = Ticket {
        token: Arc::from(lock.token()),
        fence: lock.fence(),
        events: config.events.clone(),
    };
    let state = Arc::new(ticket.lease(Arc::clone(&resources), lease.expires_at));
    let scoped = Scoped {
        lock,
        ttl: policy.ttl,
        resources: Arc::clone(&resources),
        events: config.events.clone(),
    };
    // Dropped (when the routine is done, or when this future is dropped), it makes the
    // keeper stop extending and release the lock.
    let stop = StopOnDrop(Arc::clone(&state));
    let keeper = lease::keep(
        scoped,
        policy,
        lease,
        Arc::clone(&state),
        OnLoss::HoldUntilStopped,
    );
    let task = Finishing::spawn(tasks, keeper.instrument(tracing::Span::current()));

    let signal = Signal {
        state: state.into(),
    };
    let outcome = AssertUnwindSafe(async move { routine(signal).await })
        .catch_unwind()
        .await;

    drop(stop);
    // Not joined, the task is handed to `tasks` (see `Finishing`).
    if release == Release::Awaited
        && let Err(error) = task.join().await
    {
        // The keeper does not panic (hooks are guarded), so this is most likely a cancelled
        // runtime. The lock, dropped with the task, releases itself in the background if it
        // can.
        tracing::error!(?error, ?resources, "lock extension task failed");
    }
    match outcome {
        Ok(result) => result,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}
