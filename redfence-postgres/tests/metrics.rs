//! The fenced-write helpers' metric (feature `metrics`, redfence's `metrics`): writes they
//! refuse as stale are counted in `redfence_fence_rejected_total`, by type, beside the lock
//! manager's own metrics. Against real redis-server processes and PostgreSQL; each test
//! records into its own local recorder, on a current-thread runtime so that background tasks
//! record there too.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redfence::{MemoryCounter, RedlockBuilder};
use redfence_postgres::{FenceGuards, FencedUpdate};
use support::postgres::Postgres;
use support::{Servers, TestRedlock, warm_up};

/// One metric as recorded: name, labels (sorted) and value.
#[derive(Debug)]
struct Recorded {
    name: String,
    labels: Vec<(String, String)>,
    value: DebugValue,
}

/// What the recorder holds now (taking it: a second call sees only what followed).
fn snapshot(snapshotter: &Snapshotter) -> Vec<Recorded> {
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
fn value<'a>(all: &'a [Recorded], name: &str, labels: &[(&str, &str)]) -> Option<&'a DebugValue> {
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
fn counter(all: &[Recorded], name: &str, labels: &[(&str, &str)]) -> u64 {
    match value(all, name, labels) {
        None => 0,
        Some(DebugValue::Counter(n)) => *n,
        Some(other) => panic!("expected a counter, got {other:?}"),
    }
}

fn samples(value: Option<&DebugValue>) -> Vec<f64> {
    match value {
        Some(DebugValue::Histogram(samples)) => {
            let mut samples: Vec<f64> = samples.iter().map(|s| s.into_inner()).collect();
            samples.sort_by(f64::total_cmp);
            samples
        }
        other => panic!("expected a histogram, got {other:?}"),
    }
}

const TTL: Duration = Duration::from_secs(10);

/// The test servers' builder, with a node timeout generous enough that a loaded machine does
/// not turn a contended attempt into an unreachable one.
fn builder(servers: &Servers) -> RedlockBuilder {
    servers.builder().node_timeout(Duration::from_millis(500))
}

#[tokio::test]
async fn stale_fenced_writes_are_counted_by_type() {
    let servers = Servers::start(3);
    let redlock = builder(&servers)
        .fencing(MemoryCounter::new())
        .build()
        .expect("config");
    warm_up(&redlock).await;
    let pg = Postgres::start();
    let mut client = pg.client().await;
    let guards = FenceGuards::new();
    guards.create_table(&client).await.expect("guards");
    client
        .batch_execute(
            "CREATE TABLE invoices (id bigint PRIMARY KEY, status text, last_fence bigint NOT NULL DEFAULT 0); \
             INSERT INTO invoices (id) VALUES (1);",
        )
        .await
        .expect("schema");
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    // A's lock is taken away; B acquires and writes with a greater fence.
    let a = redlock.acquire(&["invoice:1"], TTL).await.expect("A");
    redlock.force_release(&["invoice:1"]).await.expect("force");
    let b = redlock.acquire(&["invoice:1"], TTL).await.expect("B");
    assert!(b.fence() > a.fence());
    let tx = client.transaction().await.expect("begin");
    guards.claim_lock(&tx, &b).await.expect("B claims");
    FencedUpdate::new("invoices", "id", &1_i64)
        .set("status", &"B")
        .execute(&tx, b.fence().expect("fence"))
        .await
        .expect("B writes");
    tx.commit().await.expect("commit");

    // A wakes up: both forms refuse it.
    let tx = client.transaction().await.expect("begin");
    let err = guards.claim_lock(&tx, &a).await.expect_err("A is stale");
    assert!(err.is_ownership_lost(), "{err}");
    drop(tx);
    let err = FencedUpdate::new("invoices", "id", &1_i64)
        .set("status", &"A")
        .execute(&client, a.fence().expect("fence"))
        .await
        .expect_err("A is stale");
    assert!(err.is_ownership_lost(), "{err}");
    drop((a, b));
    redlock.close().await;

    let all = snapshot(&snapshotter);
    assert_eq!(
        counter(
            &all,
            "redfence_fence_rejected_total",
            &[("type", "invoice")]
        ),
        1
    );
    assert_eq!(
        counter(
            &all,
            "redfence_fence_rejected_total",
            &[("type", "invoices")]
        ),
        1
    );
    // A's lock, taken away and never extended, ends as dropped after B's: two holds.
    assert_eq!(
        samples(value(
            &all,
            "redfence_lock_hold_seconds",
            &[("type", "invoice"), ("end", "dropped")]
        ))
        .len(),
        2
    );
}
