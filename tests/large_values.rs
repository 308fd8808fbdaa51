//! A large foreign value at a lock key (2 MiB) costs the server what any refusal costs: no
//! command reads it into a script or sends it back. Refused acquires, and extensions and
//! releases by a lock that lost its key to such a value, on the script path (the default
//! server, Redis 7) and the plain path (Valkey 9, Redis 8); the advisory reads (inspect,
//! force release, a read-write lock's inspect, a semaphore's size) beside them. Each run
//! checks every node's `SLOWLOG` (nothing over 2 ms, but for a command or two the scheduler
//! paused) and the bytes it sent (`INFO stats`).

mod support;

use std::time::Duration;

use redfence::{Error, KeyState, Redlock};
use support::{Launch, Servers, TestRedlock, redis8, valkey9};

const TTL: Duration = Duration::from_secs(10);
/// The foreign value's size.
const LARGE: usize = 2 << 20;
/// What `SLOWLOG` keeps: commands that took the server longer than this (µs).
const SLOW_US: &str = "2000";
/// The most bytes a node may send in a whole run: a few replies per call, far below one
/// large value (a refusal that sent it back would send 2 MiB).
const MOST_SENT: u64 = 512 << 10;
/// How many slow commands a node may log, whatever the keys hold: a command the scheduler
/// pauses. (Reading the large value, each of the 30+ calls per node was slow.)
const NOISE: usize = 2;
/// The name of the harness's own connections, whose commands (writing the large values) are
/// no concern of the checks.
const HARNESS: &str = "harness";

/// A server kind, and how to start it.
#[derive(Clone, Copy)]
struct Kind {
    name: &'static str,
    launch: fn() -> Launch,
}

/// The default server (`REDIS_SERVER`; Redis 7 has no compare-and-delete: every call is the
/// script) and both servers with plain commands.
const KINDS: [Kind; 3] = [
    Kind {
        name: "default",
        launch: Launch::default,
    },
    Kind {
        name: "Valkey 9",
        launch: valkey9,
    },
    Kind {
        name: "Redis 8",
        launch: redis8,
    },
];

/// A connection to server `i`, named [`HARNESS`].
fn harness(servers: &Servers, i: usize) -> redis::Connection {
    let mut conn = servers.conn(i);
    let _: () = redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg(HARNESS)
        .query(&mut conn)
        .expect("CLIENT SETNAME");
    conn
}

/// Writes a [`LARGE`] value at each of `keys` on every node.
fn put_large(servers: &Servers, keys: &[&str]) {
    let value = vec![b'x'; LARGE];
    for i in 0..servers.len() {
        let mut conn = harness(servers, i);
        for key in keys {
            let _: () = redis::cmd("SET")
                .arg(*key)
                .arg(&value[..])
                .query(&mut conn)
                .expect("SET");
        }
    }
}

/// Every script redfence runs on a lock's keys. Loaded by the harness before the checks:
/// compiling one (a first `SCRIPT LOAD`) can take longer than [`SLOW_US`] whatever the keys
/// hold (40 ms seen on Valkey 8.1).
const SCRIPTS: [&str; 4] = [
    include_str!("../src/scripts/batch.lua"),
    include_str!("../src/scripts/inspect.lua"),
    include_str!("../src/scripts/claim.lua"),
    include_str!("../src/scripts/rwlock_inspect.lua"),
];

/// Starts watching every node: `SLOWLOG` keeps commands over [`SLOW_US`], emptied now; and
/// the bytes each node has sent so far. The scripts are loaded first.
fn watch(servers: &Servers) -> Vec<u64> {
    (0..servers.len())
        .map(|i| {
            let mut conn = harness(servers, i);
            for script in SCRIPTS {
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(script)
                    .query::<String>(&mut conn)
                    .expect("SCRIPT LOAD");
            }
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("slowlog-log-slower-than")
                .arg(SLOW_US)
                .query::<()>(&mut conn)
                .expect("CONFIG SET");
            redis::cmd("SLOWLOG")
                .arg("RESET")
                .query::<()>(&mut conn)
                .expect("SLOWLOG RESET");
            sent(&mut conn)
        })
        .collect()
}

/// The bytes a node has sent its clients (`total_net_output_bytes`).
fn sent(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query(conn)
        .expect("INFO stats");
    info.lines()
        .find_map(|l| l.strip_prefix("total_net_output_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_net_output_bytes")
}

/// Checks every node since [`watch`]: no more than [`NOISE`] commands but the harness's took
/// over [`SLOW_US`], and the node sent less than [`MOST_SENT`].
fn check(servers: &Servers, before: &[u64], what: &str) {
    for (i, before) in before.iter().enumerate() {
        let mut conn = harness(servers, i);
        let sent = sent(&mut conn) - before;
        assert!(
            sent < MOST_SENT,
            "{what}: node {i} sent {sent} bytes: a large value went back"
        );
        let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(1000)
            .query(&mut conn)
            .expect("SLOWLOG GET");
        let slow: Vec<String> = entries
            .iter()
            .filter_map(|entry| match entry {
                // id, time, duration (µs), arguments, client address, client name.
                redis::Value::Array(fields) => {
                    let name = match fields.get(5) {
                        Some(redis::Value::BulkString(name)) => {
                            String::from_utf8_lossy(name).into_owned()
                        }
                        _ => String::new(),
                    };
                    (name != HARNESS).then(|| format!("{fields:?}"))
                }
                _ => None,
            })
            .collect();
        // A command the scheduler paused (two cores shared with the client and the other
        // nodes) may pass 2 ms now and then; a large value read made every refusal slow.
        assert!(
            slow.len() <= NOISE,
            "{what}: node {i}: slow commands {slow:?}"
        );
        let length: usize = redis::cmd("STRLEN")
            .arg("big")
            .query(&mut conn)
            .expect("STRLEN");
        assert_eq!(length, LARGE, "{what}: node {i}: the value is untouched");
    }
}

/// A Redlock over `servers` that makes one attempt per acquisition, with patient nodes; a
/// lock taken and released first through every node (plain acquires go plain only after a
/// release went through).
async fn primed(servers: &Servers) -> Redlock {
    let redlock = servers
        .builder()
        .retry_count(0)
        .node_timeout(Duration::from_secs(5))
        .build()
        .expect("config");
    redlock
        .using(&["prime"], TTL, |_| async { Ok::<_, Error>(()) })
        .await
        .expect("prime");
    redlock
}

/// 30 refused acquisitions of a key holding 2 MiB, and 10 locks whose key another writer
/// replaced with 2 MiB (their extension fails, their release deletes nothing): no command over
/// 2 ms on any node (but scheduler noise), no value sent back, the value untouched. On the script path and on the
/// plain path (where a refused `SET … NX GET` sent the value back on every refusal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_extensions_and_releases_never_read_a_large_value() {
    for kind in KINDS {
        let servers = Servers::start_launched(3, &[], |_| (kind.launch)());
        let redlock = primed(&servers).await;
        let replaced: Vec<String> = (0..10).map(|r| format!("src:{r}")).collect();
        let mut keys = vec!["big"];
        keys.extend(replaced.iter().map(String::as_str));
        put_large(&servers, &keys);
        let before = watch(&servers);

        for _ in 0..30 {
            match redlock.try_acquire(&["big"], TTL).await {
                Err(Error::Contended { .. }) => {}
                other => panic!("{}: expected Contended, got {other:?}", kind.name),
            }
        }
        for (r, source) in replaced.iter().enumerate() {
            let key = format!("lost:{r}");
            let mut lock = redlock
                .acquire(&[key.as_str()], TTL)
                .await
                .expect("acquire");
            // Another writer's value takes the key (RENAME: the harness writes no 2 MiB now).
            for i in 0..servers.len() {
                let mut conn = harness(&servers, i);
                let _: () = redis::cmd("RENAME")
                    .arg(source)
                    .arg(&key)
                    .query(&mut conn)
                    .expect("RENAME");
            }
            match lock.extend(TTL).await {
                Err(Error::LockLost { .. }) => {}
                other => panic!("{}: expected LockLost, got {other:?}", kind.name),
            }
            let _ = lock.release().await;
            for i in 0..servers.len() {
                let length: usize = servers.cmd(i, &["STRLEN", &key]);
                assert_eq!(length, LARGE, "{}: node {i}: {key} untouched", kind.name);
            }
        }
        check(&servers, &before, kind.name);
    }
}

/// The advisory reads of a key holding 2 MiB read no more than a token's worth of it: inspect
/// and force release report a value that is not a lock (and force release deletes it), a
/// read-write lock whose writer key holds one refuses both sides and reports its size, and a
/// semaphore whose size key holds one reports its size in the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_reads_report_a_large_value_without_reading_it() {
    let servers = Servers::start(3);
    let redlock = primed(&servers).await;
    put_large(
        &servers,
        &["big", "gone", "doc:rwlock:writer", "jobs:semaphore:size"],
    );
    let before = watch(&servers);

    let report = redlock.inspect(&["big"]).await.expect("inspect");
    for node in &report.nodes {
        match node.keys.as_deref() {
            Ok([KeyState::Foreign { kind, .. }]) => assert_eq!(kind, "string"),
            other => panic!("node {}: {other:?}", node.index),
        }
    }
    assert_eq!(report.view(0).foreign, 3, "{report:?}");
    let forced = redlock.force_release(&["gone"]).await.expect("force");
    assert_eq!(forced.view(0).foreign, 3, "{forced:?}");
    for i in 0..servers.len() {
        assert_eq!(
            servers.pttl(i, "gone"),
            -2,
            "node {i}: force release deletes it"
        );
    }

    let doc = redlock.rwlock("doc").expect("rwlock");
    for result in [
        doc.try_acquire_read(TTL).await.map(drop),
        doc.try_acquire_write(TTL).await.map(drop),
    ] {
        assert!(matches!(result, Err(Error::Contended { .. })), "{result:?}");
    }
    let report = doc.inspect().await.expect("inspect");
    assert_eq!(report.writer(), Some("<2097152"), "{report:?}");

    let jobs = redlock.semaphore("jobs", 2).expect("semaphore");
    match jobs.acquire(TTL).await {
        Err(Error::SemaphoreSize { stored, .. }) => assert_eq!(stored, "<2097152 bytes>"),
        other => panic!("expected SemaphoreSize, got {other:?}"),
    }
    check(&servers, &before, "advisory reads");
}
