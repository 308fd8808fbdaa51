//! Fencing tokens end to end: counters (memory, Redis, PostgreSQL) behind real
//! redis-server processes, and PostgreSQL rejecting a stale owner's write.
//!
//! The PostgreSQL tests need the `postgres` feature and the server binaries (see
//! `testkit/src/postgres.rs`); each starts a cluster of its own.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use redfence::{BoxError, Error, FencingCounter, FencingError, MemoryCounter, RedisCounter};
use support::{Servers, TestRedlock, eventually};

const TTL: Duration = Duration::from_secs(5);

fn names(r: &[&str]) -> Vec<String> {
    r.iter().map(|s| s.to_string()).collect()
}

/// Every lock node is free of every key: nothing was left locked.
async fn no_key_left(servers: &Servers) -> bool {
    eventually(|| (0..servers.len()).all(|i| servers.keys(i).is_empty())).await
}

/// A counter whose every call fails.
struct Failing;

impl FencingCounter for Failing {
    fn next_fence<'a>(&'a self, _: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>> {
        Box::pin(async { Err("the ledger database is read-only".into()) })
    }
}

/// A counter that answers after a delay (or never, with `None`).
struct Slow(Option<Duration>);

impl FencingCounter for Slow {
    fn next_fence<'a>(&'a self, _: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>> {
        let delay = self.0;
        Box::pin(async move {
            match delay {
                Some(delay) => tokio::time::sleep(delay).await,
                None => std::future::pending::<()>().await,
            }
            Ok(1)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Through acquire, with any counter
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn locks_carry_increasing_fences_and_multi_resource_fences_exceed_each_resource() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .fencing(MemoryCounter::new())
        .build()
        .expect("config");
    let fence = |resources: &'static [&'static str]| {
        let redlock = redlock.clone();
        async move {
            let lock = redlock.acquire(resources, TTL).await.expect("acquire");
            let fence = lock.fence().expect("a fence");
            lock.release().await.expect("release");
            fence
        }
    };
    let a1 = fence(&["a"]).await;
    let a2 = fence(&["a"]).await;
    let b1 = fence(&["b"]).await;
    assert!(a2 > a1);
    let ab = fence(&["a", "b"]).await;
    assert!(ab > a2 && ab > b1, "{ab} vs a {a2}, b {b1}");
    let b2 = fence(&["b"]).await;
    assert!(b2 > ab);
    let ca = fence(&["c", "a"]).await;
    assert!(ca > ab);

    // Without a counter, locks carry no fence.
    let plain = servers.redlock();
    let lock = plain.acquire(&["a"], TTL).await.expect("acquire");
    assert_eq!(lock.fence(), None);
    lock.release().await.expect("release");
}

#[tokio::test]
async fn a_failing_counter_fails_closed_and_leaves_no_key() {
    let servers = Servers::start(3);
    let redlock = servers.builder().fencing(Failing).build().expect("config");
    let err = redlock
        .acquire(&["invoice:1", "invoice:2"], TTL)
        .await
        .expect_err("no token, no lock");
    match &err {
        Error::Fencing(FencingError::Counter(e)) => {
            assert!(e.to_string().contains("read-only"), "{e}")
        }
        other => panic!("expected Fencing(Counter), got {other:?}"),
    }
    assert!(!err.is_retryable() && !err.is_lock_lost());
    assert!(err.to_string().contains("fencing"), "{err}");
    // The quorum was reached, then released on every node.
    assert!(no_key_left(&servers).await);
}

#[tokio::test]
async fn a_hanging_counter_hits_the_fencing_timeout() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .fencing(Slow(None))
        .fencing_timeout(Duration::from_millis(200))
        .build()
        .expect("config");
    let started = Instant::now();
    let err = redlock
        .acquire(&["job"], TTL)
        .await
        .expect_err("the counter never answers");
    assert!(
        matches!(err, Error::Fencing(FencingError::Timeout(t)) if t == Duration::from_millis(200)),
        "{err:?}"
    );
    // Not retried: one attempt, bounded by the fencing timeout (generous margin).
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(no_key_left(&servers).await);
}

#[tokio::test]
async fn a_counter_answering_after_the_lock_expired_fails_closed() {
    let servers = Servers::start(3);
    // The fencing timeout is long, but the lock's validity (~150 ms) bounds the call.
    let redlock = servers
        .builder()
        .fencing(Slow(Some(Duration::from_secs(2))))
        .fencing_timeout(Duration::from_secs(10))
        .build()
        .expect("config");
    let started = Instant::now();
    let err = redlock
        .acquire(&["job"], Duration::from_millis(150))
        .await
        .expect_err("expired before the token");
    assert!(
        matches!(err, Error::Fencing(FencingError::LockExpired)),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(no_key_left(&servers).await);
}

// ---------------------------------------------------------------------------------------------
// RedisCounter
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn redis_counter_is_monotonic_with_hash_tagged_keys() {
    let locks = Servers::start(3);
    let store = Servers::start(1);
    let redlock = locks
        .builder()
        .fencing(RedisCounter::open(&store.url(0)).expect("url"))
        .build()
        .expect("config");
    let mut last = 0;
    for _ in 0..5 {
        let lock = redlock
            .acquire(&["invoice:4821"], TTL)
            .await
            .expect("acquire");
        let fence = lock.fence().expect("fence");
        assert!(fence > last, "{fence} after {last}");
        last = fence;
        lock.release().await.expect("release");
    }
    assert_eq!(last, 5, "INCR semantics: 1, 2, 3, ...");
    // One counter key, on the designated primary only, hash-tagged.
    assert_eq!(store.keys(0), vec!["fence:{invoice:4821}".to_string()]);
    assert_eq!(store.get(0, "fence:{invoice:4821}").as_deref(), Some("5"));
    assert!(
        no_key_left(&locks).await,
        "counter keys went to the lock nodes"
    );

    // A configurable prefix.
    let counter = RedisCounter::open(&store.url(0))
        .expect("url")
        .prefix("app:fence:");
    assert_eq!(counter.key("x"), "app:fence:{x}");
    assert_eq!(counter.next_fence(&names(&["x"])).await.ok(), Some(1));
    assert_eq!(store.get(0, "app:fence:{x}").as_deref(), Some("1"));

    // Concurrent callers never get the same token.
    let counter = Arc::new(RedisCounter::open(&store.url(0)).expect("url"));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let mut got = Vec::new();
                for _ in 0..25 {
                    got.push(counter.next_fence(&names(&["hot"])).await.expect("fence"));
                }
                got
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        let got = task.await.expect("task");
        assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
        all.extend(got);
    }
    all.sort_unstable();
    assert_eq!(all, (1..=100).collect::<Vec<u64>>());
}

#[tokio::test]
async fn redis_counter_multi_resource_tokens_exceed_every_resource() {
    let store = Servers::start(1);
    let counter = RedisCounter::open(&store.url(0)).expect("url");
    let next = |r: &'static [&'static str]| {
        let resources = names(r);
        let counter = &counter;
        async move { counter.next_fence(&resources).await.expect("fence") }
    };
    for expected in 1..=10 {
        assert_eq!(next(&["a"]).await, expected);
    }
    assert_eq!(next(&["b"]).await, 1);
    // max(10, 1) + 1, stored in both.
    assert_eq!(next(&["a", "b"]).await, 11);
    assert_eq!(store.get(0, "fence:{a}").as_deref(), Some("11"));
    assert_eq!(store.get(0, "fence:{b}").as_deref(), Some("11"));
    assert_eq!(next(&["b"]).await, 12);
    // A new resource in a set: from the largest of the others.
    assert_eq!(next(&["c", "a"]).await, 12);
    assert_eq!(next(&["a", "b", "c"]).await, 13);
    for key in ["fence:{a}", "fence:{b}", "fence:{c}"] {
        assert_eq!(store.get(0, key).as_deref(), Some("13"), "{key}");
    }

    // A counter key that holds garbage fails closed, with a reason.
    let _: () = store.cmd(0, &["SET", "fence:{junk}", "not-a-number"]);
    let err = counter
        .next_fence(&names(&["a", "junk"]))
        .await
        .expect_err("garbage");
    assert!(
        err.to_string().contains("does not hold an integer"),
        "{err}"
    );
    let err = counter
        .next_fence(&names(&["junk"]))
        .await
        .expect_err("garbage");
    assert!(err.to_string().contains("fencing counter"), "{err}");
    // Nothing was written by the failed calls.
    assert_eq!(store.get(0, "fence:{a}").as_deref(), Some("13"));

    // The script survives a SCRIPT FLUSH (EVALSHA falls back to loading it).
    let _: () = store.cmd(0, &["SCRIPT", "FLUSH"]);
    assert_eq!(next(&["a", "b"]).await, 14);
}

/// Issue 15: requests that arrive while a script call is in flight go together in the next
/// one, handled in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_counter_coalesces_requests_behind_a_call_in_flight() {
    let store = Servers::start(1);
    let counter = RedisCounter::open(&store.url(0)).expect("url");
    // Connected, script loaded.
    assert_eq!(counter.next_fence(&names(&["warm"])).await.ok(), Some(1));
    let _: () = store.cmd(0, &["CONFIG", "RESETSTAT"]);

    // The server is frozen, so the first call stays in flight while the others queue.
    store.pause(0);
    let requests: Vec<Vec<String>> = (0..64).map(|j| names(&[&format!("r{}", j % 8)])).collect();
    let calls = futures::future::join_all(requests.iter().map(|r| counter.next_fence(r)));
    let resume = async { store.resume(0) };
    let (tokens, ()) = futures::join!(calls, resume);
    let tokens: Vec<u64> = tokens.into_iter().map(|t| t.expect("fence")).collect();

    // Per resource, in arrival order: 1, 2, ... 8.
    for r in 0..8 {
        let mine: Vec<u64> = tokens.iter().skip(r).step_by(8).copied().collect();
        assert_eq!(mine, (1..=8).collect::<Vec<u64>>(), "r{r}");
    }
    let info: String = store.cmd(0, &["INFO", "commandstats"]);
    let calls: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .expect("evalsha calls");
    // One call in flight when the server froze, then everything queued behind it.
    assert!(calls <= 2, "64 requests took {calls} script calls");
}

#[tokio::test]
async fn redis_counter_times_out_on_a_paused_primary() {
    let locks = Servers::start(3);
    let store = Servers::start(1);
    let counter = RedisCounter::open(&store.url(0))
        .expect("url")
        .timeout(Duration::from_millis(200));
    assert_eq!(counter.next_fence(&names(&["r"])).await.ok(), Some(1));

    store.pause(0);
    let started = Instant::now();
    let err = counter
        .next_fence(&names(&["r"]))
        .await
        .expect_err("paused");
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    // Through a lock: the lock manager's fencing_timeout fires first here, and the lock
    // is released.
    let slow_counter = RedisCounter::open(&store.url(0))
        .expect("url")
        .timeout(Duration::from_secs(30));
    let redlock = locks
        .builder()
        .fencing(slow_counter)
        .fencing_timeout(Duration::from_millis(300))
        .build()
        .expect("config");
    let err = redlock.acquire(&["r"], TTL).await.expect_err("paused");
    assert!(
        matches!(err, Error::Fencing(FencingError::Timeout(_))),
        "{err:?}"
    );
    assert!(no_key_left(&locks).await);

    store.resume(0);
    // The same counter recovers, and its tokens still grow (the timed-out call may or may
    // not have landed: a gap is fine).
    let deadline = Instant::now() + support::DEADLINE;
    let fence = loop {
        if let Ok(fence) = counter.next_fence(&names(&["r"])).await {
            break Some(fence);
        }
        assert!(Instant::now() < deadline, "the counter did not recover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(fence.is_some_and(|f| f >= 2), "{fence:?}");
    let lock = redlock.acquire(&["r"], TTL).await.expect("acquire");
    assert!(lock.fence() > fence);
    lock.release().await.expect("release");
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL
// ---------------------------------------------------------------------------------------------

#[cfg(feature = "postgres")]
mod pg {
    use super::*;

    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Mutex;

    use redfence::PostgresCounter;
    use redfence::fence::postgres::{FenceCheck, FenceGuards, FencedUpdate, FencedWriteError};
    use redfence::tokio_postgres::Client;
    use support::postgres::Postgres;
    use tokio::sync::oneshot;

    /// A lock's TTL short enough for a test to wait it out.
    const SHORT: Duration = Duration::from_millis(300);

    async fn next(counter: &PostgresCounter, r: &[&str]) -> u64 {
        counter.next_fence(&names(r)).await.expect("fence")
    }

    /// Runs the A/B story: A acquires and pauses past its TTL, B acquires, writes with
    /// `write` and releases, then A wakes up and writes with its own fence. Returns A's
    /// fence, B's fence and A's result.
    async fn stale_owner_story<W>(
        pg: &Postgres,
        write: W,
    ) -> (u64, u64, Result<u64, FencedWriteError>)
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

    #[tokio::test]
    async fn committed_fences_survive_a_crash_restart() {
        let mut pg = Postgres::start();
        let reconnecting = PostgresCounter::connect(&pg.url()).expect("config");
        let shared = PostgresCounter::new(pg.client().await);
        let mut last_a = 0;
        let mut last_b = 0;
        for i in 0..30 {
            let set: &[&str] = match i % 3 {
                0 => &["a"],
                1 => &["b"],
                _ => &["a", "b"],
            };
            let fence = next(&reconnecting, set).await;
            if set.contains(&"a") {
                assert!(fence > last_a);
                last_a = fence;
            }
            if set.contains(&"b") {
                assert!(fence > last_b);
                last_b = fence;
            }
        }
        let fence = next(&shared, &["a"]).await;
        assert!(fence > last_a);
        last_a = fence;

        // A crash: no checkpoint; the committed tokens come back from the WAL.
        pg.restart();

        let fresh = PostgresCounter::connect(&pg.url()).expect("config");
        let a = next(&fresh, &["a"]).await;
        assert!(a > last_a, "a: {a} after a restart, {last_a} before");
        let b = next(&fresh, &["b"]).await;
        assert!(b > last_b, "b: {b} after a restart, {last_b} before");
        let ab = next(&fresh, &["a", "b"]).await;
        assert!(ab > a && ab > b);

        // The counter that connected itself reconnects, and goes on from there.
        let again = next(&reconnecting, &["a", "b"]).await;
        assert!(again > ab);

        // A counter over a client the caller owns fails closed once that client's connection
        // is gone: reconnecting is the caller's job.
        let err = shared
            .next_fence(&names(&["a"]))
            .await
            .expect_err("its connection died");
        assert!(
            err.to_string().contains("PostgreSQL fencing counter"),
            "{err}"
        );
        let after = next(&PostgresCounter::new(pg.client().await), &["a"]).await;
        assert!(after > again);
    }

    #[tokio::test]
    async fn postgres_down_fails_closed_and_leaves_no_key() {
        let servers = Servers::start(3);
        let mut pg = Postgres::start();
        let redlock = servers
            .builder()
            .fencing(PostgresCounter::connect(&pg.url()).expect("config"))
            .build()
            .expect("config");
        let lock = redlock.acquire(&["job"], TTL).await.expect("acquire");
        let before = lock.fence().expect("fence");
        lock.release().await.expect("release");
        assert!(no_key_left(&servers).await);

        pg.stop_immediate();
        let started = Instant::now();
        let err = redlock
            .acquire(&["job"], TTL)
            .await
            .expect_err("no counter");
        match &err {
            // Connection refused (or reset, or timed out): either way, no token.
            Error::Fencing(FencingError::Counter(e)) => {
                assert!(e.to_string().contains("PostgreSQL fencing counter"), "{e}")
            }
            Error::Fencing(FencingError::Timeout(_)) => {}
            other => panic!("expected Error::Fencing, got {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(no_key_left(&servers).await);

        // Back up: the same lock manager works again, and tokens went on growing.
        pg.start_again();
        let lock = redlock.acquire(&["job"], TTL).await.expect("acquire");
        assert!(lock.fence().expect("fence") > before);
        lock.release().await.expect("release");
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

        // A resource seen for the first time gets its guard row.
        let tx = c1.transaction().await.expect("begin");
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

    fn patient(servers: &Servers, counter: PostgresCounter) -> redfence::Redlock {
        servers
            .builder()
            .fencing(counter.timeout(Duration::from_secs(20)))
            .fencing_timeout(Duration::from_secs(20))
            .node_timeout(Duration::from_millis(500))
            .build()
            .expect("config")
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
        let redlock = patient(&servers, counter);
        let batch: Vec<String> = (0..8).map(|i| format!("job:{i}")).collect();
        let mut handed_out = std::collections::HashMap::new();
        for r in batch.iter().map(String::as_str).chain(["gate"]) {
            let lock = redlock.acquire(&[r], LONG).await.expect("prime");
            handed_out.insert(r.to_owned(), lock.fence().expect("fence"));
            lock.release().await.expect("release");
        }

        // Batch 1 (the gate) waits in the server; the eight queue behind it.
        let gate = hold_rows(&pg, &["gate"]).await;
        let first = tokio::spawn({
            let redlock = redlock.clone();
            async move { redlock.acquire(&["gate"], LONG).await }
        });
        assert!(
            lock_waiters(&pg, 1).await,
            "batch 1 did not reach the server"
        );
        let held = hold_rows(&pg, &["job:3"]).await;
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
        let redlock = patient(&servers, counter);
        let resources = ["c:1", "c:2", "c:3", "c:4", "gate"];
        let mut before = std::collections::HashMap::new();
        for r in resources {
            let lock = redlock.acquire(&[r], LONG).await.expect("prime");
            before.insert(r, lock.fence().expect("fence"));
            lock.release().await.expect("release");
        }

        let gate = hold_rows(&pg, &["gate"]).await;
        let first = tokio::spawn({
            let redlock = redlock.clone();
            async move { redlock.acquire(&["gate"], LONG).await }
        });
        assert!(
            lock_waiters(&pg, 1).await,
            "batch 1 did not reach the server"
        );
        let held = hold_rows(&pg, &["c:1"]).await;
        let spawn = |r: &'static str| {
            let redlock = redlock.clone();
            tokio::spawn(async move { redlock.acquire(&[r], LONG).await })
        };
        let cancelled = spawn("c:1");
        let others = [spawn("c:2"), spawn("c:3"), spawn("c:4")];
        assert!(all_granted(&servers, &["c:1", "c:2", "c:3", "c:4"]).await);
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

    /// The counter's background task, and with it its connection, end when it is dropped.
    #[tokio::test]
    async fn dropping_the_counter_closes_its_connection() {
        let pg = Postgres::start();
        let client = pg.client().await;
        let backends = || async {
            client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'",
                    &[],
                )
                .await
                .expect("select")
                .get::<_, i64>(0)
        };
        let alone = backends().await;
        let counter = PostgresCounter::connect(&pg.url()).expect("config");
        next(&counter, &["r"]).await;
        assert_eq!(backends().await, alone + 1);
        drop(counter);
        let deadline = Instant::now() + support::DEADLINE;
        while backends().await > alone {
            assert!(
                Instant::now() < deadline,
                "the counter's connection is still open"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_paused_postgres_times_out_and_the_counter_recovers() {
        let servers = Servers::start(3);
        let mut pg = Postgres::start();
        let counter = Arc::new(
            PostgresCounter::connect(&pg.url())
                .expect("config")
                .timeout(Duration::from_millis(300)),
        );
        let before = next(&counter, &["r"]).await;

        pg.pause();
        let started = Instant::now();
        let err = counter
            .next_fence(&names(&["r"]))
            .await
            .expect_err("paused");
        assert!(err.to_string().contains("no answer within 300ms"), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );

        // Through a lock: fail closed, nothing left locked.
        let redlock = servers
            .builder()
            .fencing(counter.clone())
            .fencing_timeout(Duration::from_millis(200))
            .build()
            .expect("config");
        let err = redlock.acquire(&["r"], TTL).await.expect_err("paused");
        assert!(matches!(err, Error::Fencing(_)), "{err:?}");
        assert!(no_key_left(&servers).await);

        pg.resume();
        // The counter drops the connection it gave up on and connects again.
        let deadline = Instant::now() + support::DEADLINE;
        let after = loop {
            if let Ok(fence) = counter.next_fence(&names(&["r"])).await {
                break fence;
            }
            assert!(Instant::now() < deadline, "the counter did not recover");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(after > before);
        let lock = redlock.acquire(&["r"], TTL).await.expect("acquire");
        assert!(lock.fence().expect("fence") > after);
        lock.release().await.expect("release");
    }
}
