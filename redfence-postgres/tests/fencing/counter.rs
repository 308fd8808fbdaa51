//! `PostgresCounter`'s tokens: strictly increasing under contention, multi-resource sets
//! (schema-qualified and missing tables), and names PostgreSQL cannot store.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redfence::{Error, FencingCounter};
use redfence_postgres::PostgresCounter;

use crate::next;
use crate::support::postgres::Postgres;
use crate::support::{Servers, TestRedlock};
use crate::{TTL, names, no_key_left};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_fences_strictly_increase_under_contention() {
    const TASKS: usize = 8;
    const ROUNDS: usize = 200;
    let servers = Servers::start(3);
    let pg = Postgres::start();
    let redlock = servers
        .builder()
        .fencing(
            PostgresCounter::connect(&pg.url())
                .expect("config")
                .timeout(Duration::from_secs(5)),
        )
        .fencing_timeout(Duration::from_secs(5))
        // The machine is loaded: a release must not fail on a starved 50 ms node call.
        .node_timeout(Duration::from_millis(500))
        .retry_count(1_000_000)
        .retry_delay(Duration::from_millis(1))
        .retry_jitter(Duration::from_millis(1))
        .build()
        .expect("config");
    let log: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(Vec::with_capacity(TASKS * ROUNDS)));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (redlock, log) = (redlock.clone(), Arc::clone(&log));
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let lock = redlock.acquire(&["ledger"], TTL).await.expect("acquire");
                    let fence = lock.fence().expect("fence");
                    // Inside the critical section: the log is in acquisition order.
                    log.lock().expect("log").push(fence);
                    assert!(!lock.is_expired(), "the lock outlived the critical section");
                    lock.release().await.expect("release");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let log = std::mem::take(&mut *log.lock().expect("log"));
    assert_eq!(log.len(), TASKS * ROUNDS);
    for pair in log.windows(2) {
        assert!(pair[0] < pair[1], "fence {} after {}", pair[1], pair[0]);
    }
    assert!(no_key_left(&servers).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_multi_resource_fences_exceed_every_resource() {
    let pg = Postgres::start();
    let client = pg.client().await;
    client
        .batch_execute("CREATE SCHEMA locks")
        .await
        .expect("schema");
    // A schema-qualified table, created on first use.
    let counter = Arc::new(
        PostgresCounter::connect(&pg.url())
            .expect("config")
            .table("locks.Fences"),
    );
    for expected in 1..=3 {
        assert_eq!(next(&counter, &["a"]).await, expected);
    }
    assert_eq!(next(&counter, &["b"]).await, 1);
    assert_eq!(next(&counter, &["a", "b"]).await, 4);
    assert_eq!(next(&counter, &["b"]).await, 5);
    // A new resource in a set (its row is inserted, then the set is raised).
    assert_eq!(next(&counter, &["c", "a"]).await, 5);
    assert_eq!(next(&counter, &["a", "b", "c"]).await, 6);
    let rows = client
        .query(
            "SELECT resource, last_fence FROM locks.\"Fences\" ORDER BY resource",
            &[],
        )
        .await
        .expect("select");
    let table: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        table,
        vec![("a".into(), 6), ("b".into(), 6), ("c".into(), 6)]
    );

    // Overlapping sets issued concurrently: no deadlock, and no resource sees a token
    // twice; each row ends at the largest token issued for it.
    let sets: [&[&str]; 5] = [
        &["x", "y"],
        &["y", "z"],
        &["z", "x"],
        &["x"],
        &["x", "y", "z"],
    ];
    let tasks: Vec<_> = (0..5)
        .map(|t| {
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let mut got = Vec::new();
                for i in 0..30 {
                    let set = sets[(t + i) % sets.len()];
                    got.push((set, next(&counter, set).await));
                }
                got
            })
        })
        .collect();
    let mut issued: Vec<(&[&str], u64)> = Vec::new();
    for task in tasks {
        issued.extend(task.await.expect("task"));
    }
    for resource in ["x", "y", "z"] {
        let mut fences: Vec<u64> = issued
            .iter()
            .filter(|(set, _)| set.contains(&resource))
            .map(|(_, f)| *f)
            .collect();
        let count = fences.len();
        fences.sort_unstable();
        fences.dedup();
        assert_eq!(fences.len(), count, "{resource} saw a token twice");
        let stored: i64 = client
            .query_one(
                "SELECT last_fence FROM locks.\"Fences\" WHERE resource = $1",
                &[&resource],
            )
            .await
            .expect("select")
            .get(0);
        assert_eq!(Some(stored as u64), fences.last().copied(), "{resource}");
    }

    // Through a lock, on the default table.
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .fencing(PostgresCounter::new(pg.client().await))
        .build()
        .expect("config");
    let fence = |r: &'static [&'static str]| {
        let redlock = redlock.clone();
        async move {
            let lock = redlock.acquire(r, TTL).await.expect("acquire");
            let fence = lock.fence().expect("fence");
            lock.release().await.expect("release");
            fence
        }
    };
    let p = fence(&["p"]).await;
    let p2 = fence(&["p"]).await;
    let q = fence(&["q"]).await;
    let pq = fence(&["q", "p"]).await;
    assert!(p2 > p && pq > p2 && pq > q);

    // Without permission to create the table, a missing table fails closed, clearly.
    let strict = PostgresCounter::connect(&pg.url())
        .expect("config")
        .table("missing")
        .create_table(false);
    let err = strict
        .next_fence(&names(&["a"]))
        .await
        .expect_err("no table");
    assert!(err.to_string().contains("does not exist"), "{err}");
    assert!(
        strict
            .create_table_sql()
            .starts_with("CREATE TABLE IF NOT EXISTS \"missing\"")
    );
}

/// Issue 8, item 9: PostgreSQL `text` cannot hold NUL, so such a name is refused before
/// any traffic, with a typed error, and nothing is locked.
#[tokio::test]
async fn a_resource_name_with_nul_is_refused_before_any_traffic() {
    let servers = Servers::start(3);
    let pg = Postgres::start();
    let redlock = servers
        .builder()
        .fencing(PostgresCounter::connect(&pg.url()).expect("config"))
        .build()
        .expect("config");
    let err = redlock
        .acquire(&["ok", "a\0b"], TTL)
        .await
        .expect_err("NUL cannot be fenced");
    match &err {
        Error::InvalidInput(redfence::InvalidInput::ResourceNotFenceable { index, reason }) => {
            assert_eq!(*index, 1);
            assert!(
                reason.contains("NUL") && reason.contains("PostgreSQL"),
                "{reason}"
            );
        }
        other => panic!("expected ResourceNotFenceable, got {other:?}"),
    }
    assert!((0..servers.len()).all(|i| servers.keys(i).is_empty()));
    // The counter was never asked: its table does not exist.
    let table: Option<String> = pg
        .client()
        .await
        .query_one("SELECT to_regclass('redfence_fences')::text", &[])
        .await
        .expect("select")
        .get(0);
    assert_eq!(table, None);
}

/// Tokens of `resources`, requested together: on this single-threaded test runtime they are
/// all queued before the counter's batch task runs, so they go out as one batch (distinct
/// resources: the distinct statement; repeated ones: the general one).
async fn batch(counter: &PostgresCounter, resources: &[&str]) -> Vec<Result<u64, String>> {
    futures::future::join_all(resources.iter().map(|r| async move {
        counter
            .next_fence(&crate::names(&[r]))
            .await
            .map_err(|e| e.to_string())
    }))
    .await
}

/// With prepared statements, a change that breaks the cached plans (the result type of the
/// distinct statement) costs at most one failed batch (which fails closed): the statements
/// are prepared again and the next batch is served.
#[tokio::test]
async fn prepared_statements_are_made_again_after_the_table_changes() {
    let pg = Postgres::start();
    let counter = PostgresCounter::connect(&pg.url())
        .expect("config")
        .prepare_statements(true);
    let all_ok = |tokens: &[Result<u64, String>], want: u64| {
        tokens.iter().all(|t| t.as_ref().is_ok_and(|t| *t == want))
    };
    let first = batch(&counter, &["a", "b", "c"]).await;
    assert!(all_ok(&first, 1), "{first:?}");
    let admin = pg.client().await;
    admin
        .batch_execute("ALTER TABLE redfence_fences ALTER COLUMN resource TYPE varchar")
        .await
        .expect("alter the table");
    // The first batch after the change may fail on its stale plan (nothing is issued then).
    let second = batch(&counter, &["a", "b", "c"]).await;
    let (want, third) = if all_ok(&second, 2) {
        (3, batch(&counter, &["a", "b", "c"]).await)
    } else {
        assert!(
            second.iter().all(Result::is_err),
            "all or nothing: {second:?}"
        );
        (2, batch(&counter, &["a", "b", "c"]).await)
    };
    assert!(
        all_ok(&third, want),
        "served again after the change: {third:?}"
    );
}

/// Prepared or not (the default), the counter issues the same tokens: alone, in a batch of
/// distinct resources and in a batch that repeats them. Unprepared leaves no named statement
/// on the session (nothing a pooler in transaction mode could mix up between clients).
#[tokio::test]
async fn prepared_and_unprepared_statements_issue_the_same_tokens() {
    let pg = Postgres::start();
    let mut issued = Vec::new();
    for (table, prepare) in [("prepared", true), ("unprepared", false)] {
        let client = Arc::new(pg.client().await);
        let counter = PostgresCounter::new(Arc::clone(&client))
            .table(table)
            .prepare_statements(prepare);
        let mut tokens = vec![next(&counter, &["a"]).await];
        let distinct: Vec<String> = (0..16).map(|i| format!("r{i}")).collect();
        let distinct: Vec<&str> = distinct.iter().map(String::as_str).collect();
        let repeated: Vec<&str> = (0..16).map(|i| ["a", "b"][i % 2]).collect();
        for round in [&distinct, &repeated, &distinct] {
            for token in batch(&counter, round).await {
                tokens.push(token.expect("token"));
            }
        }
        // Over the simple protocol: a prepared query would count itself.
        let named: i64 = client
            .simple_query("SELECT count(*) FROM pg_prepared_statements")
            .await
            .expect("pg_prepared_statements")
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0)?.parse().ok(),
                _ => None,
            })
            .expect("a count");
        assert_eq!(named > 0, prepare, "{table}: {named} named statements");
        issued.push(tokens);
    }
    assert_eq!(issued[0], issued[1]);
    assert_eq!(issued[0][..3], [1, 1, 1], "{:?}", issued[0]);
}

/// A session whose commits are acknowledged before they are durable (`synchronous_commit =
/// off`) is refused with a reason: a crash could hand out tokens again. `local` is durable
/// on the server itself, and accepted.
#[tokio::test]
async fn a_session_without_durable_commits_is_refused() {
    let pg = Postgres::start();
    let options = |setting: &str| format!("{} options='-c synchronous_commit={setting}'", pg.url());
    let unsafe_counter = PostgresCounter::connect(&options("off"))
        .expect("config")
        .timeout(Duration::from_secs(5));
    let err = unsafe_counter
        .next_fence(&names(&["a"]))
        .await
        .expect_err("off");
    assert!(
        err.to_string().contains("synchronous_commit is off"),
        "{err}"
    );
    let local = PostgresCounter::connect(&options("local"))
        .expect("config")
        .timeout(Duration::from_secs(5));
    assert_eq!(local.next_fence(&names(&["a"])).await.expect("local"), 1);
}
