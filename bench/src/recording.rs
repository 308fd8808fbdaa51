//! What recording metrics costs (feature `metrics`): acquire+release with a recorder set
//! (metrics-util's `DebuggingRecorder`, which keeps every sample) against the same calls with
//! none, interleaved in blocks on one `Redlock` so that both see the same machine conditions.

use std::time::Instant;

use metrics_util::debugging::DebuggingRecorder;
use redfence::Redlock;

use super::{lock_once, micros, stats};

pub(crate) async fn scenario(redlock: &Redlock, ops: usize) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (mut recorded, mut unrecorded) = (Vec::with_capacity(ops), Vec::with_capacity(ops));
    for block in 0..ops / 100 {
        // Alternate which goes first, so that neither always follows the other.
        let order = if block % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for recording in order {
            // Thread-local: the acquire and release futures run on this (the main) thread.
            let _local = recording.then(|| metrics::set_default_local_recorder(&recorder));
            for i in 0..100 {
                let resource = format!("bench:{block}:{recording}:{i}");
                let t = Instant::now();
                lock_once(redlock, &resource)
                    .await
                    .expect("acquire+release");
                let samples = if recording {
                    &mut recorded
                } else {
                    &mut unrecorded
                };
                samples.push(t.elapsed());
            }
        }
    }
    let metrics = snapshotter.snapshot().into_vec().len();
    let (ours, baseline) = (stats(recorded), stats(unrecorded));
    println!(
        "metrics: {ops} sequential acquire+release each, with a recorder ({metrics} series) and without"
    );
    println!(
        "{:<34} {:>14} {:>14} {:>8}",
        "measure", "recorded", "no recorder", "ratio"
    );
    for (name, a, b) in [
        ("acquire+release p50", ours.p50, baseline.p50),
        ("acquire+release p99", ours.p99, baseline.p99),
    ] {
        println!(
            "{name:<34} {:>14} {:>14} {:>7.2}x",
            micros(a),
            micros(b),
            a.as_secs_f64() / b.as_secs_f64()
        );
    }
}
