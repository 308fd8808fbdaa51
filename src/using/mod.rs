//! `using()`: scoped locking with automatic extension, an abort signal and bounded renewal.
//!
//! [`Redlock::using`](crate::Redlock::using) acquires a lock, runs the caller's routine with a [`Signal`], and keeps
//! the lock alive meanwhile with a background *extension task*, which it stops, joins and
//! uses to release the lock when the routine ends.
//!
//! The extension task follows a [`Policy`], a pure function from the lease (acquisition,
//! expiry, extensions made, last failure) and the current instant to the next [`Step`]:
//! extend at some instant with a deadline, or abort at some instant. Keeping the decisions
//! pure lets them be tested without a clock; the task only sleeps, calls [`Lock::extend`](crate::Lock::extend),
//! and records the outcome.
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
mod signal;
mod task;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};

use futures::FutureExt;
use tokio::sync::{oneshot, watch};
use tokio_util::task::TaskTracker;
use tracing::Instrument;

pub(crate) use policy::Policy;
pub use signal::Signal;

use crate::config::Config;
use crate::error::Error;
use crate::guard::Finishing;
use crate::lock::Lock;
use policy::Lease;
use signal::State;

/// Runs `routine` with a [`Signal`] while an extension task keeps `lock` alive; then stops
/// the task, which releases the lock, and returns the routine's result (or resumes its panic).
/// Dropped midway, the task still releases, and `Redlock::close` (through `tasks`) waits for it.
pub(crate) async fn scope<T, E, F, Fut>(
    lock: Lock,
    policy: Policy,
    config: &Config,
    tasks: &TaskTracker,
    routine: F,
) -> Result<T, E>
where
    F: FnOnce(Signal) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: From<Error>,
{
    let resources: Arc<[String]> = Arc::from(lock.resources());
    let lease = Lease::new(&lock, config.drift_factor);
    let state = Arc::new(State {
        resources: Arc::clone(&resources),
        token: Arc::from(lock.token()),
        fence: lock.fence(),
        expires_at: watch::Sender::new(lock.expires_at()),
        error: OnceLock::new(),
        events: config.events.clone(),
    });
    // Dropping `stop` (when the routine is done, or when this future is dropped) makes the
    // task stop extending and release the lock.
    let (stop, stopped) = oneshot::channel::<()>();
    let task = Finishing::spawn(
        tasks,
        task::extension_task(lock, lease, Arc::clone(&state), policy, stopped)
            .instrument(tracing::Span::current()),
    );

    let signal = Signal { state };
    let outcome = AssertUnwindSafe(async move { routine(signal).await })
        .catch_unwind()
        .await;

    drop(stop);
    if let Err(error) = task.join().await {
        // The task does not panic (hooks are guarded), so this is most likely a cancelled
        // runtime. The lock, dropped with the task, releases itself in the background if it
        // can.
        tracing::error!(?error, ?resources, "lock extension task failed");
    }
    match outcome {
        Ok(result) => result,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}
