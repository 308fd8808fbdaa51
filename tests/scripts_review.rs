//! Adversarial review of two changes: the phase-fair read-write lock (`rw_op` in
//! `scripts/batch.lua`, `rwlock/acquire.rs`) and the bounded reads of lock values (`held()`
//! and the inline fast path of `batch.lua`, the advisory scripts, the plain-command path).
//!
//! Each test asserts a safety or liveness property; a failing test is an attack that worked.

mod support;

use std::time::{Duration, Instant};

use redfence::{Error, Redlock, RedlockBuilder};
use support::{Servers, TestRedlock};

const SCRIPT: &str = include_str!("../src/scripts/batch.lua");
const TTL: Duration = Duration::from_secs(10);

/// The base ACL line of docs/production.md (a user that locks under `locks:`).
const LOCKER_RULES: &str = "on >locker-secret resetkeys ~locks:* resetchannels \
     &redfence:released:locks:* -@all +evalsha +script|load +get +getrange +set \
     +pexpire +del +exists +publish +subscribe +unsubscribe +time +info";

/// docs/production.md: "read-write locks add `+zadd +zrem +zscore +zcard +zremrangebyscore
/// +pttl +time` (and `+zrangebyscore` to inspect them)": a user that does not inspect them.
const RWLOCK_RULES_WITHOUT_INSPECT: &str =
    "+zadd +zrem +zscore +zcard +zremrangebyscore +pttl +time";

/// The minimal rules of earlier versions (tests/acl.rs's OLD_LOCKER_RULES), which the library
/// still supports ("without them locks still work and waiters poll"), plus what the CHANGELOG
/// tells ACL users to add since (`+time +info` for the restart quarantine, `+getrange`).
const OLD_RULES_PLUS_GETRANGE: &str = "on >locker-secret resetkeys ~locks:* resetchannels -@all \
     +evalsha +script|load +get +set +pexpire +del +time +info +getrange";

/// `ACL SETUSER name rules...` on every server.
fn set_user(servers: &Servers, name: &str, rules: &str) {
    for i in 0..servers.len() {
        let mut args = vec!["ACL", "SETUSER", name];
        args.extend(rules.split_whitespace());
        servers.cmd::<()>(i, &args);
    }
}

/// Every server's URL with `user:password`.
fn urls_as(servers: &Servers, user: &str, password: &str) -> Vec<String> {
    (0..servers.len())
        .map(|i| format!("redis://{user}:{password}@127.0.0.1:{}", servers.port(i)))
        .collect()
}

fn acl_builder(urls: Vec<String>) -> RedlockBuilder {
    Redlock::builder()
        .nodes(urls)
        .key_prefix("locks:")
        .node_timeout(Duration::from_millis(500))
        .retry_delay(Duration::from_millis(20))
        .retry_jitter(Duration::from_millis(10))
        .acquire_timeout(Duration::from_secs(3))
}

// ---------------------------------------------------------------------------------------
// ACL users
// ---------------------------------------------------------------------------------------

/// A user on the minimal rules of earlier versions who adds `+getrange`, as the CHANGELOG
/// says ACL users do, takes a free lock over two resources. Before the bounded reads, `held()`
/// read a missing key with GET (nil: free). Now it reads it with GETRANGE ("" for a missing
/// key and an empty value alike) and tells them apart with `redis.pcall("EXISTS")`, which
/// this user may not run: the error reply is not `0`, so a missing key reads as another
/// owner's value (`false`) and every multi-key acquire is refused, forever.
#[tokio::test]
async fn attack_old_acl_rules_with_getrange_refuse_every_multi_key_lock() {
    let servers = Servers::start(3);
    set_user(&servers, "locker", OLD_RULES_PLUS_GETRANGE);
    let redlock = acl_builder(urls_as(&servers, "locker", "locker-secret"))
        .build()
        .expect("config");
    // A one-key lock works (SET NX on a free key needs no comparison).
    let one = redlock.acquire(&["solo"], TTL).await.expect("one key");
    one.release().await.expect("release");
    // Two free keys: nobody holds either.
    let both = redlock.acquire(&["a", "b"], TTL).await;
    for i in 0..servers.len() {
        assert_eq!(servers.get(i, "locks:a"), None, "a is free");
        assert_eq!(servers.get(i, "locks:b"), None, "b is free");
    }
    let lock = both.unwrap_or_else(|err| {
        panic!("two free keys refused to a user with the old rules and +getrange: {err}")
    });
    lock.release().await.expect("release");
}

/// The same user without `+getrange` (the rules of earlier versions, untouched) still takes
/// the two-key lock: the GET fallback needs no EXISTS. (Passing: the contrast to the attack
/// above.)
#[tokio::test]
async fn old_acl_rules_without_getrange_still_take_a_multi_key_lock() {
    let servers = Servers::start(3);
    let rules = OLD_RULES_PLUS_GETRANGE.replace(" +getrange", "");
    set_user(&servers, "locker", &rules);
    let redlock = acl_builder(urls_as(&servers, "locker", "locker-secret"))
        .build()
        .expect("config");
    let lock = redlock.acquire(&["a", "b"], TTL).await.expect("two free keys");
    lock.release().await.expect("release");
}

/// A user with the documented read-write lock rules, without `+zrangebyscore` (documented as
/// needed only to inspect read-write locks), takes the write of a free read-write lock.
/// Phase fairness made every write acquire call `live()`/`admitted()` (ZRANGEBYSCORE ...
/// LIMIT 0 1): the call is refused, the operation answers "E:NOPERM ...", and no writer is ever
/// granted (readers still are, so the writers starve for good).
#[tokio::test]
async fn attack_documented_rwlock_acl_rules_never_grant_a_writer() {
    let servers = Servers::start(3);
    set_user(
        &servers,
        "locker",
        &format!("{LOCKER_RULES} {RWLOCK_RULES_WITHOUT_INSPECT}"),
    );
    let redlock = acl_builder(urls_as(&servers, "locker", "locker-secret"))
        .build()
        .expect("config");
    let config = redlock.rwlock("config").expect("rwlock");
    let read = config.acquire_read(TTL).await.expect("a reader");
    read.release().await.expect("release the reader");
    let write = config.acquire_write(TTL).await;
    let write = write.unwrap_or_else(|err| {
        panic!("the write of a free read-write lock, with the documented rules: {err}")
    });
    write.release().await.expect("release the writer");
}

// ---------------------------------------------------------------------------------------
// Advisory reads bounded at 4096 bytes
// ---------------------------------------------------------------------------------------

/// A leader whose identity is long (nothing bounds it: `ElectionBuilder::build` refuses only an
/// empty one) is named by `Election::leader()`. The record `"{term} {token} {identity}"` is
/// read through `scripts/inspect.lua`, which now reads no string over 4096 bytes: a record
/// over that reads as "not a lock", so no node names the leader and `leader()` answers `None`
/// (and `observe()` says nobody leads) for as long as it leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_a_long_election_identity_hides_the_leader() {
    use std::sync::Arc;

    use redfence::{FencingCounter, MemoryCounter};
    let servers = Servers::start(3);
    let counter: Arc<dyn FencingCounter> = Arc::new(MemoryCounter::new());
    let redlock = servers
        .builder()
        .node_timeout(Duration::from_millis(500))
        .fencing(counter)
        .build()
        .expect("config");
    let identity = format!("host-{}", "x".repeat(5_000));
    let election = redlock
        .election("jobs", Some(&identity))
        .lease(Duration::from_secs(3))
        .renew_deadline(Duration::from_millis(1_500))
        .retry_period(Duration::from_millis(400))
        .build()
        .expect("an identity of 5 KB is accepted");
    let (tx, rx) = tokio::sync::oneshot::channel::<u64>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let leader = election.clone();
    let task = tokio::spawn(async move {
        let mut tx = Some(tx);
        let mut stop_rx = Some(stop_rx);
        leader
            .run(|leadership| {
                let tx = tx.take();
                let stop = stop_rx.take();
                async move {
                    if let Some(tx) = tx {
                        let _ = tx.send(leadership.term());
                    }
                    if let Some(stop) = stop {
                        let _ = stop.await;
                    }
                    Ok::<(), Error>(())
                }
            })
            .await
    });
    let term = tokio::time::timeout(Duration::from_secs(10), rx)
        .await
        .expect("elected within 10 s")
        .expect("term");
    // The record is written right after the term starts: give it a few renewals.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut named = None;
    while Instant::now() < deadline {
        named = election.leader().await.expect("read");
        if named.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    let named = named.unwrap_or_else(|| {
        panic!("leader() named nobody for 3 s while the candidate led term {term}")
    });
    assert_eq!(named.term, term);
    assert_eq!(named.identity, identity);
}

// ---------------------------------------------------------------------------------------
// Bounded reads: a value that is a prefix or an extension of a token, empty, or of another type
// ---------------------------------------------------------------------------------------

/// `scripts/batch.lua` run straight on server `i`: the raw replies.
fn batch(servers: &Servers, i: usize, keys: &[&str], args: &[&str]) -> Vec<redis::Value> {
    let mut conn = servers.conn(i);
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(SCRIPT).arg(keys.len());
    for k in keys {
        cmd.arg(*k);
    }
    for a in args {
        cmd.arg(*a);
    }
    cmd.query(&mut conn)
        .unwrap_or_else(|e| panic!("batch {args:?}: {e}"))
}

/// One operation's integer reply (an "E:" reply as -1).
fn one(servers: &Servers, i: usize, keys: &[&str], args: &[&str]) -> i64 {
    match batch(servers, i, keys, args).as_slice() {
        [redis::Value::Int(n)] => *n,
        [redis::Value::BulkString(e)] if e.starts_with(b"E:") => -1,
        other => panic!("{args:?}: {other:?}"),
    }
}

/// What `key` holds on server `i`: its type and, for a string, its value.
fn state(servers: &Servers, i: usize, key: &str) -> (String, Option<Vec<u8>>) {
    let kind: String = servers.cmd(i, &["TYPE", key]);
    let value = if kind == "string" {
        let mut conn = servers.conn(i);
        Some(redis::cmd("GET").arg(key).query(&mut conn).expect("GET"))
    } else {
        None
    };
    (kind, value)
}

/// Puts `value` at `key` on server 0: a string, or a hash for `None`.
fn put(servers: &Servers, key: &str, value: Option<&str>) {
    let _: i64 = servers.cmd(0, &["DEL", key]);
    match value {
        Some(v) => servers.cmd::<()>(0, &["SET", key, v, "PX", "60000"]),
        None => servers.cmd::<()>(0, &["HSET", key, "f", "v"]),
    }
}

/// On every server kind (Redis 7.0, Valkey 9, Redis 8), through every path of the script that
/// compares a lock key with a token (the inline one-key acquire, extend and release; several
/// keys; repair; fair mode; the read-write writer key): a key holding the token with a byte
/// more, the token less its last byte, an empty string, or a hash is never taken for ours, and
/// is left as it was. (Passing: a regression test of the bounded reads.)
#[test]
fn a_near_token_is_never_ours_on_any_path_or_server() {
    let token = "0123456789abcdef0123456789abcdef";
    let longer = format!("{token}x");
    let shorter = &token[..token.len() - 1];
    for (name, launch) in [
        ("Redis 7", support::Launch::default as fn() -> support::Launch),
        ("Valkey 9", support::valkey9),
        ("Redis 8", support::redis8),
    ] {
        let servers = Servers::start_launched(1, &[], |_| launch());
        for value in [Some(longer.as_str()), Some(shorter), Some(""), None] {
            let what = format!("{name}, value {value:?}");
            let ops: &[(&str, &[&str], &[&str])] = &[
                ("inline acquire", &["k"], &["a", token, "60000", "1"]),
                ("inline extend", &["k"], &["e", token, "60000", "1"]),
                ("inline release", &["k"], &["r", token, "60000", "1"]),
                ("two-key acquire", &["k", "k2"], &["a", token, "60000", "2"]),
                ("two-key extend", &["k", "k2"], &["e", token, "60000", "2"]),
                ("two-key release", &["k", "k2"], &["r", token, "60000", "2"]),
                ("repair", &["k"], &["E", token, "60000", "1"]),
                ("fair acquire", &["k"], &["f", token, "60000", "1", "w", "1", "5000"]),
                ("fair release", &["k"], &["R", token, "60000", "1", "w", "1", "5000"]),
            ];
            for (op, keys, args) in ops {
                put(&servers, "k", value);
                let _: i64 = servers.cmd(0, &["DEL", "k2"]);
                let before = state(&servers, 0, "k");
                let reply = one(&servers, 0, keys, args);
                assert!(reply <= 0, "{what}: {op} took it for ours (reply {reply})");
                assert_eq!(state(&servers, 0, "k"), before, "{what}: {op} changed it");
                if op.contains("acquire") {
                    assert_eq!(state(&servers, 0, "k2").0, "none", "{what}: {op} left k2");
                }
            }
            // The read-write lock's writer key.
            let rw = ["w", "rd", "ww"];
            for kind in ["wa", "we", "wr", "ra"] {
                put(&servers, "w", value);
                let before = state(&servers, 0, "w");
                let reply = one(&servers, 0, &rw, &[kind, token, "60000", "3", "x", "5000"]);
                assert!(reply <= 0, "{what}: {kind} beside that writer value (reply {reply})");
                assert_eq!(state(&servers, 0, "w"), before, "{what}: {kind} changed it");
                let live: Vec<String> = servers.cmd(0, &["ZRANGEBYSCORE", "rd", "0", "+inf"]);
                assert!(live.is_empty(), "{what}: {kind} made a reader {live:?}");
                let _: i64 = servers.cmd(0, &["DEL", "rd", "ww"]);
            }
        }
        // And the token itself is ours on every path (the comparison is not just "never").
        for (op, args) in [
            ("inline extend", ["e", token, "60000", "1"]),
            ("inline acquire (repeat)", ["a", token, "60000", "1"]),
            ("inline release", ["r", token, "60000", "1"]),
        ] {
            put(&servers, "k", Some(token));
            assert_eq!(one(&servers, 0, &["k"], &args), 1, "{name}: {op} of our token");
        }
    }
}

/// Plain commands (Valkey 9's DELIFEQ, Redis 8's DELEX, SET IFEQ, SET NX and the script run
/// after a refused SET NX) and the script (Redis 7.0), through the API: once every node's key
/// holds the lock's token with a byte more (or an empty string), the lock can no longer be
/// extended or released by its owner, and a new acquire is refused; the value stays as it was.
/// (Passing: a regression test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extended_or_emptied_value_is_not_the_owners_on_the_plain_path() {
    for (name, launch) in [
        ("Redis 7", support::Launch::default as fn() -> support::Launch),
        ("Valkey 9", support::valkey9),
        ("Redis 8", support::redis8),
    ] {
        let servers = Servers::start_launched(3, &[], |_| launch());
        let redlock = servers
            .builder()
            .node_timeout(Duration::from_secs(2))
            .retry_count(0)
            .build()
            .expect("config");
        // A release first: plain acquires go only after one went through.
        support::warm_up(&redlock).await;
        for suffix in ["x", ""] {
            let mut lock = redlock.acquire(&["job"], TTL).await.expect("free");
            let token = lock.token().to_owned();
            let planted = if suffix.is_empty() {
                String::new()
            } else {
                format!("{token}{suffix}")
            };
            for i in 0..3 {
                servers.cmd::<()>(i, &["SET", "job", &planted, "KEEPTTL"]);
            }
            let extended = lock.extend(TTL).await;
            assert!(
                extended.is_err(),
                "{name}: extended over {planted:?}: {extended:?}"
            );
            let _ = lock.release().await;
            let other = redlock.acquire(&["job"], TTL).await;
            assert!(
                matches!(other, Err(Error::Contended { .. })),
                "{name}: a new acquire over {planted:?}: {other:?}"
            );
            for i in 0..3 {
                assert_eq!(
                    servers.get(i, "job").as_deref(),
                    Some(planted.as_str()),
                    "{name}: node {i}'s value"
                );
            }
            for i in 0..3 {
                let _: i64 = servers.cmd(i, &["DEL", "job", "job:redfence:waiting"]);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Outside the two changes: the restart quarantine's ACL fallback on Valkey 9 and Redis 8
// ---------------------------------------------------------------------------------------

/// docs/production.md: "`+time` and `+info` serve the restart quarantine: without them it is
/// off for that server". A user of the documented rules less `+time` locks on Redis 7.0, whose
/// in-script ACL error says "can't run this command" (`Identity::memory_refused_by` knows
/// it). Valkey 9 and Redis 8 word it "ERR ACL failure in script: User ... has no permissions
/// to run the 'time' command": not recognised as a refusal for good, the memory script's
/// failure counts as passing, and every node stays quarantined ("for another 1s") forever.
#[tokio::test]
async fn attack_without_time_every_valkey9_and_redis8_node_is_quarantined_forever() {
    for (name, launch) in [
        ("Valkey 9", support::valkey9 as fn() -> support::Launch),
        ("Redis 8", support::redis8),
    ] {
        let servers = Servers::start_launched(3, &[], |_| launch());
        set_user(&servers, "locker", &LOCKER_RULES.replace(" +time", ""));
        let redlock = acl_builder(urls_as(&servers, "locker", "locker-secret"))
            .build()
            .expect("config");
        let deadline = Instant::now() + Duration::from_secs(5);
        let lock = loop {
            match redlock.acquire(&["solo"], TTL).await {
                Ok(lock) => break lock,
                Err(err) if Instant::now() < deadline => {
                    let _ = err;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(err) => panic!("{name}: a free lock, without +time, for 5 s: {err}"),
            }
        };
        lock.release().await.expect("release");
    }
}
