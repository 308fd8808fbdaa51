//! `scripts/batch.lua` run straight on a real redis-server: each acquire by what its keys
//! already hold, each release by its own token in batch order, and the fair queue on inputs that once aborted the whole batched script (so
//! every other lock in the call failed on that node, and writes made before the error
//! stayed): a queue name that holds another type, thousands of dead waiters, a huge node
//! timeout; a resent fair acquire that had already landed, and a failed one that keeps its
//! place.

mod support;

use std::time::Duration;

use redfence::Redlock;
use support::{Servers, TestRedlock};

const SCRIPT: &str = include_str!("../src/scripts/batch.lua");

/// Runs the batch script on server `i` with `keys` and `args`, returning the raw result.
fn batch(
    servers: &Servers,
    i: usize,
    keys: &[&str],
    args: &[&str],
) -> redis::RedisResult<Vec<redis::Value>> {
    let client = redis::Client::open(servers.url(i)).expect("client");
    let mut conn = client.get_connection().expect("connection");
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(SCRIPT).arg(keys.len());
    for k in keys {
        cmd.arg(*k);
    }
    for a in args {
        cmd.arg(*a);
    }
    cmd.query(&mut conn)
}

/// A connection to server 0 for listening, whose reads give up after `timeout`.
fn listener(servers: &Servers, timeout: Duration) -> redis::Connection {
    let listener = servers.conn(0);
    listener
        .set_read_timeout(Some(timeout))
        .expect("read timeout");
    listener
}

/// A fair acquire on a resource whose queue name holds another type (here a plain string,
/// e.g. another lock on the resource named `x:redfence:queue`) is that operation's own error,
/// as a wrong-type resource key is; the locks batched with it are unaffected, and a fair
/// release of that resource still deletes its key.
#[test]
fn a_wrong_type_queue_key_fails_only_its_own_fair_acquire() {
    let servers = Servers::start(1);
    let _: () = servers.cmd(0, &["SET", "x:redfence:queue", "someone-else"]);
    let replies = batch(
        &servers,
        0,
        &["k1", "x", "k2"],
        &[
            "a", "tok1", "60000", "1", //
            "f", "tok2", "60000", "1", "waiter", "1", "5000", //
            "a", "tok3", "60000", "1",
        ],
    );
    let replies = replies
        .unwrap_or_else(|e| panic!("the whole batch failed for one fair acquire's queue key: {e}"));
    assert_eq!(replies.len(), 3, "{replies:?}");
    assert_eq!(replies[0], redis::Value::Int(1));
    match &replies[1] {
        redis::Value::BulkString(e) => assert!(
            String::from_utf8_lossy(e).starts_with("E:WRONGTYPE"),
            "{replies:?}"
        ),
        other => panic!("the fair acquire's own error, got {other:?}"),
    }
    assert_eq!(replies[2], redis::Value::Int(1));

    // A fair lock's release ("R") on such a resource still releases.
    let _: () = servers.cmd(0, &["SET", "x", "tok2"]);
    let replies = batch(
        &servers,
        0,
        &["x", "k1"],
        &[
            "R", "tok2", "0", "1", "waiter", "1", "5000", //
            "r", "tok1", "0", "1",
        ],
    )
    .expect("the batch runs");
    assert_eq!(replies, vec![redis::Value::Int(1), redis::Value::Int(1)]);
    assert_eq!(servers.cmd::<Option<String>>(0, &["GET", "x"]), None);
}

/// More dead waiters than Lua's `unpack` takes at once (about 8,000, e.g. as many crashed
/// processes, or a node's clock stepped past their leases) are all dropped, and the only live
/// waiter is granted: the queue is not wedged.
#[test]
fn many_dead_waiters_do_not_wedge_a_fair_queue() {
    let servers = Servers::start(1);
    let client = redis::Client::open(servers.url(0)).expect("client");
    let mut conn = client.get_connection().expect("connection");
    let mut queue = redis::cmd("ZADD");
    queue.arg("hot:redfence:queue");
    let mut alive = redis::cmd("ZADD");
    alive.arg("hot:redfence:alive");
    for n in 0..9_000 {
        let member = format!("crashed-{n}");
        queue.arg(1).arg(&member);
        // Lease ended long ago.
        alive.arg(1).arg(&member);
    }
    let _: i64 = queue.query(&mut conn).expect("ZADD queue");
    let _: i64 = alive.query(&mut conn).expect("ZADD alive");
    let _: () = servers.cmd(0, &["PEXPIRE", "hot:redfence:queue", "5000"]);
    let _: () = servers.cmd(0, &["PEXPIRE", "hot:redfence:alive", "5000"]);
    let replies = batch(
        &servers,
        0,
        &["hot"],
        &["f", "tok", "60000", "1", "waiter", "2", "5000"],
    );
    let replies = replies.unwrap_or_else(|e| {
        let card: i64 = servers.cmd(0, &["ZCARD", "hot:redfence:queue"]);
        panic!("a fair acquire on a free key failed with {card} waiters still queued: {e}")
    });
    assert_eq!(
        replies,
        vec![redis::Value::Int(1)],
        "the only live waiter is granted"
    );
}

/// Fair mode with a huge `node_timeout` (accepted by `build()`): the waiter's lease is capped
/// to what the nodes take as an integer, so a free lock is granted, and no queue is left
/// without a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mode_with_a_huge_node_timeout_grants_a_free_lock() {
    let servers = Servers::start(3);
    let plain: Redlock = servers
        .builder()
        .node_timeout(Duration::MAX)
        .build()
        .expect("config");
    let lock = plain
        .try_acquire(&["control"], Duration::from_secs(10))
        .await
        .expect("the pipeline itself works with a huge node_timeout");
    lock.release().await.expect("release");

    let fair: Redlock = servers
        .builder()
        .fair(true)
        .node_timeout(Duration::MAX)
        .build()
        .expect("config");
    let result = fair.try_acquire(&["free"], Duration::from_secs(10)).await;
    assert!(
        result.is_ok(),
        "a free key refused in fair mode with a huge node_timeout: {result:?}"
    );
    for n in 0..3 {
        for name in ["free:redfence:queue", "free:redfence:alive"] {
            let pttl: i64 = servers.cmd(n, &["PTTL", name]);
            assert!(pttl == -2 || pttl > 0, "{name} on node {n}: PTTL {pttl}");
        }
    }
}

/// A fair acquire resent after a lost connection, when the first one had landed (granted), is
/// granted again even though another waiter with an earlier ticket queued meanwhile: the lock
/// is ours on that node, and a refusal would keep the clean-up release from deleting it.
#[test]
fn a_resent_fair_acquire_that_had_landed_is_granted_again() {
    let servers = Servers::start(1);
    let fair = |waiter: &'static str, ticket: &'static str, token: &'static str| {
        ["f", token, "60000", "1", waiter, ticket, "5000"]
    };
    let first = batch(&servers, 0, &["res"], &fair("w-late", "20", "tok")).expect("batch");
    assert_eq!(first, vec![redis::Value::Int(1)], "a free key is granted");
    // Another waiter, with an earlier ticket, queues behind the holder.
    let other = batch(&servers, 0, &["res"], &fair("w-early", "10", "tok-other")).expect("batch");
    assert_eq!(other, vec![redis::Value::Int(0)], "the key is held");
    let again = batch(&servers, 0, &["res"], &fair("w-late", "20", "tok")).expect("batch");
    assert_eq!(again, vec![redis::Value::Int(1)], "the repeat is granted");
    let queue: Vec<String> = servers.cmd(0, &["ZRANGE", "res:redfence:queue", "0", "-1"]);
    assert_eq!(
        queue,
        vec!["w-early".to_owned(), "w-late".to_owned()],
        "both stay in line, by ticket, until they release or leave"
    );
}

/// A fair waiter granted on this node whose attempt failed on the others releases with a
/// plain "r" (the clean-up of a failed attempt) and keeps its place: the release names it as
/// the next waiter, and a later waiter is still not served before it.
#[test]
fn a_failed_fair_attempt_keeps_its_place_in_line() {
    let servers = Servers::start(1);
    let mut listener = listener(&servers, Duration::from_secs(5));
    let mut pubsub = listener.as_pubsub();
    pubsub
        .subscribe("redfence:released:res")
        .expect("subscribe");
    let fair = |waiter: &'static str, ticket: &'static str, token: &'static str| {
        ["f", token, "60000", "1", waiter, ticket, "5000"]
    };
    let run = |args: &[&str]| batch(&servers, 0, &["res"], args).expect("the batch runs");

    assert_eq!(run(&fair("w1", "10", "tok-1")), vec![redis::Value::Int(1)]);
    assert_eq!(
        run(&fair("w2", "20", "tok-2")),
        vec![redis::Value::Int(0)],
        "held by w1"
    );
    // w1's attempt failed on a majority elsewhere: its clean-up release here.
    assert_eq!(
        run(&["r", "tok-1", "60000", "1"]),
        vec![redis::Value::Int(1)]
    );
    let message = pubsub.get_message().expect("the release is announced");
    assert_eq!(
        message.get_payload::<String>().expect("payload"),
        "w1",
        "the release names w1, still first in line"
    );
    assert_eq!(
        run(&fair("w2", "20", "tok-2")),
        vec![redis::Value::Int(0)],
        "w2 is not served before w1"
    );
    assert_eq!(run(&fair("w1", "10", "tok-1b")), vec![redis::Value::Int(1)]);
}

/// The batched script's acquire, by what each key already holds: a free key is taken, a key
/// that holds our own token (a repeated request) is taken again with a fresh TTL, another
/// owner's key is refused and left alone, a key of another type is that lock's own error,
/// and a lock over several keys is all or nothing.
#[test]
fn the_batch_script_acquires_each_lock_by_what_its_keys_hold() {
    let servers = Servers::start(1);
    let _: () = servers.cmd(0, &["SET", "ours", "tok", "PX", "1000"]);
    let _: () = servers.cmd(0, &["SET", "theirs", "other"]);
    let _: i64 = servers.cmd(0, &["HSET", "hash", "field", "value"]);
    let _: () = servers.cmd(0, &["SET", "multi:b", "other"]);
    let keys = [
        "free", "ours", "theirs", "hash", "multi:a", "multi:b", "multi:c",
    ];
    let mut args = Vec::new();
    for count in ["1", "1", "1", "1", "3"] {
        args.extend(["a", "tok", "60000", count]);
    }
    let replies = batch(&servers, 0, &keys, &args).expect("the batch runs");
    assert_eq!(replies.len(), 5, "{replies:?}");
    assert_eq!(replies[0], redis::Value::Int(1), "a free key is taken");
    assert_eq!(
        replies[1],
        redis::Value::Int(1),
        "our own key is taken again"
    );
    assert_eq!(
        replies[2],
        redis::Value::Int(0),
        "another owner's key is refused"
    );
    match &replies[3] {
        redis::Value::BulkString(e) => assert!(
            String::from_utf8_lossy(e).starts_with("E:WRONGTYPE"),
            "{replies:?}"
        ),
        other => panic!("a hash key is its lock's own error, got {other:?}"),
    }
    assert_eq!(
        replies[4],
        redis::Value::Int(0),
        "all or nothing over three keys"
    );
    let get = |key: &str| servers.cmd::<Option<String>>(0, &["GET", key]);
    assert_eq!(get("free").as_deref(), Some("tok"));
    assert_eq!(get("theirs").as_deref(), Some("other"));
    assert_eq!(get("multi:a"), None, "nothing of a refused lock is written");
    assert_eq!(get("multi:c"), None);
    let pttl: i64 = servers.cmd(0, &["PTTL", "ours"]);
    assert!(
        pttl > 30_000,
        "a repeated acquire refreshes the TTL: {pttl} ms left"
    );
    let pttl: i64 = servers.cmd(0, &["PTTL", "free"]);
    assert!(pttl > 30_000, "a new key gets the TTL: {pttl} ms left");
}

/// Releases, the plain one-key ones among other kinds: each deletes only what holds its
/// token, in batch order, and a key of another type is refused, not an error of the batch.
#[test]
fn each_release_in_a_batch_deletes_only_its_own_keys_in_order() {
    let servers = Servers::start(1);
    let _: () = servers.cmd(0, &["SET", "ours", "tok"]);
    let _: () = servers.cmd(0, &["SET", "theirs", "other"]);
    let _: i64 = servers.cmd(0, &["HSET", "hash", "field", "value"]);
    let _: () = servers.cmd(0, &["SET", "multi:a", "tok"]);
    let _: () = servers.cmd(0, &["SET", "multi:b", "tok"]);
    let keys = [
        "ours", "theirs", "hash", "ours", "multi:a", "multi:b", "again", "again", "last",
    ];
    let ops: [&[&str]; 8] = [
        &["r", "tok", "0", "1"],     // ours: deleted
        &["r", "tok", "0", "1"],     // theirs: kept
        &["r", "tok", "0", "1"],     // a hash: refused, not an error
        &["r", "tok", "0", "1"],     // ours again: already gone
        &["r", "tok", "0", "2"],     // two keys, both ours
        &["a", "tok", "60000", "1"], // taken...
        &["r", "tok", "0", "1"],     // ...and released, after it
        &["a", "tok", "60000", "1"], // the operation after the releases still lands
    ];
    let args: Vec<&str> = ops.iter().flat_map(|op| op.iter().copied()).collect();
    let replies = batch(&servers, 0, &keys, &args).expect("the batch runs");
    let int = redis::Value::Int;
    assert_eq!(
        replies,
        [
            int(1),
            int(0),
            int(0),
            int(0),
            int(2),
            int(1),
            int(1),
            int(1)
        ]
    );
    let get = |key: &str| servers.cmd::<Option<String>>(0, &["GET", key]);
    assert_eq!(get("ours"), None);
    assert_eq!(get("theirs").as_deref(), Some("other"));
    let kind: String = servers.cmd(0, &["TYPE", "hash"]);
    assert_eq!(kind, "hash");
    assert_eq!((get("multi:a"), get("multi:b")), (None, None));
    assert_eq!(get("again"), None, "released after its acquire");
    assert_eq!(get("last").as_deref(), Some("tok"));
}

/// A release announces itself (`PUBLISH redfence:released:<key>`) only when someone waits
/// for the key: after an acquire was refused on it, or while it has a fair queue. An
/// uncontended release costs no PUBLISH.
#[test]
fn a_release_is_announced_only_when_someone_waits() {
    let servers = Servers::start(1);
    let mut listener = listener(&servers, Duration::from_millis(300));
    let mut pubsub = listener.as_pubsub();
    pubsub.psubscribe("redfence:released:*").expect("subscribe");
    let mut heard = || {
        let mut channels = Vec::new();
        while let Ok(message) = pubsub.get_message() {
            channels.push(message.get_channel_name().to_owned());
        }
        channels
    };
    let run = |args: &[&str]| batch(&servers, 0, &["k"], args).expect("the batch runs");

    // Nobody waits: taken and released without a word.
    assert_eq!(
        run(&["a", "tok1", "60000", "1"]),
        vec![redis::Value::Int(1)]
    );
    assert_eq!(run(&["r", "tok1", "0", "1"]), vec![redis::Value::Int(1)]);
    assert_eq!(heard(), Vec::<String>::new(), "an uncontended release");

    // A refused acquire marks the key: the holder's release is announced.
    assert_eq!(
        run(&["a", "tok2", "60000", "1"]),
        vec![redis::Value::Int(1)]
    );
    assert_eq!(
        run(&["a", "tok3", "60000", "1"]),
        vec![redis::Value::Int(0)]
    );
    let mark: i64 = servers.cmd(0, &["PTTL", "k:redfence:waiting"]);
    assert!(mark > 50_000, "the mark lasts the waiter's TTL: {mark} ms");
    assert_eq!(run(&["r", "tok2", "0", "1"]), vec![redis::Value::Int(1)]);
    assert_eq!(heard(), vec!["redfence:released:k".to_owned()]);
    // The release took the mark with the key: nothing is left behind.
    assert_eq!(servers.keys(0), Vec::<String>::new());

    // A fair waiter marks the key at every attempt; a release announces the head of the
    // line, and marks the key again while waiters remain.
    assert_eq!(
        run(&["a", "tok4", "60000", "1"]),
        vec![redis::Value::Int(1)]
    );
    assert_eq!(
        run(&["f", "tok5", "60000", "1", "waiter", "1", "5000"]),
        vec![redis::Value::Int(0)]
    );
    assert_eq!(run(&["r", "tok4", "0", "1"]), vec![redis::Value::Int(1)]);
    assert_eq!(heard(), vec!["redfence:released:k".to_owned()]);
    assert_eq!(
        servers.cmd::<i64>(0, &["EXISTS", "k:redfence:waiting"]),
        1,
        "the waiter is still in line"
    );
}

/// In keys-only mode (`-` first, what a Cluster voter sends: there a helper key lies in
/// another hash slot, which Valkey 9 refuses in a script), the batch touches the lock keys and
/// nothing else: a refused acquire leaves no waiting mark, a release deletes only its own key
/// (a mark set by someone else stays) and publishes nothing; the replies are as usual.
#[test]
fn keys_only_mode_touches_nothing_but_the_lock_keys() {
    let servers = Servers::start(1);
    let mut listener = listener(&servers, Duration::from_millis(300));
    let mut pubsub = listener.as_pubsub();
    pubsub.psubscribe("redfence:released:*").expect("subscribe");
    let run = |args: &[&str]| batch(&servers, 0, &["k", "j"], args).expect("the batch runs");
    let keys = || {
        let mut keys = servers.keys(0);
        keys.sort();
        keys
    };

    let replies = run(&[
        "-", //
        "a", "tok1", "60000", "1", //
        "a", "tok2", "60000", "1",
    ]);
    assert_eq!(replies, vec![redis::Value::Int(1), redis::Value::Int(1)]);
    // Refused: no mark.
    let replies = batch(&servers, 0, &["k"], &["-", "a", "tok3", "60000", "1"]).expect("runs");
    assert_eq!(replies, vec![redis::Value::Int(0)]);
    assert_eq!(keys(), vec!["j".to_owned(), "k".to_owned()]);

    // A mark someone else set (a plain client waiting on the same server) is left alone.
    let _: () = servers.cmd(0, &["SET", "k:redfence:waiting", "1", "PX", "60000"]);
    let replies = run(&[
        "-", //
        "r", "tok1", "0", "1", //
        "r", "other", "0", "1",
    ]);
    assert_eq!(replies, vec![redis::Value::Int(1), redis::Value::Int(0)]);
    assert_eq!(
        keys(),
        vec!["j".to_owned(), "k:redfence:waiting".to_owned()]
    );
    assert!(
        pubsub.get_message().is_err(),
        "a keys-only release publishes nothing"
    );
}
