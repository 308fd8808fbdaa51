//! [`HoldTimer`]: how long a lock was held, recorded once, however its hold ends.

use std::time::Instant;

use super::labels::TypeLabel;

/// How a lock's hold ended: the `end` label of `redfence_lock_hold_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HoldEnd {
    /// Its owner released it (`Lock::release`, or the end of `using()`).
    Released,
    /// Ownership ended without its owner: an extension found it gone, `using()` aborted,
    /// or its validity ran out first.
    Lost,
    /// Its `Lock` was dropped without a release (it releases itself in the background).
    Dropped,
}

impl HoldEnd {
    /// The label value.
    #[cfg(feature = "metrics")]
    pub(crate) fn label(self) -> &'static str {
        match self {
            HoldEnd::Released => "released",
            HoldEnd::Lost => "lost",
            HoldEnd::Dropped => "dropped",
        }
    }
}

/// Started when a `Lock` is handed out; [`end`](Self::end) records the hold once and every
/// later call does nothing. Without the `metrics` feature it holds nothing.
#[derive(Debug)]
pub(crate) struct HoldTimer {
    /// The lock's type and when it was acquired, until the hold is recorded.
    #[cfg(feature = "metrics")]
    running: Option<(TypeLabel, Instant)>,
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
impl HoldTimer {
    /// A hold of a lock of type `label`, from now on.
    pub(crate) fn start(label: TypeLabel) -> Self {
        HoldTimer {
            #[cfg(feature = "metrics")]
            running: Some((label, crate::clock::now())),
        }
    }

    /// Ends the hold (the first call only) of a lock valid until `expires_at`: as `end`, or as
    /// [`HoldEnd::Lost`] at `expires_at` if the validity ran out first.
    pub(crate) fn end(&mut self, end: HoldEnd, expires_at: Instant) {
        #[cfg(feature = "metrics")]
        if let Some((label, since)) = self.running.take() {
            let now = crate::clock::now();
            let (end, until) = if now >= expires_at {
                (HoldEnd::Lost, expires_at)
            } else {
                (end, now)
            };
            record(&label, end, until.saturating_duration_since(since));
        }
    }
}

/// Records how long a lock of type `ty` was held and how the hold ended.
#[cfg(feature = "metrics")]
fn record(ty: &TypeLabel, end: HoldEnd, held: std::time::Duration) {
    metrics::histogram!("redfence_lock_hold_seconds", "type" => ty.value(), "end" => end.label())
        .record(held.as_secs_f64());
}
