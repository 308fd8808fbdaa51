//! A stale owner's write rejected by PostgreSQL: A pauses past its TTL, B acquires and
//! writes, then A's late write is refused, in the single-statement and guard-row forms.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use redfence_postgres::PostgresCounter;
use redfence_postgres::tokio_postgres::Client;
use redfence_postgres::{FenceGuards, FencedUpdate, FencedWriteError};
use tokio::sync::oneshot;

use crate::TTL;
use crate::support::postgres::Postgres;
use crate::support::{Servers, TestRedlock, eventually};

/// A lock's TTL short enough for a test to wait it out.
const SHORT: Duration = Duration::from_millis(300);

/// Runs the A/B story: A acquires and pauses past its TTL, B acquires, writes with
/// `write` and releases, then A wakes up and writes with its own fence. Returns A's
/// fence, B's fence and A's result.
async fn stale_owner_story<W>(pg: &Postgres, write: W) -> (u64, u64, Result<u64, FencedWriteError>)
where
    W: Fn(
            Client,
            &'static str,
            u64,
        ) -> Pin<Box<dyn Future<Output = Result<u64, FencedWriteError>> + Send>>
        + Send
        + Sync
        + 'static,
{
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .fencing(PostgresCounter::connect(&pg.url()).expect("config"))
        .build()
        .expect("config");
    let write = Arc::new(write);
    let (acquired_tx, acquired_rx) = oneshot::channel::<u64>();
    let (wake_tx, wake_rx) = oneshot::channel::<()>();

    let a = {
        let (redlock, write) = (redlock.clone(), Arc::clone(&write));
        let client = pg.client().await;
        tokio::spawn(async move {
            let lock = redlock
                .acquire(&["account:1"], SHORT)
                .await
                .expect("A acquires");
            let fence = lock.fence().expect("fence");
            acquired_tx.send(fence).expect("main waits");
            // A "pauses" here (a GC pause, a stalled VM) until told to go on.
            wake_rx.await.expect("woken");
            assert!(lock.is_expired(), "A slept past its lease");
            let result = write(client, "A", fence).await;
            drop(lock); // its keys expired long ago; B's are untouched
            result
        })
    };

    let fence_a = acquired_rx.await.expect("A acquired");
    // A's lease runs out on every node (no sleep-and-hope: we watch the keys).
    assert!(eventually(|| (0..3).all(|i| servers.get(i, "account:1").is_none())).await);

    let lock_b = redlock
        .acquire(&["account:1"], TTL)
        .await
        .expect("B acquires");
    let fence_b = lock_b.fence().expect("fence");
    assert!(fence_b > fence_a, "B {fence_b} after A {fence_a}");
    let written = write(pg.client().await, "B", fence_b)
        .await
        .expect("B writes");
    assert_eq!(written, 1);
    lock_b.release().await.expect("B releases");

    wake_tx.send(()).expect("A waits");
    let result_a = a.await.expect("A's task");
    (fence_a, fence_b, result_a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_is_rejected_by_the_single_statement_form() {
    let pg = Postgres::start();
    let client = pg.client().await;
    client
        .batch_execute(
            "CREATE TABLE accounts (id bigint PRIMARY KEY, owner text NOT NULL, \
                 balance bigint NOT NULL, last_fence bigint NOT NULL DEFAULT 0); \
             INSERT INTO accounts (id, owner, balance) VALUES (1, 'nobody', 100);",
        )
        .await
        .expect("schema");

    let (fence_a, fence_b, result_a) = stale_owner_story(&pg, |mut client, who, fence| {
        Box::pin(async move {
            let balance: i64 = if who == "A" { 0 } else { 150 };
            let tx = client.transaction().await.expect("begin");
            let written = FencedUpdate::new("accounts", "id", &1_i64)
                .set("owner", &who)
                .set("balance", &balance)
                .execute(&tx, fence)
                .await?;
            tx.commit().await.expect("commit");
            Ok(written)
        })
    })
    .await;

    let err = result_a.expect_err("A's write must be rejected");
    assert!(err.is_ownership_lost(), "{err:?}");
    assert_eq!(
        err.stale()
            .map(|s| (s.resource.as_str(), s.offered, s.last_accepted)),
        Some(("accounts(id = 1)", fence_a, fence_b))
    );
    // B's data is intact.
    let row = client
        .query_one(
            "SELECT owner, balance, last_fence FROM accounts WHERE id = 1",
            &[],
        )
        .await
        .expect("select");
    assert_eq!(row.get::<_, String>(0), "B");
    assert_eq!(row.get::<_, i64>(1), 150);
    assert_eq!(row.get::<_, i64>(2), fence_b as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_is_rejected_by_the_guard_row_form() {
    let pg = Postgres::start();
    let client = pg.client().await;
    FenceGuards::new()
        .create_table(&client)
        .await
        .expect("guards");
    client
        .batch_execute(
            "CREATE TABLE ledger (account bigint NOT NULL, writer text NOT NULL, amount bigint NOT NULL); \
             CREATE TABLE balances (account bigint PRIMARY KEY, balance bigint NOT NULL); \
             INSERT INTO balances VALUES (1, 100);",
        )
        .await
        .expect("schema");

    let (fence_a, fence_b, result_a) = stale_owner_story(&pg, |mut client, who, fence| {
        Box::pin(async move {
            let amount: i64 = if who == "A" { -100 } else { 50 };
            let tx = client.transaction().await.expect("begin");
            FenceGuards::new().claim(&tx, "account:1", fence).await?;
            tx.execute("INSERT INTO ledger VALUES (1, $1, $2)", &[&who, &amount])
                .await
                .expect("insert");
            let n = tx
                .execute(
                    "UPDATE balances SET balance = balance + $1 WHERE account = 1",
                    &[&amount],
                )
                .await
                .expect("update");
            tx.commit().await.expect("commit");
            Ok(n)
        })
    })
    .await;

    let err = result_a.expect_err("A's write must be rejected");
    assert_eq!(
        err.stale()
            .map(|s| (s.resource.as_str(), s.offered, s.last_accepted)),
        Some(("account:1", fence_a, fence_b))
    );
    // Only B's mutations exist; A's transaction left nothing.
    let rows = client
        .query("SELECT writer, amount FROM ledger", &[])
        .await
        .expect("select");
    let ledger: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(ledger, vec![("B".to_string(), 50)]);
    let balance: i64 = client
        .query_one("SELECT balance FROM balances WHERE account = 1", &[])
        .await
        .expect("select")
        .get(0);
    assert_eq!(balance, 150);
    let guard: i64 = client
        .query_one(
            "SELECT last_fence FROM redfence_guards WHERE resource = 'account:1'",
            &[],
        )
        .await
        .expect("select")
        .get(0);
    assert_eq!(guard, fence_b as i64);
}
