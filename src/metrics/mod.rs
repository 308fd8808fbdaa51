//! Metrics through the `metrics` facade (feature `metrics`); without the feature, nothing.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `redfence_acquire_total` | counter | `result`, `type` | acquire calls by outcome: `acquired`, `contended`, `unreachable`, `overloaded`, `no_validity`, `timeout`, `fencing`, `invalid`, `closed` |
//! | `redfence_acquire_duration_seconds` | histogram | `result`, `type` | how long acquire calls took, retries included |
//! | `redfence_contended_total` | counter | `type` | attempts that found the resources held by another owner (every attempt of a call, retries included) |
//! | `redfence_acquire_retries` | histogram | `type` | retries per `acquire` or `using` call (attempts after the first) |
//! | `redfence_acquire_backoff_seconds` | histogram | `type` | time per `acquire` or `using` call spent waiting between attempts (in the in-process line included) |
//! | `redfence_lock_hold_seconds` | histogram | `type`, `end` | how long each lock was held, from acquisition until it ended: `released` (by its owner), `lost` (an extension found it gone, `using()` aborted, or its validity ran out first; then the hold ends at its expiry), `dropped` (its `Lock` dropped unreleased) |
//! | `redfence_fence_rejected_total` | counter | `type` | writes the fenced-write helpers refused as stale (`redfence-postgres`, or any helper that calls [`fence::record_rejected_write`](crate::fence::record_rejected_write)) |
//! | `redfence_extension_total` | counter | `result` | `using()` extension rounds: `extended`, `failed` |
//! | `redfence_lock_lost_total` | counter | `reason` | `using()` signals aborted: `expired`, `not_held`, `unconfirmed`, `renewal_limit` |
//! | `redfence_release_failed_total` | counter | — | background releases that could not reach a majority |
//!
//! No resource name is ever a label: resources are unbounded, labels must not be. The `type`
//! label is the resource's *type* under the builder's
//! [`resource_type`](crate::RedlockBuilder::resource_type) rule (default: the prefix before
//! the first `:`, `other` for a name without one), cut to 32 bytes, at most 100 distinct
//! types per process ([`ResourceType`](crate::ResourceType) has the rules). A lock over
//! several resources is of their common type, or `mixed`; a request rejected as invalid is
//! of type `other`. A `redfence-postgres` `FenceGuards` rejection is of the stale resource's
//! type, a `FencedUpdate` one of its table's name.

mod hold;
mod labels;
#[cfg(all(test, feature = "metrics"))]
mod tests;

use std::time::Duration;

use crate::error::Error;
use crate::quorum::Failed;

pub(crate) use hold::{HoldEnd, HoldTimer};
pub(crate) use labels::TypeLabel;

/// What one acquire call went through, for the metrics: filled in by the attempt loop.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Tries {
    /// Attempts made.
    pub(crate) attempts: u32,
    /// Attempts that found the resources held by another owner.
    pub(crate) contended: u32,
    /// Time slept between attempts.
    pub(crate) backoff: Duration,
}

impl Tries {
    /// Counts a failed attempt.
    pub(crate) fn failed(&mut self, failed: &Failed) {
        if let Failed::Contended { .. } = failed {
            self.contended = self.contended.saturating_add(1);
        }
    }
}

/// Records the outcome of one `acquire`, `try_acquire` or `using` acquisition of a lock of
/// type `ty`, and its contended attempts.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn acquisition(
    ty: &TypeLabel,
    result: Result<(), &Error>,
    took: Duration,
    tries: &Tries,
) {
    #[cfg(feature = "metrics")]
    {
        let result = result.map_or_else(Error::label, |()| "acquired");
        metrics::counter!("redfence_acquire_total", "result" => result, "type" => ty.value())
            .increment(1);
        metrics::histogram!("redfence_acquire_duration_seconds", "result" => result, "type" => ty.value())
            .record(took.as_secs_f64());
        if tries.contended > 0 {
            metrics::counter!("redfence_contended_total", "type" => ty.value())
                .increment(u64::from(tries.contended));
        }
    }
}

/// Records the retries of one `acquire` or `using` call (attempts after the first) and the
/// time it spent waiting between attempts.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn acquisition_retries(ty: &TypeLabel, retries: u32, waited: Duration) {
    #[cfg(feature = "metrics")]
    {
        metrics::histogram!("redfence_acquire_retries", "type" => ty.value())
            .record(f64::from(retries));
        metrics::histogram!("redfence_acquire_backoff_seconds", "type" => ty.value())
            .record(waited.as_secs_f64());
    }
}

/// Records a write a fenced-write helper refused as stale.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn fence_rejected(ty: &TypeLabel) {
    #[cfg(feature = "metrics")]
    metrics::counter!("redfence_fence_rejected_total", "type" => ty.value()).increment(1);
}

/// Records one `using()` extension round.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn extension(succeeded: bool) {
    #[cfg(feature = "metrics")]
    {
        let result = if succeeded { "extended" } else { "failed" };
        metrics::counter!("redfence_extension_total", "result" => result).increment(1);
    }
}

/// Records an aborted `using()` signal.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn lock_lost(error: &Error) {
    #[cfg(feature = "metrics")]
    {
        let reason = match error {
            Error::RenewalLimit { .. } => "renewal_limit",
            Error::LockLost { reason, .. } => {
                use crate::error::LossReason;
                match reason {
                    LossReason::Expired => "expired",
                    LossReason::NotHeld { .. } => "not_held",
                    LossReason::Unconfirmed { .. } => "unconfirmed",
                    _ => "other",
                }
            }
            _ => "other",
        };
        metrics::counter!("redfence_lock_lost_total", "reason" => reason).increment(1);
    }
}

/// Records a background release that reached no majority.
pub(crate) fn release_failed() {
    #[cfg(feature = "metrics")]
    metrics::counter!("redfence_release_failed_total").increment(1);
}
