//! What a local `metrics` recorder holds, for the metrics tests: every metric with its sorted
//! labels, checked to carry no resource name.

use metrics_util::debugging::{DebugValue, Snapshotter};

/// One metric as recorded: name, labels (sorted) and value.
#[derive(Debug)]
pub struct Recorded {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: DebugValue,
}

/// What the recorder holds now (taking it: a second call sees only what followed).
pub fn snapshot(snapshotter: &Snapshotter) -> Vec<Recorded> {
    let all: Vec<Recorded> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let mut labels: Vec<(String, String)> = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            Recorded {
                name: key.key().name().to_owned(),
                labels,
                value,
            }
        })
        .collect();
    for metric in &all {
        for (_, value) in &metric.labels {
            assert!(
                !value.contains(':') && !value.chars().any(|c| c.is_ascii_digit()),
                "a resource name became a label: {metric:?}"
            );
        }
    }
    all
}

/// The value of `name` with exactly `labels`.
pub fn value<'a>(
    all: &'a [Recorded],
    name: &str,
    labels: &[(&str, &str)],
) -> Option<&'a DebugValue> {
    let mut wanted: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    wanted.sort();
    all.iter()
        .find(|m| m.name == name && m.labels == wanted)
        .map(|m| &m.value)
}

/// The counter `name` with exactly `labels`; 0 when it was never incremented.
pub fn counter(all: &[Recorded], name: &str, labels: &[(&str, &str)]) -> u64 {
    match value(all, name, labels) {
        None => 0,
        Some(DebugValue::Counter(n)) => *n,
        Some(other) => panic!("expected a counter, got {other:?}"),
    }
}

pub fn samples(value: Option<&DebugValue>) -> Vec<f64> {
    match value {
        Some(DebugValue::Histogram(samples)) => {
            let mut samples: Vec<f64> = samples.iter().map(|s| s.into_inner()).collect();
            samples.sort_by(f64::total_cmp);
            samples
        }
        other => panic!("expected a histogram, got {other:?}"),
    }
}
