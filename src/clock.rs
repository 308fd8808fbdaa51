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
    *ORIGIN
}
