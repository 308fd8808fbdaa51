//! The fenced-write helpers: `FencedUpdate` (stale versus missing rows, transactions, range
//! and statement errors) and `FenceGuards` (transactional claims, `claim_lock`, the owner's
//! own fence again, the strict check).

use redfence_postgres::PostgresCounter;
use redfence_postgres::{FenceCheck, FenceGuards, FencedUpdate, FencedWriteError};

use crate::TTL;
use crate::support::postgres::Postgres;
use crate::support::{Servers, TestRedlock};

#[tokio::test]
async fn fenced_update_tells_stale_from_missing() {
    let pg = Postgres::start();
    let mut client = pg.client().await;
    client
        .batch_execute(
            "CREATE TABLE docs (id text PRIMARY KEY, body text NOT NULL, version int NOT NULL DEFAULT 0, \
                 fence bigint); \
             INSERT INTO docs (id, body) VALUES ('d1', 'v0');",
        )
        .await
        .expect("schema");
    fn update<'a>(body: &'a &'static str) -> FencedUpdate<'a> {
        FencedUpdate::new("docs", "id", &"d1")
            .fence_column("fence")
            .set("body", body)
            .set_expr("version", "version + 1")
    }
    // A NULL fence column accepts any fence; outside a transaction it is one statement.
    assert_eq!(update(&"v1").execute(&client, 5).await.expect("fresh"), 1);
    // The owner's own fence again is accepted (it writes twice with one lock).
    assert_eq!(update(&"v1").execute(&client, 5).await.expect("same"), 1);
    // Lower fences are stale, and change nothing; so is an equal one when strict.
    let err = update(&"other")
        .fence_check(FenceCheck::Strict)
        .execute(&client, 5)
        .await
        .expect_err("strict: stale");
    assert_eq!(err.stale().map(|s| s.last_accepted), Some(5));
    for offered in [4, 1] {
        let err = update(&"other")
            .execute(&client, offered)
            .await
            .expect_err("stale");
        assert_eq!(
            err.stale()
                .map(|s| (s.resource.as_str(), s.offered, s.last_accepted)),
            Some(("docs(id = \"d1\")", offered, 5))
        );
    }
    // A missing row is not a stale fence.
    let err = FencedUpdate::new("docs", "id", &"nope")
        .fence_column("fence")
        .set("body", &"x")
        .execute(&client, 100)
        .await
        .expect_err("missing");
    assert!(matches!(err, FencedWriteError::NotFound { .. }), "{err:?}");
    assert!(!err.is_ownership_lost());
    assert!(err.to_string().contains("nope"), "{err}");

    // In a transaction that rolls back, the accepted fence goes with it.
    let tx = client.transaction().await.expect("begin");
    assert_eq!(update(&"v2").execute(&tx, 9).await.expect("newer"), 1);
    tx.rollback().await.expect("rollback");
    let tx = client.transaction().await.expect("begin");
    assert_eq!(
        update(&"v2")
            .execute(&tx, 6)
            .await
            .expect("still newer than 5"),
        1
    );
    tx.commit().await.expect("commit");
    let row = client
        .query_one("SELECT body, version, fence FROM docs WHERE id = 'd1'", &[])
        .await
        .expect("select");
    assert_eq!(row.get::<_, String>(0), "v2");
    assert_eq!(row.get::<_, i32>(1), 3);
    assert_eq!(row.get::<_, Option<i64>>(2), Some(6));

    // A fence that cannot be a bigint is refused before any statement.
    let err = update(&"other")
        .execute(&client, u64::MAX)
        .await
        .expect_err("range");
    assert!(
        matches!(err, FencedWriteError::FenceOutOfRange(u64::MAX)),
        "{err:?}"
    );
    // Nor is 0, which no counter issues (`fence().unwrap_or(0)` without a counter): every
    // row would accept it for ever.
    let err = update(&"other")
        .execute(&client, 0)
        .await
        .expect_err("zero");
    assert!(matches!(err, FencedWriteError::ZeroFence), "{err:?}");

    // A statement error says which step failed.
    let err = FencedUpdate::new("no_such_table", "id", &1_i64)
        .set("x", &1_i64)
        .execute(&client, 1)
        .await
        .expect_err("no table");
    let text = err.to_string();
    assert!(
        text.contains("fenced UPDATE") && text.contains("does not exist"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_claims_are_transactional() {
    let pg = Postgres::start();
    let mut c1 = pg.client().await;
    let mut c2 = pg.client().await;
    let guards = FenceGuards::in_table("guards");
    guards.create_table(&c1).await.expect("create");
    guards
        .create_table(&c1)
        .await
        .expect("create is idempotent");
    let last = |resource: &'static str| {
        let c = pg.client();
        async move {
            c.await
                .query_opt(
                    "SELECT last_fence FROM guards WHERE resource = $1",
                    &[&resource],
                )
                .await
                .expect("select")
                .map(|r| r.get::<_, i64>(0))
        }
    };

    // Fence 0 is refused before any statement; a resource seen for the first time then gets
    // its guard row.
    let tx = c1.transaction().await.expect("begin");
    let err = guards.claim(&tx, "r", 0).await.expect_err("zero");
    assert!(matches!(err, FencedWriteError::ZeroFence), "{err:?}");
    guards.claim(&tx, "r", 5).await.expect("first claim");
    tx.commit().await.expect("commit");
    assert_eq!(last("r").await, Some(5));

    // The owner's own fence again: accepted (a second transaction of the same owner).
    let tx = c1.transaction().await.expect("begin");
    guards
        .claim(&tx, "r", 5)
        .await
        .expect("the owner's own fence");
    tx.commit().await.expect("commit");
    assert_eq!(last("r").await, Some(5));
    // Equal when strict, or lower: stale, with the last accepted fence.
    let strict = guards.clone().fence_check(FenceCheck::Strict);
    let tx = c1.transaction().await.expect("begin");
    let err = strict.claim(&tx, "r", 5).await.expect_err("strict");
    assert_eq!(err.stale().map(|s| s.last_accepted), Some(5));
    drop(tx);
    for offered in [4, 3] {
        let tx = c1.transaction().await.expect("begin");
        let err = guards.claim(&tx, "r", offered).await.expect_err("stale");
        assert_eq!(
            err.stale()
                .map(|s| (s.resource.as_str(), s.offered, s.last_accepted)),
            Some(("r", offered, 5))
        );
    }

    // A rollback undoes the claim.
    let tx = c1.transaction().await.expect("begin");
    guards.claim(&tx, "r", 9).await.expect("claim");
    tx.rollback().await.expect("rollback");
    assert_eq!(last("r").await, Some(5));

    // A concurrent claim waits for the holder's transaction, then sees its fence.
    let tx1 = c1.transaction().await.expect("begin");
    guards.claim(&tx1, "r", 7).await.expect("claim 7");
    let contender = {
        let guards = guards.clone();
        tokio::spawn(async move {
            let tx2 = c2.transaction().await.expect("begin");
            let result = guards.claim(&tx2, "r", 6).await;
            drop(tx2);
            result
        })
    };
    tx1.commit().await.expect("commit");
    let err = contender.await.expect("task").expect_err("6 after 7");
    assert_eq!(err.stale().map(|s| s.last_accepted), Some(7));

    // Several resources at once: all or nothing, the stale one named.
    let tx = c1.transaction().await.expect("begin");
    guards.claim(&tx, "s", 20).await.expect("claim s");
    tx.commit().await.expect("commit");
    let tx = c1.transaction().await.expect("begin");
    let err = guards
        .claim_all(&tx, &["t", "s", "r"], 10)
        .await
        .expect_err("s is at 20");
    assert_eq!(
        err.stale()
            .map(|s| (s.resource.as_str(), s.offered, s.last_accepted)),
        Some(("s", 10, 20))
    );
    // Even a caller who commits anyway records none of them.
    tx.commit().await.expect("commit");
    assert_eq!(last("t").await, None, "t was claimed by a stale claim_all");
    assert_eq!(
        last("r").await,
        Some(7),
        "r was claimed by a stale claim_all"
    );
    let tx = c1.transaction().await.expect("begin");
    guards
        .claim_all(&tx, &["t", "s", "r"], 21)
        .await
        .expect("newer than all");
    tx.commit().await.expect("commit");
    for r in ["r", "s", "t"] {
        assert_eq!(last(r).await, Some(21), "{r}");
    }
}

#[tokio::test]
async fn claim_lock_takes_the_resources_and_fence_from_the_lock() {
    let servers = Servers::start(3);
    let pg = Postgres::start();
    let mut client = pg.client().await;
    let guards = FenceGuards::new();
    guards.create_table(&client).await.expect("create");
    let redlock = servers
        .builder()
        .fencing(PostgresCounter::connect(&pg.url()).expect("config"))
        .build()
        .expect("config");

    let first = redlock.acquire(&["r1", "r2"], TTL).await.expect("acquire");
    let tx = client.transaction().await.expect("begin");
    guards.claim_lock(&tx, &first).await.expect("claim");
    tx.commit().await.expect("commit");
    let rows = client
        .query(
            "SELECT resource, last_fence FROM redfence_guards ORDER BY resource",
            &[],
        )
        .await
        .expect("select");
    let fence = first.fence().expect("fence") as i64;
    let table: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(table, vec![("r1".into(), fence), ("r2".into(), fence)]);

    // The same claim again (another transaction of the same owner) is accepted; with the
    // strict check a fence is accepted once.
    let tx = client.transaction().await.expect("begin");
    guards
        .claim_lock(&tx, &first)
        .await
        .expect("the owner claims again");
    tx.commit().await.expect("commit");
    let tx = client.transaction().await.expect("begin");
    let err = guards
        .clone()
        .fence_check(FenceCheck::Strict)
        .claim_lock(&tx, &first)
        .await
        .expect_err("strict: used");
    assert!(err.is_ownership_lost(), "{err:?}");
    tx.rollback().await.expect("rollback");
    first.release().await.expect("release");

    // A lock without a fence, and an empty claim, are refused rather than protecting
    // nothing.
    let unfenced = servers
        .redlock()
        .acquire(&["r3"], TTL)
        .await
        .expect("acquire");
    let tx = client.transaction().await.expect("begin");
    let err = guards
        .claim_lock(&tx, &unfenced)
        .await
        .expect_err("no fence");
    assert!(matches!(err, FencedWriteError::NoFence(_)), "{err:?}");
    let none: &[&str] = &[];
    let err = guards.claim_all(&tx, none, 1).await.expect_err("nothing");
    assert!(matches!(err, FencedWriteError::NoResource), "{err:?}");
    tx.rollback().await.expect("rollback");
    unfenced.release().await.expect("release");
}

/// Issue 8, item 2: the owner writes several times with its one fence; a stale owner's
/// smaller fence is refused; the strict check refuses the owner's second write.
#[tokio::test]
async fn the_owner_writes_again_with_its_own_fence_and_a_smaller_one_is_refused() {
    let servers = Servers::start(3);
    let pg = Postgres::start();
    let mut client = pg.client().await;
    client
        .batch_execute(
            "CREATE TABLE parts (id bigint PRIMARY KEY, body text NOT NULL, \
                 last_fence bigint NOT NULL DEFAULT 0); \
             INSERT INTO parts (id, body) VALUES (1, 'empty');",
        )
        .await
        .expect("schema");
    let guards = FenceGuards::new();
    guards.create_table(&client).await.expect("guards");
    let redlock = servers
        .builder()
        .fencing(PostgresCounter::connect(&pg.url()).expect("config"))
        .build()
        .expect("config");
    let old = redlock.acquire(&["parts"], TTL).await.expect("old owner");
    let old_fence = old.fence().expect("fence");
    old.release().await.expect("release");
    let owner = redlock.acquire(&["parts"], TTL).await.expect("owner");
    let fence = owner.fence().expect("fence");
    assert!(fence > old_fence);

    // Three writes of one row, and three guarded transactions, with one fence.
    for (i, body) in ["part 1", "part 2", "part 3"].iter().enumerate() {
        let written = FencedUpdate::new("parts", "id", &1_i64)
            .set("body", body)
            .execute(&client, fence)
            .await
            .unwrap_or_else(|e| panic!("write {i} with the owner's fence: {e}"));
        assert_eq!(written, 1);
        let tx = client.transaction().await.expect("begin");
        guards
            .claim_lock(&tx, &owner)
            .await
            .unwrap_or_else(|e| panic!("claim {i} with the owner's fence: {e}"));
        tx.commit().await.expect("commit");
    }
    let body: String = client
        .query_one("SELECT body FROM parts WHERE id = 1", &[])
        .await
        .expect("select")
        .get(0);
    assert_eq!(body, "part 3");

    // The previous owner's smaller fence: ownership lost, in both forms.
    let err = FencedUpdate::new("parts", "id", &1_i64)
        .set("body", &"stale")
        .execute(&client, old_fence)
        .await
        .expect_err("smaller fence");
    assert!(err.is_ownership_lost(), "{err:?}");
    let tx = client.transaction().await.expect("begin");
    let err = guards
        .claim(&tx, "parts", old_fence)
        .await
        .expect_err("smaller fence");
    assert!(err.is_ownership_lost(), "{err:?}");
    drop(tx);

    // Strict: the owner's fence was accepted already, so it is refused in both forms.
    let err = FencedUpdate::new("parts", "id", &1_i64)
        .set("body", &"once more")
        .fence_check(FenceCheck::Strict)
        .execute(&client, fence)
        .await
        .expect_err("strict");
    assert!(err.is_ownership_lost(), "{err:?}");
    let tx = client.transaction().await.expect("begin");
    let err = guards
        .clone()
        .fence_check(FenceCheck::Strict)
        .claim_lock(&tx, &owner)
        .await
        .expect_err("strict");
    assert!(err.is_ownership_lost(), "{err:?}");
    drop(tx);
    owner.release().await.expect("release");
}
