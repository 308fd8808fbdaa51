use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use super::labels::Labels;
use super::*;
use crate::resource_type::ResourceType;

/// Label pairs, sorted.
type Labelled = Vec<(String, String)>;
/// One recorded metric: its labels and its value.
type Recorded = (Labelled, DebugValue);

/// Every metric recorded while `f` ran, by name.
fn recorded(f: impl FnOnce()) -> Vec<(String, Recorded)> {
    let recorder = DebuggingRecorder::new();
    let snapshotter: Snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, f);
    let snapshot = snapshotter.snapshot().into_vec();
    let all: Vec<(String, Recorded)> = snapshot
        .into_iter()
        .map(|(key, _, _, value)| {
            let mut labels: Vec<(String, String)> = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            (key.key().name().to_owned(), (labels, value))
        })
        .collect();
    assert!(
        all.iter()
            .all(|(_, (labels, _))| labels.iter().all(|(_, v)| !v.contains("4821"))),
        "a resource name became a label: {all:?}"
    );
    all
}

fn find<'a>(all: &'a [(String, Recorded)], name: &str) -> Vec<&'a Recorded> {
    all.iter()
        .filter(|(n, _)| n == name)
        .map(|(_, recorded)| recorded)
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut labels: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    labels.sort();
    labels
}

fn invoice() -> TypeLabel {
    TypeLabel::of_lock(&ResourceType::default(), &["invoice:4821".to_owned()])
}

#[test]
fn acquisitions_are_counted_by_result_and_type() {
    let contended: Result<(), Error> = Err(Error::Contended {
        resources: vec!["invoice:4821".into()],
        denied: 3,
        nodes: 5,
        attempts: 3,
    });
    let tries = Tries {
        attempts: 3,
        contended: 3,
        backoff: Duration::from_millis(400),
    };
    let all = recorded(|| {
        acquisition(
            &invoice(),
            contended.as_ref().map(|_| ()),
            Duration::from_millis(3),
            &tries,
        );
        acquisition(
            &invoice(),
            Ok(()),
            Duration::from_millis(4),
            &Tries::default(),
        );
        extension(true);
    });
    let mut acquires = find(&all, "redfence_acquire_total");
    acquires.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        acquires,
        [
            &(
                labels(&[("result", "acquired"), ("type", "invoice")]),
                DebugValue::Counter(1)
            ),
            &(
                labels(&[("result", "contended"), ("type", "invoice")]),
                DebugValue::Counter(1)
            ),
        ]
    );
    assert_eq!(find(&all, "redfence_acquire_duration_seconds").len(), 2);
    // Three contended attempts; the call that met no contention adds nothing.
    assert_eq!(
        find(&all, "redfence_contended_total"),
        [&(labels(&[("type", "invoice")]), DebugValue::Counter(3))]
    );
    assert_eq!(
        find(&all, "redfence_extension_total"),
        [&(labels(&[("result", "extended")]), DebugValue::Counter(1))]
    );
}

#[test]
fn retries_and_backoff_are_recorded_per_acquisition() {
    let all = recorded(|| {
        acquisition_retries(&invoice(), 2, Duration::from_millis(250));
        acquisition_retries(&invoice(), 0, Duration::ZERO);
    });
    let sorted = |name: &str| -> Vec<(Labelled, Vec<f64>)> {
        find(&all, name)
            .into_iter()
            .map(|(labels, value)| match value {
                DebugValue::Histogram(samples) => {
                    let mut samples: Vec<f64> = samples.iter().map(|s| s.into_inner()).collect();
                    samples.sort_by(f64::total_cmp);
                    (labels.clone(), samples)
                }
                other => panic!("not a histogram: {other:?}"),
            })
            .collect()
    };
    let invoice = labels(&[("type", "invoice")]);
    assert_eq!(
        sorted("redfence_acquire_retries"),
        [(invoice.clone(), vec![0.0, 2.0])]
    );
    assert_eq!(
        sorted("redfence_acquire_backoff_seconds"),
        [(invoice, vec![0.0, 0.25])]
    );
}

#[test]
fn a_hold_is_recorded_once_with_how_it_ended() {
    let far = Instant::now() + Duration::from_secs(3600);
    let all = recorded(|| {
        let mut released = HoldTimer::start(invoice());
        released.end(HoldEnd::Released, far);
        // Whatever follows (the drop of the released `Lock`) records nothing more.
        released.end(HoldEnd::Dropped, far);
        let mut lost = HoldTimer::start(invoice());
        lost.end(HoldEnd::Lost, far);
        lost.end(HoldEnd::Released, far);
        // Released after its validity ran out: lost, at its expiry.
        let mut expired = HoldTimer::start(invoice());
        expired.end(HoldEnd::Released, crate::clock::now());
        let mut dropped = HoldTimer::start(invoice());
        dropped.end(HoldEnd::Dropped, far);
    });
    let mut holds = find(&all, "redfence_lock_hold_seconds");
    holds.sort_by(|a, b| a.0.cmp(&b.0));
    let ends: Vec<(Vec<(String, String)>, usize)> = holds
        .iter()
        .map(|(labels, value)| match value {
            DebugValue::Histogram(samples) => (labels.clone(), samples.len()),
            other => panic!("not a histogram: {other:?}"),
        })
        .collect();
    assert_eq!(
        ends,
        [
            (labels(&[("end", "dropped"), ("type", "invoice")]), 1),
            (labels(&[("end", "lost"), ("type", "invoice")]), 2),
            (labels(&[("end", "released"), ("type", "invoice")]), 1),
        ]
    );
}

#[test]
fn fence_rejections_are_counted_by_type() {
    let all = recorded(|| {
        crate::fence::record_rejected_write(ResourceType::default().of("invoice:4821"));
        crate::fence::record_rejected_write("invoices");
        crate::fence::record_rejected_write("");
    });
    let mut rejected = find(&all, "redfence_fence_rejected_total");
    rejected.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        rejected,
        [
            &(labels(&[("type", "invoice")]), DebugValue::Counter(1)),
            &(labels(&[("type", "invoices")]), DebugValue::Counter(1)),
            &(labels(&[("type", "other")]), DebugValue::Counter(1)),
        ]
    );
}

#[test]
fn a_multi_resource_lock_is_of_its_common_type_or_mixed() {
    let rule = ResourceType::default();
    let all = recorded(|| {
        let same = TypeLabel::of_lock(&rule, &["account:4821".into(), "account:4822".into()]);
        let mixed = TypeLabel::of_lock(&rule, &["account:4821".into(), "invoice:4821".into()]);
        acquisition_retries(&same, 0, Duration::ZERO);
        acquisition_retries(&mixed, 0, Duration::ZERO);
    });
    let mut types: Vec<Vec<(String, String)>> = find(&all, "redfence_acquire_retries")
        .into_iter()
        .map(|(labels, _)| labels.clone())
        .collect();
    types.sort();
    assert_eq!(
        types,
        [labels(&[("type", "account")]), labels(&[("type", "mixed")])]
    );
}

#[test]
fn distinct_labels_are_capped_and_interned() {
    let labels = Labels::new(2);
    let first = labels.intern("invoice");
    assert!(Arc::ptr_eq(&first, &labels.intern("invoice")));
    assert_eq!(&*labels.intern("account"), "account");
    // Full: a third type is `other`; known ones still come back.
    assert_eq!(&*labels.intern("customer"), ResourceType::OTHER);
    assert_eq!(&*labels.intern("invoice"), "invoice");
    assert_eq!(&*labels.intern("other"), "other");
    assert_eq!(&*labels.intern("customer"), ResourceType::OTHER);
}
