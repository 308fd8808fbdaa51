//! Metrics through the `metrics` facade (feature `metrics`); without the feature, nothing.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `redfence_acquire_total` | counter | `result` | acquire calls by outcome: `acquired`, `contended`, `unreachable`, `no_validity`, `timeout`, `fencing`, `invalid`, `closed` |
//! | `redfence_acquire_duration_seconds` | histogram | `result` | how long acquire calls took, retries included |
//! | `redfence_extension_total` | counter | `result` | `using()` extension rounds: `extended`, `failed` |
//! | `redfence_lock_lost_total` | counter | `reason` | `using()` signals aborted: `expired`, `not_held`, `unconfirmed`, `renewal_limit` |
//! | `redfence_release_failed_total` | counter | — | background releases that could not reach a majority |
//!
//! No resource name is ever a label: resources are unbounded, labels must not be.

use std::time::Duration;

use crate::error::Error;

/// Records the outcome of one `acquire`, `try_acquire` or `using` acquisition.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn acquisition(result: Result<(), &Error>, took: Duration) {
    #[cfg(feature = "metrics")]
    {
        let result = result.map_or_else(Error::label, |()| "acquired");
        metrics::counter!("redfence_acquire_total", "result" => result).increment(1);
        metrics::histogram!("redfence_acquire_duration_seconds", "result" => result)
            .record(took.as_secs_f64());
    }
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

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    #[test]
    fn outcomes_and_events_are_counted_without_resource_labels() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let contended: Result<(), Error> = Err(Error::Contended {
                resources: vec!["invoice:4821".into()],
                denied: 3,
                nodes: 5,
                attempts: 1,
            });
            acquisition(contended.as_ref().map(|_| ()), Duration::from_millis(3));
            acquisition(contended.as_ref().map(|_| ()), Duration::from_millis(4));
            extension(true);
        });
        let snapshot = snapshotter.snapshot().into_vec();
        let find = |name: &str| {
            snapshot
                .iter()
                .find(|(key, ..)| key.key().name() == name)
                .map(|(key, _, _, value)| (key.key().labels().cloned().collect::<Vec<_>>(), value))
        };
        let (labels, value) = find("redfence_acquire_total").expect("acquire counter");
        assert_eq!(*value, DebugValue::Counter(2));
        assert_eq!(labels.len(), 1);
        assert_eq!(
            (labels[0].key(), labels[0].value()),
            ("result", "contended")
        );
        let (_, value) = find("redfence_extension_total").expect("extension counter");
        assert_eq!(*value, DebugValue::Counter(1));
        assert!(find("redfence_acquire_duration_seconds").is_some());
        assert!(
            snapshot
                .iter()
                .all(|(key, ..)| key.key().labels().all(|l| !l.value().contains("invoice"))),
            "a resource name became a label"
        );
    }
}
