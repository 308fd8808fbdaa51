//! The fenced-write helpers' metric (feature `metrics`, redfence's `metrics`): writes they
//! refuse as stale are counted in `redfence_fence_rejected_total`, by type, beside the lock
//! manager's own metrics. Against real redis-server processes and PostgreSQL; each test
//! records into its own local recorder, on a current-thread runtime so that background tasks
//! record there too.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use metrics_util::debugging::DebuggingRecorder;
use redfence::{MemoryCounter, RedlockBuilder};
use redfence_postgres::{FenceGuards, FencedUpdate};
use support::postgres::Postgres;
use support::recorded::{counter, samples, snapshot, value};
use support::{Servers, TestRedlock, warm_up};

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
