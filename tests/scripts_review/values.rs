//! Bounded reads: a value that is a prefix or an extension of a token, empty, or of another
//! type is never taken for the owner's, on every path and server.

use std::time::Duration;

use redfence::Error;

use super::{SCRIPT, TTL};
use crate::support::{self, Servers, TestRedlock};

// ---------------------------------------------------------------------------------------
// Bounded reads: a value that is a prefix or an extension of a token, empty, or of another type
// ---------------------------------------------------------------------------------------

/// `scripts/batch.lua` run straight on server `i`: the raw replies.
pub(super) fn batch(
    servers: &Servers,
    i: usize,
    keys: &[&str],
    args: &[&str],
) -> Vec<redis::Value> {
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
