//! `using()`: scoped locking with automatic extension, an abort signal and bounded renewal.
//!
//! [`Redlock::using`] acquires a lock, runs the caller's routine with a [`Signal`], and keeps
//! the lock alive meanwhile with a background *extension task*, which it stops, joins and
//! uses to release the lock when the routine ends.
//!
//! The extension task follows a [`Policy`], a pure function from the lease (acquisition,
//! expiry, extensions made, last failure) and the current instant to the next [`Step`]:
//! extend at some instant with a deadline, or abort at some instant. Keeping the decisions
//! pure lets them be tested without a clock; the task only sleeps, calls [`Lock::extend`],
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

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::sync::{oneshot, watch};

use crate::builder::Config;
use crate::error::{Error, InvalidInput, LossReason, RenewalLimit};
use crate::events::{Event, EventHook};
use crate::lock::Lock;
use crate::quorum;
use crate::redlock::Redlock;

/// The shortest pause between two extension rounds after a failed one.
const MIN_RETRY_INTERVAL: Duration = Duration::from_millis(1);

impl Redlock {
    /// Runs `routine` while holding a lock on `resources`: acquires it (with the configured
    /// retries), keeps it alive in the background while the routine runs, and releases it
    /// when the routine is done.
    ///
    /// The routine gets a [`Signal`] that says whether the lock is still held. It **aborts as
    /// soon as ownership can no longer be guaranteed**: when extension rounds failed and the
    /// remaining validity fell below `automatic_extension_threshold` (so that much time is
    /// left to stop cleanly), when a majority of nodes answered that the lock is no longer
    /// ours, when the validity ran out for any other reason (e.g. a starved runtime), or when
    /// a renewal bound was reached.
    ///
    /// # Extension
    ///
    /// Extension rounds start shortly before the remaining validity falls below
    /// `automatic_extension_threshold` (default 500 ms): up to a threshold earlier, and at
    /// most half-way through the time above it for short TTLs. A failed round is retried
    /// quickly while more than the threshold is left: retries start every
    /// `min(threshold / 5, node_timeout)`, or at once after a round that took longer (keep
    /// `node_timeout` well below the threshold so that several rounds fit). Each successful
    /// round re-extends the lock to the full `ttl` on a majority ([`Event::Extended`]); each
    /// failed one is reported as [`Event::ExtensionFailed`] with every node's error. After an
    /// abort the lock is no longer extended.
    ///
    /// # Bounded renewal
    ///
    /// With [`max_extensions`](crate::RedlockBuilder::max_extensions) or
    /// [`max_hold`](crate::RedlockBuilder::max_hold) set, extension stops once the bound is
    /// reached, and the signal aborts with [`Error::RenewalLimit`] when the next extension
    /// would have been needed: when the remaining validity falls below the threshold.
    ///
    /// `max_hold` is a hard bound on the keys' life: an extension is made only if it keeps
    /// the lock within `max_hold` of its acquisition, and a `ttl` above `max_hold` is refused
    /// ([`InvalidInput::TtlAboveMaxHold`]). So the signal aborts *before* `max_hold` has
    /// passed — up to one `ttl` before it, with the threshold left on the last lease — and
    /// never after. If the routine keeps going, the lock expires on its own by `max_hold`; it
    /// is still released at the end.
    ///
    /// # Cancellation model
    ///
    /// Cancellation is **cooperative**: the library never drops the routine. The routine
    /// decides when to look — [`Signal::check`] before each irreversible step, or
    /// `tokio::select!` on [`Signal::aborted`] to stop at once:
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redfence::{Error, Redlock};
    ///
    /// # async fn copy_next_chunk() -> Result<bool, Error> { Ok(false) }
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// redlock
    ///     .using(&["export:daily"], Duration::from_secs(10), |signal| async move {
    ///         loop {
    ///             tokio::select! {
    ///                 // Lost: stop here; the chunk in flight is dropped.
    ///                 err = signal.aborted() => return Err(err),
    ///                 more = copy_next_chunk() => if !more? { return Ok(()) },
    ///             }
    ///         }
    ///     })
    ///     .await
    /// # }
    /// # fn main() { let _ = run; }
    /// ```
    ///
    /// The lock is released when the routine returns `Ok` or `Err`, and when it panics (the
    /// lock is released, then the panic resumes). If the future returned by `using` is
    /// dropped (the caller cancelled it), the extension task stops and releases the lock in
    /// the background at once. No task, timer or connection of this call outlives it: when
    /// `using` returns, the extension task has ended and every node has answered the release
    /// or timed out.
    ///
    /// Even so, a lock is a lease, not a proof: send [`Signal::fence`] with every write to
    /// storage that rejects stale fences.
    ///
    /// # Errors
    ///
    /// The routine's own result or error is returned unchanged. A failed release does not
    /// hide it: it is reported as [`Event::ReleaseFailed`] (and logged), and the keys expire
    /// at the end of their TTL. Errors of `using` itself go through `E::from`:
    ///
    /// - [`Error::InvalidInput`] for anything [`acquire`](Self::acquire) rejects, and for a
    ///   `ttl` not above `automatic_extension_threshold` plus its drift allowance
    ///   ([`InvalidInput::TtlNotAboveThreshold`]), or above `max_hold`
    ///   ([`InvalidInput::TtlAboveMaxHold`]); nothing is sent and the routine never runs.
    /// - Any error of [`acquire`](Self::acquire) (`Contended`, `QuorumUnreachable`,
    ///   `AcquireTimeout`, `Fencing`, ...); the routine never runs.
    ///
    /// # Panics
    ///
    /// Resumes the routine's panic, after releasing the lock. Panics when called outside a
    /// Tokio runtime (the extension task is spawned on it).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redfence::{Error, Redlock};
    ///
    /// # struct Invoice;
    /// # async fn load_invoice(_: u32) -> Result<Invoice, Error> { Ok(Invoice) }
    /// # async fn post_to_ledger(_: &Invoice, _: Option<u64>) -> Result<u64, Error> { Ok(1) }
    /// # async fn run() -> Result<(), Error> {
    /// let redlock = Redlock::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .build()?;
    ///
    /// let entry = redlock
    ///     .using(&["invoice:4821"], Duration::from_secs(5), |signal| async move {
    ///         let invoice = load_invoice(4821).await?;
    ///         signal.check()?; // stop before the irreversible step if ownership is gone
    ///         post_to_ledger(&invoice, signal.fence()).await
    ///     })
    ///     .await?;
    /// # let _ = entry;
    /// # Ok(())
    /// # }
    /// # fn main() { let _ = run; }
    /// ```
    pub async fn using<T, E, F, Fut>(
        &self,
        resources: &[impl AsRef<str>],
        ttl: Duration,
        routine: F,
    ) -> Result<T, E>
    where
        F: FnOnce(Signal) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        let config = &self.shared.config;
        let target = self.target(resources, ttl)?;
        let policy = Policy::new(config, target.ttl).map_err(Error::from)?;
        let started = clock_now();
        let acquired = self.acquire_target(&target).await;
        crate::metrics::acquisition(&acquired, started.elapsed());
        let lock = acquired?;
        let lease = Lease::new(&lock, config.drift_factor);
        let state = Arc::new(State {
            resources: Arc::clone(&target.resources),
            token: Arc::from(lock.token()),
            fence: lock.fence(),
            expires_at: watch::Sender::new(lock.expires_at()),
            error: OnceLock::new(),
            events: config.events.clone(),
        });
        // Dropping `stop` (when the routine is done, or when this future is dropped) makes the
        // task stop extending and release the lock.
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(extension_task(
            lock,
            lease,
            Arc::clone(&state),
            policy,
            stopped,
        ));

        let signal = Signal { state };
        let outcome = AssertUnwindSafe(async move { routine(signal).await })
            .catch_unwind()
            .await;

        drop(stop);
        if let Err(error) = task.await {
            // The task does not panic (hooks are guarded); this is a cancelled runtime. The
            // lock, dropped with the task, releases itself in the background if it can.
            tracing::error!(?error, resources = ?target.resources, "lock extension task failed");
        }
        match outcome {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// Tells the routine run by [`Redlock::using`] whether it still owns its lock.
///
/// Cheap to clone (an `Arc` inside), `Send + Sync`: hand clones to sub-tasks. Once aborted it
/// stays aborted, and [`error`](Signal::error) says why:
///
/// - [`Error::LockLost`] with [`LossReason::Unconfirmed`]: extensions kept failing (nodes
///   unreachable) and less than `automatic_extension_threshold` of validity is left;
/// - [`Error::LockLost`] with [`LossReason::NotHeld`]: a majority answered that the keys no
///   longer hold our token;
/// - [`Error::LockLost`] with [`LossReason::Expired`]: the validity ran out (e.g. the process
///   was starved), noticed by the signal itself even if the extension task could not run;
/// - [`Error::RenewalLimit`]: `max_extensions` or `max_hold` was reached;
/// - [`Error::LockLost`] with [`LossReason::Released`]: the `using` scope has ended (seen only
///   through a clone kept after it).
///
/// ```no_run
/// use std::time::Duration;
/// use redfence::{Error, Redlock};
///
/// # async fn step(_: u32, _: Option<u64>) -> Result<(), Error> { Ok(()) }
/// # async fn run(redlock: Redlock) -> Result<(), Error> {
/// redlock
///     .using(&["report"], Duration::from_secs(5), |signal| async move {
///         for part in 0..10 {
///             signal.check()?; // Err(LockLost or RenewalLimit) once ownership is gone
///             step(part, signal.fence()).await?;
///         }
///         println!("done with {:?} of validity to spare", signal.remaining());
///         Ok(())
///     })
///     .await
/// # }
/// # fn main() { let _ = run; }
/// ```
#[derive(Clone)]
pub struct Signal {
    state: Arc<State>,
}

impl Signal {
    /// Whether ownership is gone (or can no longer be guaranteed). Never goes back to `false`.
    pub fn is_aborted(&self) -> bool {
        self.state.error().is_some()
    }

    /// Resolves once the signal is aborted, at once if it already is, with the reason (the
    /// same as [`error`](Signal::error)). For `tokio::select!`; cancel-safe.
    ///
    /// ```no_run
    /// # async fn run(signal: redfence::Signal) -> Result<(), redfence::Error> {
    /// # async fn long_computation() -> Result<(), redfence::Error> { Ok(()) }
    /// tokio::select! {
    ///     err = signal.aborted() => Err(err), // the computation is dropped
    ///     done = long_computation() => done,
    /// }
    /// # }
    /// # fn main() { let _ = run; }
    /// ```
    pub async fn aborted(&self) -> Error {
        let mut changes = self.state.expires_at.subscribe();
        loop {
            // Mark the current value seen *before* looking at the error: an abort that
            // happens after the look then shows up as a change.
            let expires_at = *changes.borrow_and_update();
            if let Some(error) = self.state.error() {
                return error.clone();
            }
            let expiry = tokio::time::sleep_until(tokio::time::Instant::from_std(expires_at));
            tokio::pin!(expiry);
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        // Unreachable (the sender lives in the shared state); never spin.
                        expiry.await;
                    }
                }
                () = &mut expiry => {}
            }
        }
    }

    /// `Ok(())` while the lock is held, the reason (as [`error`](Signal::error)) once the
    /// signal is aborted. Call it before every step that must not run without the lock.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] or [`Error::RenewalLimit`], once the signal is aborted.
    pub fn check(&self) -> Result<(), Error> {
        match self.state.error() {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }

    /// Why the signal aborted: [`Error::LockLost`] (with a [`LossReason`]) or
    /// [`Error::RenewalLimit`]; `None` while the lock is held.
    pub fn error(&self) -> Option<Error> {
        self.state.error().cloned()
    }

    /// How much validity the lock has left (zero once expired). Grows back after every
    /// extension.
    pub fn remaining(&self) -> Duration {
        self.state
            .expires_at()
            .saturating_duration_since(clock_now())
    }

    /// The fencing token of this acquisition, if a counter is configured. Send it with every
    /// write; the storage must reject a fence that is not greater than the last it accepted.
    pub fn fence(&self) -> Option<u64> {
        self.state.fence
    }

    /// The resources the lock holds, as given (without the key prefix).
    pub fn resources(&self) -> &[String] {
        &self.state.resources
    }

    /// The lock's owner token: the value stored at every key.
    pub fn token(&self) -> &str {
        &self.state.token
    }
}

impl fmt::Debug for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signal")
            .field("resources", &self.state.resources)
            .field("fence", &self.state.fence)
            .field("remaining", &self.remaining())
            .field("error", &self.state.error.get())
            .finish()
    }
}

/// What a [`Signal`] and its extension task share.
struct State {
    resources: Arc<[String]>,
    token: Arc<str>,
    fence: Option<u64>,
    /// The lock's validity end, updated by every extension; a change (or a forced
    /// notification) wakes [`Signal::aborted`].
    expires_at: watch::Sender<Instant>,
    /// Set once, by the first abort.
    error: OnceLock<Error>,
    events: EventHook,
}

impl State {
    fn expires_at(&self) -> Instant {
        *self.expires_at.borrow()
    }

    /// The abort reason, if any; aborts with `Expired` when the validity has run out, so that
    /// a starved extension task cannot leave the signal unaborted.
    fn error(&self) -> Option<&Error> {
        if let Some(error) = self.error.get() {
            return Some(error);
        }
        if clock_now() >= self.expires_at() {
            return Some(self.abort(self.lost(LossReason::Expired)));
        }
        None
    }

    fn lost(&self, reason: LossReason) -> Error {
        Error::LockLost {
            resources: self.resources.to_vec(),
            reason,
        }
    }

    /// Aborts the signal, unless it already is: reports the first abort and wakes waiters.
    fn abort(&self, error: Error) -> &Error {
        self.set(error, true)
    }

    /// Marks the scope as over, without an event: later looks at the signal see `Released`.
    fn finish(&self) {
        self.set(self.lost(LossReason::Released), false);
    }

    fn set(&self, error: Error, report: bool) -> &Error {
        let mut first = false;
        let stored = self.error.get_or_init(|| {
            first = true;
            error
        });
        if first {
            if report {
                self.events.emit(Event::Aborted {
                    resources: self.resources.to_vec(),
                    error: stored.clone(),
                });
            }
            self.expires_at.send_modify(|_| {});
        }
        stored
    }

    fn extended(&self, expires_at: Instant) {
        self.expires_at.send_replace(expires_at);
    }
}

/// How the extension task schedules its rounds. Pure: every decision is a function of the
/// lease and an instant, so it is tested without a clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Policy {
    /// The TTL every extension renews the lock to.
    ttl: Duration,
    /// Abort when less validity than this is left and no extension has confirmed the lock.
    threshold: Duration,
    /// How long before the threshold extension rounds start.
    lead: Duration,
    /// The pause after a failed round before the next one.
    retry_interval: Duration,
    max_extensions: Option<u32>,
    max_hold: Option<Duration>,
}

/// Where a lock stands, as the extension task tracks it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Lease {
    /// The start of the winning acquire round.
    acquired_at: Instant,
    /// The end of the validity.
    expires_at: Instant,
    /// Successful extensions so far.
    extensions: u32,
    /// When the last failed round started, if none has succeeded since.
    failed_round: Option<Instant>,
}

/// What the extension task does next.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Step {
    /// At `at`, make an extension round that must succeed by `by`.
    Extend {
        /// When to start the round.
        at: Instant,
        /// The round's deadline: past it, ownership can no longer be guaranteed.
        by: Instant,
    },
    /// At `at`, abort the signal and stop extending.
    Abort {
        /// When to abort.
        at: Instant,
        /// Why.
        cause: Cause,
    },
}

/// Why the extension task gives up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Cause {
    /// The validity ran out.
    Expired,
    /// Rounds failed until less than the threshold was left.
    Unconfirmed,
    /// A renewal bound was reached.
    Limit(RenewalLimit),
}

impl Policy {
    /// The policy for a `using()` lock of `ttl` (already validated by `Redlock::target`).
    pub(crate) fn new(config: &Config, ttl: Duration) -> Result<Policy, InvalidInput> {
        let threshold = config.extension_threshold;
        let drift = quorum::drift(ttl, config.drift_factor);
        // The most validity a lock of this TTL can have; it must leave room above the
        // threshold, or the signal would abort as soon as the routine starts.
        let best = ttl.saturating_sub(drift);
        if best <= threshold {
            return Err(InvalidInput::TtlNotAboveThreshold {
                ttl,
                threshold,
                drift,
            });
        }
        // A first lease longer than max_hold would outlive the bound before any extension.
        if let Some(max_hold) = config.max_hold
            && ttl > max_hold
        {
            return Err(InvalidInput::TtlAboveMaxHold { ttl, max_hold });
        }
        Ok(Policy {
            ttl,
            threshold,
            // At most half the time above the threshold, so that short TTLs are not
            // extended back to back.
            lead: threshold.min((best - threshold) / 2),
            retry_interval: (threshold / 5)
                .min(config.node_timeout)
                .max(MIN_RETRY_INTERVAL),
            max_extensions: config.max_extensions,
            max_hold: config.max_hold,
        })
    }

    /// The next step for `lease`, seen at `now`. A step whose instant is not after `now` is
    /// due; asking again after sleeping until it returns it as due.
    pub(crate) fn step(&self, now: Instant, lease: &Lease) -> Step {
        let expires_at = lease.expires_at;
        if now >= expires_at {
            return Step::Abort {
                at: now,
                cause: Cause::Expired,
            };
        }
        // Without an extension confirmed by here, ownership is no longer guaranteed.
        let confirm_by = expires_at.checked_sub(self.threshold).unwrap_or(now);
        let give_up_at = confirm_by.max(now);
        if let Some(max) = self.max_extensions
            && lease.extensions >= max
        {
            return Step::Abort {
                at: give_up_at,
                cause: Cause::Limit(RenewalLimit::Extensions(max)),
            };
        }
        let at = match lease.failed_round {
            None => confirm_by.checked_sub(self.lead).unwrap_or(confirm_by),
            // Retries start `retry_interval` apart: a round that already took that long (a
            // node timed out) is followed at once.
            Some(started) => started.checked_add(self.retry_interval).unwrap_or(started),
        }
        .max(now);
        if let Some(max) = self.max_hold
            && let Some(hold_ends) = lease.acquired_at.checked_add(max)
            && at.checked_add(self.ttl).is_none_or(|ends| ends > hold_ends)
        {
            return Step::Abort {
                at: give_up_at,
                cause: Cause::Limit(RenewalLimit::Hold(max)),
            };
        }
        match lease.failed_round {
            // Rounds failed and no retry can start before the threshold: give up there.
            Some(_) if at >= confirm_by => Step::Abort {
                at: give_up_at,
                cause: Cause::Unconfirmed,
            },
            // Woken too late (a starved runtime) with nothing failed yet: one last round,
            // for as long as the validity lasts.
            None if at >= confirm_by => Step::Extend { at, by: expires_at },
            _ => Step::Extend { at, by: confirm_by },
        }
    }
}

impl Lease {
    fn new(lock: &Lock, drift_factor: f64) -> Self {
        let expires_at = lock.expires_at();
        // `expires_at` is the start of the winning round plus `ttl - drift`.
        let valid_for = lock
            .ttl()
            .saturating_sub(quorum::drift(lock.ttl(), drift_factor));
        Lease {
            acquired_at: expires_at.checked_sub(valid_for).unwrap_or(expires_at),
            expires_at,
            extensions: 0,
            failed_round: None,
        }
    }
}

/// The current instant on Tokio's clock, which is the monotonic clock unless a test paused
/// it; the timers this module sleeps on follow the same clock, so decisions and wake-ups
/// always agree.
fn clock_now() -> Instant {
    crate::clock::now()
}

/// How the extension loop ended.
enum End {
    /// `using` is done with the lock.
    Stopped,
    /// The signal aborted: extension is over, the lock waits for the end of the scope.
    GaveUp,
}

/// Keeps the lock alive until told to stop (or until it gives up), then releases it.
async fn extension_task(
    mut lock: Lock,
    lease: Lease,
    state: Arc<State>,
    policy: Policy,
    mut stop: oneshot::Receiver<()>,
) {
    // However this task ends (even aborted with its runtime), the signal stops saying "held".
    let _finish = FinishOnDrop(Arc::clone(&state));
    if let End::GaveUp = extend_until_stopped(&mut lock, lease, &state, &policy, &mut stop).await {
        // Whether `using` sent nothing and dropped the sender, or was dropped: both end it.
        let _ = stop.await;
    }
    state.finish();
    let resources = state.resources.to_vec();
    if let Err(error) = lock.release_all().await {
        state.events.emit(Event::ReleaseFailed { resources, error });
    }
}

/// Marks the scope as over when dropped.
struct FinishOnDrop(Arc<State>);

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        self.0.finish();
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
        let now = clock_now();
        let by = match policy.step(now, &lease) {
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
            Step::Extend { at, by } if at <= now => by,
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
                state.events.emit(Event::Extended {
                    resources: state.resources.to_vec(),
                    extensions: lease.extensions,
                    validity: lock.remaining(),
                });
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
    let remaining = expires_at.saturating_duration_since(clock_now());
    state.lost(if remaining.is_zero() {
        LossReason::Expired
    } else {
        LossReason::Unconfirmed { remaining }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    const MS: Duration = Duration::from_millis(1);

    fn config(threshold: Duration) -> Config {
        Config {
            extension_threshold: threshold,
            ..Config::default()
        }
    }

    fn policy(ttl: Duration) -> Policy {
        Policy::new(&config(500 * MS), ttl).expect("valid ttl")
    }

    fn lease(t0: Instant, valid_for: Duration) -> Lease {
        Lease {
            acquired_at: t0,
            expires_at: t0 + valid_for,
            extensions: 0,
            failed_round: None,
        }
    }

    #[test]
    fn ttl_must_leave_room_above_the_threshold() {
        // ttl - (ttl * 0.01 + 2 ms) > 500 ms needs ttl > 507.07 ms.
        let c = config(500 * MS);
        for ttl in [100 * MS, 500 * MS, 502 * MS, 507 * MS] {
            let e = Policy::new(&c, ttl).expect_err("too short");
            assert!(
                matches!(e, InvalidInput::TtlNotAboveThreshold { ttl: t, threshold, .. }
                    if t == ttl && threshold == 500 * MS),
                "{e:?}"
            );
        }
        assert!(Policy::new(&c, 508 * MS).is_ok());
    }

    #[test]
    fn a_first_lease_longer_than_max_hold_is_refused() {
        let c = Config {
            max_hold: Some(200 * MS),
            ..config(100 * MS)
        };
        let e = Policy::new(&c, Duration::from_secs(3)).expect_err("ttl above max_hold");
        assert_eq!(
            e,
            InvalidInput::TtlAboveMaxHold {
                ttl: Duration::from_secs(3),
                max_hold: 200 * MS
            }
        );
        assert!(Policy::new(&c, 200 * MS).is_ok());
    }

    #[test]
    fn lead_and_retry_interval() {
        // Long TTL: the lead is the whole threshold; retries every min(threshold/5, node_timeout).
        let p = policy(Duration::from_secs(5));
        assert_eq!(p.lead, 500 * MS);
        assert_eq!(p.retry_interval, 50 * MS); // node_timeout 50 ms < 100 ms
        // Short TTL: half the room above the threshold (1 s - 12 ms drift - 500 ms) / 2.
        assert_eq!(policy(Duration::from_secs(1)).lead, 244 * MS);
        let p = Policy::new(
            &Config {
                node_timeout: Duration::from_secs(1),
                ..config(200 * MS)
            },
            Duration::from_secs(5),
        )
        .expect("valid");
        assert_eq!(p.retry_interval, 40 * MS);
    }

    #[test]
    fn first_round_starts_a_lead_before_the_threshold() {
        let p = policy(Duration::from_secs(5));
        let t0 = Instant::now();
        let l = lease(t0, 4_900 * MS);
        let step = p.step(t0, &l);
        assert_eq!(
            step,
            Step::Extend {
                at: t0 + 3_900 * MS,
                by: t0 + 4_400 * MS
            }
        );
        // Asked again at the planned instant, the same round is due now.
        assert_eq!(
            p.step(t0 + 3_900 * MS, &l),
            Step::Extend {
                at: t0 + 3_900 * MS,
                by: t0 + 4_400 * MS
            }
        );
    }

    /// Runs the policy over simulated time; `round(k, start)` says how the k-th round goes:
    /// `Some(true)` succeeds, `Some(false)` fails, `None` outlives its deadline. Returns the
    /// rounds' start instants and the final abort (instant, cause, lease).
    fn simulate(
        p: &Policy,
        t0: Instant,
        valid_for: Duration,
        round_time: Duration,
        mut round: impl FnMut(usize, Instant) -> Option<bool>,
    ) -> (Vec<Instant>, Instant, Cause, Lease) {
        let mut l = lease(t0, valid_for);
        let mut now = t0;
        let mut starts = Vec::new();
        for _ in 0..10_000 {
            match p.step(now, &l) {
                Step::Abort { at, cause } if at <= now => return (starts, now, cause, l),
                Step::Extend { at, by } if at <= now => {
                    starts.push(now);
                    let k = starts.len() - 1;
                    match round(k, now) {
                        Some(true) if now + round_time <= by => {
                            // Validity counts from the round's start, as in `Lock::extend`.
                            l.expires_at = now + p.ttl - quorum::drift(p.ttl, 0.01);
                            l.extensions += 1;
                            l.failed_round = None;
                            now += round_time;
                        }
                        Some(false) if now + round_time <= by => {
                            l.failed_round = Some(now);
                            now += round_time;
                        }
                        _ => return (starts, by, Cause::Unconfirmed, l),
                    }
                }
                Step::Extend { at, .. } | Step::Abort { at, .. } => {
                    assert!(at > now, "a step in the past must be due");
                    now = at;
                }
            }
        }
        panic!("the policy never gave up");
    }

    #[test]
    fn failing_rounds_are_retried_then_abort_exactly_at_the_threshold() {
        let p = policy(Duration::from_secs(5));
        let t0 = Instant::now();
        let valid = 4_900 * MS;
        // Every round fails quickly (nodes refuse connections).
        let (starts, at, cause, _) = simulate(&p, t0, valid, 2 * MS, |_, _| Some(false));
        assert_eq!(cause, Cause::Unconfirmed);
        assert_eq!(
            at,
            t0 + valid - p.threshold,
            "aborts as the threshold is crossed"
        );
        assert_eq!(starts[0], t0 + valid - p.threshold - p.lead);
        // Retried every retry_interval (start to start), all before the threshold.
        for pair in starts.windows(2) {
            assert_eq!(pair[1] - pair[0], p.retry_interval);
        }
        assert_eq!(starts.len(), 10);
        assert!(starts.iter().all(|s| *s < at));

        // Rounds that time out at the node timeout (50 ms = the interval): as many rounds.
        let (starts, at, cause, _) = simulate(&p, t0, valid, 50 * MS, |_, _| Some(false));
        assert_eq!((at, cause), (t0 + valid - p.threshold, Cause::Unconfirmed));
        assert_eq!(starts.len(), 10);

        // Rounds slower than the interval are followed at once; the last one is cut short.
        let (starts, at, cause, _) = simulate(&p, t0, valid, 120 * MS, |_, _| Some(false));
        assert_eq!((at, cause), (t0 + valid - p.threshold, Cause::Unconfirmed));
        for pair in starts.windows(2) {
            assert_eq!(pair[1] - pair[0], 120 * MS);
        }
        assert_eq!(starts.len(), 5);
    }

    #[test]
    fn a_success_after_failures_resumes_the_normal_schedule() {
        let p = policy(Duration::from_secs(5));
        let t0 = Instant::now();
        // Rounds 0-2 fail, 3 succeeds, then the nodes are gone for good.
        let (starts, at, cause, l) = simulate(&p, t0, 4_900 * MS, 2 * MS, |k, _| Some(k == 3));
        assert_eq!(cause, Cause::Unconfirmed);
        assert_eq!(l.extensions, 1);
        // The round after the success waits for the new lease's extension point.
        let renewed = starts[3] + p.ttl - quorum::drift(p.ttl, 0.01);
        assert_eq!(starts[4], renewed - p.threshold - p.lead);
        assert_eq!(at, renewed - p.threshold);
    }

    #[test]
    fn healthy_rounds_keep_the_lock_forever_without_a_limit() {
        let p = policy(Duration::from_secs(1));
        let t0 = Instant::now();
        let mut l = lease(t0, 988 * MS);
        let mut now = t0;
        for _ in 0..1_000 {
            match p.step(now, &l) {
                Step::Extend { at, by } => {
                    assert!(by - at >= p.lead, "no retry window");
                    now = at + 5 * MS;
                    assert!(l.expires_at - now > p.threshold);
                    l.expires_at = at + 988 * MS;
                    l.extensions += 1;
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(now - t0 > Duration::from_secs(200));
    }

    #[test]
    fn max_extensions_aborts_when_the_next_extension_is_needed() {
        let p = Policy {
            max_extensions: Some(2),
            ..policy(Duration::from_secs(1))
        };
        let t0 = Instant::now();
        let (starts, at, cause, l) = simulate(&p, t0, 988 * MS, 3 * MS, |_, _| Some(true));
        assert_eq!(starts.len(), 2);
        assert_eq!(l.extensions, 2);
        assert_eq!(cause, Cause::Limit(RenewalLimit::Extensions(2)));
        assert_eq!(at, l.expires_at - p.threshold);
        // Zero: never extended, aborted at the first threshold.
        let p = Policy {
            max_extensions: Some(0),
            ..p
        };
        let (starts, at, cause, _) = simulate(&p, t0, 988 * MS, 3 * MS, |_, _| Some(true));
        assert!(starts.is_empty());
        assert_eq!(cause, Cause::Limit(RenewalLimit::Extensions(0)));
        assert_eq!(at, t0 + 488 * MS);
    }

    #[test]
    fn max_hold_bounds_the_life_of_the_lock() {
        let max = Duration::from_millis(2_500);
        let p = Policy {
            max_hold: Some(max),
            ..policy(Duration::from_secs(1))
        };
        let t0 = Instant::now();
        let (starts, at, cause, l) = simulate(&p, t0, 988 * MS, 3 * MS, |_, _| Some(true));
        assert_eq!(cause, Cause::Limit(RenewalLimit::Hold(max)));
        assert!(!starts.is_empty());
        // No extension lets the keys outlive max_hold; the signal aborts a threshold early.
        assert!(starts.iter().all(|s| *s + p.ttl <= t0 + max));
        assert!(l.expires_at <= t0 + max);
        assert_eq!(at, l.expires_at - p.threshold);
        // A max_hold that overflows an Instant is no limit.
        let p = Policy {
            max_hold: Some(Duration::MAX),
            ..p
        };
        let l = lease(t0, 988 * MS);
        assert!(matches!(p.step(t0, &l), Step::Extend { .. }));
    }

    #[test]
    fn a_late_wake_up_gets_one_last_round_then_gives_up() {
        let p = policy(Duration::from_secs(5));
        let t0 = Instant::now();
        let mut l = lease(t0, 4_900 * MS);
        // Starved past the threshold, nothing failed yet: one round, until the expiry.
        let late = t0 + 4_700 * MS;
        assert_eq!(
            p.step(late, &l),
            Step::Extend {
                at: late,
                by: l.expires_at
            }
        );
        // It failed: abort now.
        l.failed_round = Some(late);
        assert_eq!(
            p.step(late + 10 * MS, &l),
            Step::Abort {
                at: late + 10 * MS,
                cause: Cause::Unconfirmed
            }
        );
        // Past the expiry: expired, whatever else.
        assert_eq!(
            p.step(l.expires_at, &l),
            Step::Abort {
                at: l.expires_at,
                cause: Cause::Expired
            }
        );
    }

    fn state(valid_for: Duration, events: EventHook) -> Arc<State> {
        Arc::new(State {
            resources: Arc::from(vec!["r".to_string()]),
            token: Arc::from("token"),
            fence: Some(7),
            expires_at: watch::Sender::new(clock_now() + valid_for),
            error: OnceLock::new(),
            events,
        })
    }

    fn recorder() -> (EventHook, Arc<Mutex<Vec<Event>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let hook = EventHook::new(move |e: &Event| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.clone());
            }
        });
        (hook, seen)
    }

    fn aborted_events(seen: &Mutex<Vec<Event>>) -> usize {
        seen.lock()
            .map(|v| {
                v.iter()
                    .filter(|e| matches!(e, Event::Aborted { .. }))
                    .count()
            })
            .unwrap_or(0)
    }

    #[tokio::test(start_paused = true)]
    async fn aborted_resolves_on_abort_once_and_for_all() {
        let (hook, seen) = recorder();
        let s = state(Duration::from_secs(60), hook);
        let signal = Signal {
            state: Arc::clone(&s),
        };
        assert!(!signal.is_aborted());
        assert!(signal.check().is_ok());
        assert_eq!(signal.fence(), Some(7));
        assert_eq!(signal.token(), "token");
        assert_eq!(signal.remaining(), Duration::from_secs(60));

        let waiter = tokio::spawn({
            let signal = signal.clone();
            async move { signal.aborted().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        let started = tokio::time::Instant::now();
        s.abort(Error::RenewalLimit {
            resources: vec!["r".into()],
            limit: RenewalLimit::Extensions(3),
        });
        let err = waiter.await.expect("waiter");
        assert_eq!(started.elapsed(), Duration::ZERO, "woken without waiting");
        assert!(matches!(err, Error::RenewalLimit { .. }), "{err:?}");
        // A second abort changes nothing and reports nothing.
        s.abort(s.lost(LossReason::Expired));
        assert!(matches!(signal.check(), Err(Error::RenewalLimit { .. })));
        assert!(matches!(signal.aborted().await, Error::RenewalLimit { .. }));
        assert_eq!(aborted_events(&seen), 1);
        // The end of the scope keeps the first reason.
        s.finish();
        assert!(matches!(signal.error(), Some(Error::RenewalLimit { .. })));
    }

    #[tokio::test(start_paused = true)]
    async fn the_signal_aborts_at_expiry_on_its_own_and_follows_extensions() {
        let (hook, seen) = recorder();
        let s = state(Duration::from_secs(5), hook);
        let signal = Signal {
            state: Arc::clone(&s),
        };
        let start = tokio::time::Instant::now();
        let waiter = tokio::spawn({
            let signal = signal.clone();
            async move { signal.aborted().await }
        });
        // An extension at 2 s moves the expiry from 5 s to 12 s.
        tokio::time::sleep(Duration::from_secs(2)).await;
        s.extended(clock_now() + Duration::from_secs(10));
        assert_eq!(signal.remaining(), Duration::from_secs(10));
        let err = waiter.await.expect("waiter");
        assert_eq!(start.elapsed(), Duration::from_secs(12));
        assert!(
            matches!(
                err,
                Error::LockLost {
                    reason: LossReason::Expired,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(signal.is_aborted());
        assert_eq!(signal.remaining(), Duration::ZERO);
        assert_eq!(aborted_events(&seen), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_kept_after_its_scope_reports_the_release_without_an_event() {
        let (hook, seen) = recorder();
        let s = state(Duration::from_secs(5), hook);
        let signal = Signal {
            state: Arc::clone(&s),
        };
        s.finish();
        assert!(matches!(
            signal.aborted().await,
            Error::LockLost {
                reason: LossReason::Released,
                ..
            }
        ));
        assert_eq!(aborted_events(&seen), 0);
    }

    #[test]
    fn signals_are_send_sync_and_static() {
        fn check<T: Send + Sync + Clone + 'static>() {}
        check::<Signal>();
    }
}
