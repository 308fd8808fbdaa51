//! The one clock every validity and deadline is measured on.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// Now, on the monotonic clock as Tokio sees it, as a std [`Instant`].
///
/// In production this is `Instant::now()`. Under a paused Tokio clock (`start_paused` tests) it
/// follows the paused clock, so that validities, timers and the signal's decisions agree.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// How long ago `since` was, on the same clock as [`now`]. Use it instead of
/// `Instant::elapsed`, which reads the real clock even under a paused Tokio clock.
pub(crate) fn since(since: Instant) -> Duration {
    now().saturating_duration_since(since)
}

/// A process-wide origin on the same clock as [`now`] (the first time it is asked for): for
/// instants kept as a count since it (in an atomic) or aligned to a grid counted from it.
pub(crate) fn origin() -> Instant {
    static ORIGIN: LazyLock<Instant> = LazyLock::new(now);
    #[cfg(any(test, feature = "testing"))]
    if let Some(origin) = SIMULATED.get() {
        return origin;
    }
    *ORIGIN
}

/// The wall clock: the time since the Unix epoch (for what must order across processes, such
/// as a fair line's tickets). On a simulated thread, a fixed day plus the time since the run
/// started.
pub(crate) fn since_epoch() -> Duration {
    #[cfg(any(test, feature = "testing"))]
    if let Some(origin) = SIMULATED.get() {
        return Duration::from_secs(1_700_000_000) + since(origin);
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

#[cfg(any(test, feature = "testing"))]
thread_local! {
    /// A simulated thread's origin: when its run started, on its paused clock.
    static SIMULATED: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// Makes this thread's clock a simulated run's from now (its origin now, its wall clock
/// counted from it), or (`false`) the process's again. Each thread of a simulation runs its
/// own paused clock, so nothing may be counted from another thread's origin.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn simulate_thread(simulated: bool) {
    SIMULATED.set(simulated.then(now));
}
