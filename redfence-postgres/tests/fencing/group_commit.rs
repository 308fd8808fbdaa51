//! Issue 15: the counter's group commit. Batches held in the server by row locks another
//! session holds: tokens per resource in arrival order, a batch cut off by a crash, a
//! cancelled acquisition, repeats and multi-resource requests in one batch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use redfence::{BoxError, Error, FencingCounter};
use redfence_postgres::PostgresCounter;
use redfence_postgres::tokio_postgres::Client;
use tokio::task::JoinHandle;

use crate::next;
use crate::support::postgres::Postgres;
use crate::support::{self, Servers, TestRedlock, eventually};
use crate::{names, no_key_left};

/// Rows whose lock another session holds, so that a batch touching them waits in the
/// server until the session ends: a batch "in flight" for as long as a test needs.
async fn hold_rows(pg: &Postgres, resources: &[&str]) -> Client {
    let holder = pg.client().await;
    holder.batch_execute("BEGIN").await.expect("begin");
    let names = names(resources);
    let rows = holder
        .execute(
            "SELECT 1 FROM redfence_fences WHERE resource = ANY($1) FOR UPDATE",
            &[&names],
        )
        .await
        .expect("lock the rows");
    assert_eq!(rows as usize, resources.len(), "the rows exist");
    holder
}

/// Waits until `n` statements wait for a row lock.
async fn lock_waiters(pg: &Postgres, n: i64) -> bool {
    let client = pg.client().await;
    let deadline = Instant::now() + support::DEADLINE;
    while Instant::now() < deadline {
        let waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
                &[],
            )
            .await
            .expect("select")
            .get(0);
        if waiting >= n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// Whether every node holds a key for each of `resources`: those locks were granted and
/// now wait for their fence.
async fn all_granted(servers: &Servers, resources: &[&str]) -> bool {
    eventually(|| {
        resources
            .iter()
            .all(|r| (0..servers.len()).all(|i| servers.get(i, r).is_some()))
    })
    .await
}

fn patient(servers: &Servers, counter: PostgresCounter) -> (redfence::Redlock, Asked) {
    let asked = Asked::default();
    let counter = Counting {
        inner: counter.timeout(Duration::from_secs(20)),
        asked: asked.clone(),
    };
    let redlock = servers
        .builder()
        .fencing(counter)
        .fencing_timeout(Duration::from_secs(20))
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("config");
    (redlock, asked)
}

/// How many fences the acquisitions have asked the counter for.
#[derive(Clone, Default)]
struct Asked(Arc<AtomicUsize>);

impl Asked {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// Waits until `n` more fences than `since` were asked for: the acquisitions' requests
    /// are in the counter's queue (a key on every node says only that the quorum was met).
    async fn reached(&self, since: usize, n: usize) -> bool {
        eventually(|| self.count() >= since + n).await
    }
}

/// A `PostgresCounter` that counts the fences asked of it.
struct Counting {
    inner: PostgresCounter,
    asked: Asked,
}

impl FencingCounter for Counting {
    fn next_fence<'a>(&'a self, resources: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>> {
        self.asked.0.fetch_add(1, Ordering::SeqCst);
        self.inner.next_fence(resources)
    }

    fn check_resource(&self, resource: &str) -> Result<(), String> {
        self.inner.check_resource(resource)
    }
}

/// Takes and releases each resource once (so its row exists): the token each got.
async fn prime(redlock: &redfence::Redlock, resources: &[&str]) -> HashMap<String, u64> {
    let mut tokens = HashMap::new();
    for &r in resources {
        let lock = redlock.acquire(&[r], LONG).await.expect("prime");
        tokens.insert(r.to_owned(), lock.fence().expect("fence"));
        lock.release().await.expect("release");
    }
    tokens
}

/// Batch 1, held in the server: the gate's row is locked by another session and an
/// acquisition of "gate" waits on it, so the requests made next queue behind it as one batch.
/// Returns that session (COMMIT lets batch 1 through) and the waiting acquisition.
async fn gate_batch(
    pg: &Postgres,
    redlock: &redfence::Redlock,
) -> (Client, JoinHandle<Result<redfence::Lock, Error>>) {
    let gate = hold_rows(pg, &["gate"]).await;
    let first = tokio::spawn({
        let redlock = redlock.clone();
        async move { redlock.acquire(&["gate"], LONG).await }
    });
    assert!(
        lock_waiters(pg, 1).await,
        "batch 1 did not reach the server"
    );
    (gate, first)
}

const LONG: Duration = Duration::from_secs(30);

/// Issue 15: 64 concurrent fenced acquisitions on 8 resources, through the group
/// commit: per resource, tokens strictly increase in order of acquisition; none repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_keeps_tokens_increasing_per_resource() {
    const TASKS: usize = 64;
    const ROUNDS: usize = 5;
    let servers = Servers::start(3);
    let pg = Postgres::start();
    let redlock = servers
        .builder()
        .fencing(
            PostgresCounter::connect(&pg.url())
                .expect("config")
                .timeout(Duration::from_secs(10)),
        )
        .fencing_timeout(Duration::from_secs(10))
        .node_timeout(Duration::from_millis(500))
        .retry_count(1_000_000)
        .retry_delay(Duration::from_millis(5))
        .retry_jitter(Duration::from_millis(5))
        .build()
        .expect("config");
    let resources: Vec<String> = (0..8).map(|r| format!("account:{r}")).collect();
    let logs: Arc<Vec<Mutex<Vec<u64>>>> =
        Arc::new((0..8).map(|_| Mutex::new(Vec::new())).collect());
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (redlock, logs) = (redlock.clone(), Arc::clone(&logs));
            let resource = resources[t % 8].clone();
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let lock = redlock.acquire(&[&resource], LONG).await.expect("acquire");
                    let fence = lock.fence().expect("fence");
                    // Inside the critical section: each log is in acquisition order.
                    logs[t % 8].lock().expect("log").push(fence);
                    lock.release().await.expect("release");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let mut all = Vec::new();
    for (r, log) in logs.iter().enumerate() {
        let log = log.lock().expect("log");
        assert_eq!(log.len(), TASKS / 8 * ROUNDS, "account:{r}");
        for pair in log.windows(2) {
            assert!(
                pair[0] < pair[1],
                "account:{r}: {} after {}",
                pair[1],
                pair[0]
            );
        }
        all.extend(log.iter().map(|f| (r, *f)));
    }
    let count = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), count, "a token repeated for a resource");
    assert!(no_key_left(&servers).await);
}

/// Issue 15: a batch cut off by `pg_ctl stop -m immediate` while it is in the server:
/// every lock in it fails closed, and after the restart new tokens are above every token
/// handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_cut_off_by_a_crash_fails_every_lock_in_it() {
    let servers = Servers::start(3);
    let mut pg = Postgres::start();
    let counter = PostgresCounter::connect(&pg.url()).expect("config");
    let (redlock, asked) = patient(&servers, counter);
    let batch: Vec<String> = (0..8).map(|i| format!("job:{i}")).collect();
    let primed: Vec<&str> = batch.iter().map(String::as_str).chain(["gate"]).collect();
    let mut handed_out = prime(&redlock, &primed).await;

    // Batch 1 (the gate) waits in the server; the eight queue behind it.
    let (gate, first) = gate_batch(&pg, &redlock).await;
    let held = hold_rows(&pg, &["job:3"]).await;
    let since = asked.count();
    let cut: Vec<_> = batch
        .iter()
        .map(|r| {
            let (redlock, r) = (redlock.clone(), r.clone());
            tokio::spawn(async move { redlock.acquire(&[&r], LONG).await })
        })
        .collect();
    let names: Vec<&str> = batch.iter().map(String::as_str).collect();
    assert!(
        all_granted(&servers, &names).await,
        "the eight were not granted"
    );
    assert!(
        asked.reached(since, 8).await,
        "the eight did not ask for fences"
    );
    // Batch 1 commits; batch 2 (the eight together) then waits for job:3's row.
    gate.batch_execute("COMMIT").await.expect("commit");
    let first = first.await.expect("task").expect("batch 1 commits");
    handed_out.insert("gate".to_owned(), first.fence().expect("fence"));
    assert!(
        lock_waiters(&pg, 1).await,
        "batch 2 did not reach the server"
    );

    pg.stop_immediate();
    drop(held);
    for task in cut {
        let err = task.await.expect("task").expect_err("cut off");
        assert!(matches!(err, Error::Fencing(_)), "{err:?}");
    }
    // Fail closed: none of the eight is left locked.
    assert!(
        eventually(|| names
            .iter()
            .all(|r| (0..servers.len()).all(|i| servers.get(i, r).is_none())))
        .await
    );
    first.release().await.expect("release");

    pg.start_again();
    for r in names.iter().copied().chain(["gate"]) {
        let lock = redlock
            .acquire(&[r], LONG)
            .await
            .expect("after the restart");
        let fence = lock.fence().expect("fence");
        let last = handed_out[r];
        assert!(
            fence > last,
            "{r}: {fence} after a restart, {last} handed out before"
        );
        lock.release().await.expect("release");
    }
    assert!(no_key_left(&servers).await);
}

/// Issue 15: an acquisition cancelled while its batch is in flight: its token is skipped,
/// and the others in the batch get theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquisition_skips_its_token_and_spares_its_batch() {
    let servers = Servers::start(3);
    let pg = Postgres::start();
    let counter = PostgresCounter::connect(&pg.url()).expect("config");
    let (redlock, asked) = patient(&servers, counter);
    let resources = ["c:1", "c:2", "c:3", "c:4", "gate"];
    let before = prime(&redlock, &resources).await;

    let (gate, first) = gate_batch(&pg, &redlock).await;
    let held = hold_rows(&pg, &["c:1"]).await;
    let since = asked.count();
    let spawn = |r: &'static str| {
        let redlock = redlock.clone();
        tokio::spawn(async move { redlock.acquire(&[r], LONG).await })
    };
    let cancelled = spawn("c:1");
    let others = [spawn("c:2"), spawn("c:3"), spawn("c:4")];
    assert!(all_granted(&servers, &["c:1", "c:2", "c:3", "c:4"]).await);
    assert!(
        asked.reached(since, 4).await,
        "the four did not ask for fences"
    );
    gate.batch_execute("COMMIT").await.expect("commit");
    first
        .await
        .expect("task")
        .expect("batch 1")
        .release()
        .await
        .expect("release");
    // Batch 2 (all four) waits in the server for c:1's row; cancel c:1's acquisition.
    assert!(
        lock_waiters(&pg, 1).await,
        "batch 2 did not reach the server"
    );
    cancelled.abort();
    assert!(cancelled.await.expect_err("aborted").is_cancelled());
    // The cancelled acquisition releases its keys in the background.
    assert!(eventually(|| (0..servers.len()).all(|i| servers.get(i, "c:1").is_none())).await);
    held.batch_execute("COMMIT").await.expect("commit");

    // The others in the batch are unaffected.
    for (task, r) in others.into_iter().zip(["c:2", "c:3", "c:4"]) {
        let lock = task.await.expect("task").expect("the batch commits");
        assert_eq!(lock.fence(), Some(before[r] + 1), "{r}");
        lock.release().await.expect("release");
    }
    // The cancelled request's token was committed and is skipped: the next is above it.
    let skipped: i64 = pg
        .client()
        .await
        .query_one(
            "SELECT last_fence FROM redfence_fences WHERE resource = 'c:1'",
            &[],
        )
        .await
        .expect("select")
        .get(0);
    assert_eq!(skipped as u64, before["c:1"] + 1, "the skipped token");
    let lock = redlock.acquire(&["c:1"], LONG).await.expect("acquire");
    assert_eq!(lock.fence(), Some(skipped as u64 + 1));
    lock.release().await.expect("release");
    assert!(no_key_left(&servers).await);
}

/// Issue 15: one batch may hold several requests on one resource, and multi-resource
/// requests: tokens still increase per resource in arrival order, and a multi-resource
/// token exceeds every earlier token of each of its resources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_repeats_and_multi_resource_requests_keeps_arrival_order() {
    let pg = Postgres::start();
    let counter = PostgresCounter::connect(&pg.url())
        .expect("config")
        .timeout(Duration::from_secs(20));
    for r in ["gate", "x", "y"] {
        next(&counter, &[r]).await;
    }
    let shapes: [&[&[&str]]; 2] = [
        // Singles only, with repeats.
        &[&["x"], &["x"], &["y"], &["x"], &["new"], &["y"]],
        // With multi-resource requests (and a resource seen for the first time).
        &[
            &["x"],
            &["x", "y"],
            &["y"],
            &["x"],
            &["z", "x"],
            &["y", "z"],
            &["z"],
        ],
    ];
    let mut last: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for shape in shapes {
        // The batch before waits in the server, so the whole shape queues behind it.
        let gate = hold_rows(&pg, &["gate"]).await;
        let gate_name = names(&["gate"]);
        let mut first = Box::pin(counter.next_fence(&gate_name));
        assert!(futures::poll!(&mut first).is_pending());
        assert!(
            lock_waiters(&pg, 1).await,
            "the gate batch did not reach the server"
        );
        let requests: Vec<Vec<String>> = shape.iter().map(|r| names(r)).collect();
        let mut queued = Box::pin(futures::future::join_all(
            requests.iter().map(|r| counter.next_fence(r)),
        ));
        // Polled once: every request is queued, in order, behind the gate batch.
        assert!(futures::poll!(&mut queued).is_pending());
        gate.batch_execute("COMMIT").await.expect("commit");
        let (first, tokens) = futures::join!(first, queued);
        first.expect("gate");
        for (set, token) in shape.iter().zip(tokens) {
            let token = token.expect("fence");
            for r in set.iter() {
                let before = last.insert(r, token).unwrap_or(0);
                assert!(token > before, "{set:?}: {token} after {before} for {r}");
            }
        }
    }
    let client = pg.client().await;
    for (r, token) in last {
        let stored: i64 = client
            .query_one(
                "SELECT last_fence FROM redfence_fences WHERE resource = $1",
                &[&r],
            )
            .await
            .expect("select")
            .get(0);
        assert_eq!(stored as u64, token, "{r}");
    }
}
