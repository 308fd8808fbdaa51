//! The one clock every validity is measured on.

use std::time::Instant;

/// Now, on the monotonic clock as Tokio sees it, as a std [`Instant`].
///
/// In production this is `Instant::now()`. Under a paused Tokio clock (`start_paused` tests) it
/// follows the paused clock, so that validities, timers and the signal's decisions agree.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}
