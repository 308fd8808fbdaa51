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

/// A user on the minimal rules of earlier versions takes a free lock over two resources; once
/// it is given `+getrange`, as the CHANGELOG tells ACL users to, it never can again. Before the
/// bounded reads, `held()` read a missing key with GET (nil: free), and it still does for a
/// user without `+getrange`. With it, `held()` reads GETRANGE ("" for a missing key and an
/// empty value alike) and tells them apart with `redis.pcall("EXISTS", key) == 0`, which this
/// user may not run: the error table is not `0`, so a missing key reads as another owner's
/// value (`false`), and every multi-key acquire (and every repair of a missing key, "E") is
/// refused, forever. (The multi-key acquire's own `pcall("EXISTS", ...)` fails the same way
/// and sends it to that per-key check.)
#[tokio::test]
async fn attack_old_acl_rules_with_getrange_refuse_every_multi_key_lock() {
    let servers = Servers::start(3);
    set_user(
        &servers,
        "locker",
        &OLD_RULES_PLUS_GETRANGE.replace(" +getrange", ""),
    );
    let redlock = acl_builder(urls_as(&servers, "locker", "locker-secret"))
        .build()
        .expect("config");
    let lock = redlock
        .acquire(&["a", "b"], TTL)
        .await
        .expect("two free keys, without +getrange (GET)");
    lock.release().await.expect("release");
    // The same user, given +getrange.
    set_user(&servers, "locker", "+getrange");
    let one = redlock.acquire(&["solo"], TTL).await.expect("one key");
    one.release().await.expect("release");
    let both = redlock.acquire(&["a", "b"], TTL).await;
    for i in 0..servers.len() {
        assert_eq!(servers.get(i, "locks:a"), None, "a is free");
        assert_eq!(servers.get(i, "locks:b"), None, "b is free");
    }
    let lock = both.unwrap_or_else(|err| {
        panic!("two free keys refused once the user may run GETRANGE: {err}")
    });
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
        (
            "Redis 7",
            support::Launch::default as fn() -> support::Launch,
        ),
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
                (
                    "fair acquire",
                    &["k"],
                    &["f", token, "60000", "1", "w", "1", "5000"],
                ),
                (
                    "fair release",
                    &["k"],
                    &["R", token, "60000", "1", "w", "1", "5000"],
                ),
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
                assert!(
                    reply <= 0,
                    "{what}: {kind} beside that writer value (reply {reply})"
                );
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
            assert_eq!(
                one(&servers, 0, &["k"], &args),
                1,
                "{name}: {op} of our token"
            );
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
        (
            "Redis 7",
            support::Launch::default as fn() -> support::Launch,
        ),
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
        // The control: Redis 7.0 names the refusal as the code expects, and the lock is granted.
        (
            "Redis 7",
            support::Launch::default as fn() -> support::Launch,
        ),
        ("Valkey 9", support::valkey9),
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

// ---------------------------------------------------------------------------------------
// The phase-fair rule on one node, under a random schedule
// ---------------------------------------------------------------------------------------

/// A small deterministic generator (no dependency): xorshift64*.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A read-write operation of `scripts/batch.lua` on server 0's lock keys: its integer reply.
fn rw(
    conn: &mut redis::Connection,
    kind: &str,
    token: &str,
    ttl: u64,
    waiter: &str,
    wait: u64,
) -> i64 {
    let keys = [
        "l:rwlock:writer",
        "l:rwlock:readers",
        "l:rwlock:writer_waiting",
    ];
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(redis::Script::new(SCRIPT).get_hash())
        .arg(3)
        .arg(&keys[..]);
    cmd.arg(kind)
        .arg(token)
        .arg(ttl)
        .arg(3)
        .arg(waiter)
        .arg(wait);
    match cmd.query::<Vec<redis::Value>>(conn) {
        Ok(replies) => match replies.as_slice() {
            [redis::Value::Int(n)] => *n,
            other => panic!("{kind} {token}: {other:?}"),
        },
        Err(e) => panic!("{kind} {token}: {e}"),
    }
}

/// Three writers and four readers, each an acquisition after another (a waiter id each, a
/// token per attempt, attempts sometimes sent twice as after a lost connection, holds that
/// end by release or by expiry, waiters that give up), in a random order on one node, with
/// short TTLs and waits so that holds and places expire under the run. After every operation:
/// no writer key beside a live reader, no lock key without a TTL, no registration that lives
/// past its waiter's wait; and every acquisition is eventually granted (no place or mark
/// left behind blocks anyone for longer than a wait). (Passing: a regression test.)
#[test]
fn the_per_node_rule_holds_under_a_random_schedule() {
    let servers = Servers::start(1);
    let mut conn = servers.conn(0);
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SCRIPT)
        .query(&mut conn)
        .expect("load");
    const WAIT: u64 = 300;
    #[derive(Clone, Default)]
    struct Actor {
        write: bool,
        waiter: String,
        token: String,
        held: bool,
        waiting_since: Option<Instant>,
    }
    let mut actors: Vec<Actor> = (0..7)
        .map(|i| Actor {
            write: i < 3,
            ..Actor::default()
        })
        .collect();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut serial = 0u64;
    let mut longest = Duration::ZERO;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(8) {
        let i = rng.below(actors.len() as u64) as usize;
        let a = &mut actors[i];
        let (side, ttl) = (if a.write { "w" } else { "r" }, 50 + rng.below(200));
        if a.held {
            match rng.below(4) {
                0 => {
                    rw(
                        &mut conn,
                        &format!("{side}e"),
                        &a.token,
                        ttl,
                        &a.waiter,
                        WAIT,
                    );
                }
                1 | 2 => {
                    rw(
                        &mut conn,
                        &format!("{side}r"),
                        &a.token,
                        ttl,
                        &a.waiter,
                        WAIT,
                    );
                    if rng.below(3) == 0 {
                        // Resent after a lost connection.
                        rw(
                            &mut conn,
                            &format!("{side}r"),
                            &a.token,
                            ttl,
                            &a.waiter,
                            WAIT,
                        );
                    }
                    if a.write {
                        rw(&mut conn, "wl", &a.waiter, ttl, &a.waiter, WAIT);
                    }
                    a.held = false;
                }
                _ => {
                    // Holds on (or lets it expire).
                }
            }
        } else {
            if a.waiting_since.is_none() {
                serial += 1;
                a.waiter = format!("waiter-{serial}");
                a.waiting_since = Some(Instant::now());
            }
            serial += 1;
            a.token = format!("token-{serial}");
            let mut granted = rw(
                &mut conn,
                &format!("{side}a"),
                &a.token,
                ttl,
                &a.waiter,
                WAIT,
            );
            if rng.below(4) == 0 {
                granted = rw(
                    &mut conn,
                    &format!("{side}a"),
                    &a.token,
                    ttl,
                    &a.waiter,
                    WAIT,
                );
            }
            if granted == 1 {
                if a.write {
                    rw(&mut conn, "wl", &a.waiter, ttl, &a.waiter, WAIT);
                }
                let waited = a.waiting_since.take().expect("waiting").elapsed();
                longest = longest.max(waited);
                a.held = true;
            } else if rng.below(20) == 0 {
                // Gives up: its leave.
                let leave = if a.write { "wl" } else { "rr" };
                rw(&mut conn, leave, &a.waiter, ttl, &a.waiter, WAIT);
                a.waiting_since = None;
            }
        }
        // The invariants.
        let writer: Option<String> = redis::cmd("GET")
            .arg("l:rwlock:writer")
            .query(&mut conn)
            .expect("GET");
        let now: (u64, u64) = redis::cmd("TIME").query(&mut conn).expect("TIME");
        let now_ms = now.0 * 1000 + now.1 / 1000;
        let live: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg("l:rwlock:readers")
            .arg(format!("({now_ms}"))
            .arg("+inf")
            .query(&mut conn)
            .expect("ZRANGEBYSCORE");
        assert!(
            writer.is_none() || live.is_empty(),
            "writer {writer:?} beside live readers {live:?}"
        );
        for key in [
            "l:rwlock:writer",
            "l:rwlock:readers",
            "l:rwlock:writer_waiting",
        ] {
            let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).expect("PTTL");
            assert_ne!(pttl, -1, "{key} has no TTL");
        }
        let places: Vec<(String, f64)> = redis::cmd("ZRANGEBYSCORE")
            .arg("l:rwlock:readers")
            .arg("-inf")
            .arg("(0")
            .arg("WITHSCORES")
            .query(&mut conn)
            .expect("places");
        for (place, score) in places {
            let end = if score < -1e15 {
                -(score + 1e15)
            } else {
                -score
            };
            assert!(
                end <= (now_ms + WAIT + 5) as f64,
                "{place} lives until {end}, past now {now_ms} + the wait"
            );
        }
    }
    // Nobody's wait was unbounded: a writer's hold (under 250 ms) and a few waits at most.
    assert!(
        longest < Duration::from_secs(3),
        "an acquisition waited {longest:?}"
    );
    for (i, a) in actors.iter().enumerate() {
        if let Some(since) = a.waiting_since {
            assert!(
                since.elapsed() < Duration::from_secs(3),
                "actor {i} still waits since {:?}",
                since.elapsed()
            );
        }
    }
}
