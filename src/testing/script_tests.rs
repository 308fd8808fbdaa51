//! redfence's scripts on the simulated server, each through `SCRIPT LOAD` (the hash redis-rs
//! computes) and `EVALSHA`, with sample calls of each.

use redis::Value;

use super::SimServer;
use super::tests::{bulk, error_text, ints, load, run};

/// The server time of these tests, in ms.
const NOW: u64 = 1_700_000_000_000;

/// `EVALSHA sha numkeys keys... argv...`.
fn evalsha(server: &mut SimServer, sha: &str, keys: &[&str], argv: &[&str]) -> Value {
    let numkeys = keys.len().to_string();
    let mut args = vec!["EVALSHA", sha, &numkeys];
    args.extend(keys);
    args.extend(argv);
    run(server, &args)
}

/// A server with `source` loaded, and its sha1.
fn with(source: &str) -> (SimServer, String) {
    let mut server = SimServer::new(NOW);
    let sha = load(&mut server, source);
    (server, sha)
}

/// Runs each of `calls` of `sha` on `keys` in order: an argv and the reply it must get.
fn replies<const N: usize>(
    server: &mut SimServer,
    sha: &str,
    keys: &[&str],
    calls: &[([&str; N], Value)],
) {
    for (argv, reply) in calls {
        assert_eq!(&evalsha(server, sha, keys, argv), reply, "{argv:?}");
    }
}

/// The batch script.
const BATCH: &str = include_str!("../scripts/batch.lua");

#[test]
fn batch_acquire_extend_release() {
    let mut s = SimServer::new(NOW);
    let unknown = "0123456789012345678901234567890123456789";
    assert!(error_text(evalsha(&mut s, unknown, &["a"], &[])).starts_with("NOSCRIPT"));
    let sha = load(&mut s, BATCH);
    let acquire = evalsha(&mut s, &sha, &["a"], &["a", "t1", "1000", "1"]);
    assert_eq!(acquire, ints(&[1]));
    assert_eq!(s.get("a"), Some(b"t1".to_vec()));
    let contended = evalsha(&mut s, &sha, &["a"], &["a", "t2", "1000", "1"]);
    assert_eq!(contended, ints(&[0]));
    assert_eq!(s.get("a:redfence:waiting"), Some(b"1".to_vec()));
    s.set_time(NOW + 500);
    let extend = evalsha(&mut s, &sha, &["a"], &["e", "t1", "1000", "1"]);
    assert_eq!(extend, ints(&[1]));
    assert_eq!(run(&mut s, &["PTTL", "a"]), Value::Int(1000));
    let argv = ["r", "t2", "0", "1", "r", "t1", "0", "1"];
    assert_eq!(evalsha(&mut s, &sha, &["a", "a"], &argv), ints(&[0, 1]));
    assert_eq!(s.get("a"), None);
    assert_eq!(s.get("a:redfence:waiting"), None);
    // Expired by the clock: free again.
    evalsha(&mut s, &sha, &["b", "c"], &["a", "t1", "100", "2"]);
    s.set_time(NOW + 601);
    let argv = ["a", "t2", "100", "2", "e", "t1", "100", "1"];
    assert_eq!(
        evalsha(&mut s, &sha, &["b", "c", "b"], &argv),
        ints(&[2, 0])
    );
}

#[test]
fn batch_errors_per_operation_and_the_marker() {
    let (mut s, sha) = with(BATCH);
    run(&mut s, &["ZADD", "z", "1", "m"]);
    run(&mut s, &["SET", "m", "id|5"]);
    let argv = [
        "a", "t1", "1000", "1", "a", "t1", "1000", "1", "m", "", "0", "1",
    ];
    let reply = evalsha(&mut s, &sha, &["z", "a", "m"], &argv);
    let wrong = "E:WRONGTYPE Operation against a key holding the wrong kind of value";
    assert_eq!(
        reply,
        Value::Array(vec![bulk(wrong), Value::Int(1), bulk("id|5")])
    );
    let reply = evalsha(&mut s, &sha, &["gone"], &["m", "", "0", "1"]);
    assert_eq!(reply, ints(&[0]));
    // Keys only: no waiting mark.
    let reply = evalsha(&mut s, &sha, &["a"], &["-", "a", "t2", "1000", "1"]);
    assert_eq!(reply, ints(&[0]));
    assert_eq!(s.get("a:redfence:waiting"), None);
}

#[test]
fn batch_fair_queue() {
    let (mut s, sha) = with(BATCH);
    // `f` (a fair acquire), `R` (a fair release), `l` (leaving the queue).
    let op = |kind, token, waiter, ticket| [kind, token, "1000", "1", waiter, ticket, "5000"];
    let calls = [
        (op("f", "t1", "w1", "1"), ints(&[1])),
        (op("f", "t2", "w2", "2"), ints(&[0])),
    ];
    replies(&mut s, &sha, &["a"], &calls);
    let queue = run(&mut s, &["ZRANGE", "a:redfence:queue", "0", "-1"]);
    assert_eq!(queue, Value::Array(vec![bulk("w1"), bulk("w2")]));
    let calls = [
        (op("R", "t1", "w1", "1"), ints(&[1])),
        (op("f", "t2", "w2", "2"), ints(&[1])),
        (op("l", "t2", "w2", "2"), ints(&[0])),
    ];
    replies(&mut s, &sha, &["a"], &calls);
    assert_eq!(run(&mut s, &["ZCARD", "a:redfence:queue"]), Value::Int(0));
}

#[test]
fn batch_read_write_lock() {
    let (mut s, sha) = with(BATCH);
    let keys = ["rw", "rw:readers", "rw:waiting"];
    let op = |kind, token, waiter| [kind, token, "1000", "3", waiter, "5000"];
    let calls = [
        (op("wa", "t1", ""), ints(&[1])),
        (op("ra", "t2", "r1"), ints(&[0])),
        (op("wr", "t1", ""), ints(&[1])),
        (op("ra", "t2", "r1"), ints(&[1])),
        (op("wa", "t3", "w3"), ints(&[0])),
    ];
    replies(&mut s, &sha, &keys, &calls);
    assert_eq!(s.get("rw:waiting"), Some(b"w3".to_vec()));
    let calls = [
        (op("rr", "t2", ""), ints(&[1])),
        (op("wa", "t3", "w3"), ints(&[1])),
    ];
    replies(&mut s, &sha, &keys, &calls);
    assert_eq!(s.get("rw"), Some(b"t3".to_vec()));
}

#[test]
fn advisory_scripts() {
    let (mut s, batch) = with(BATCH);
    evalsha(&mut s, &batch, &["a"], &["a", "t1", "1000", "1"]);
    let inspect = load(&mut s, include_str!("../scripts/inspect.lua"));
    let row = |kind: &str, value: Value, pttl: i64| {
        Value::Array(vec![bulk(kind), value, Value::Int(pttl)])
    };
    let reply = evalsha(&mut s, &inspect, &["a", "n"], &[]);
    let expected = [row("string", bulk("t1"), 1000), row("none", Value::Nil, -2)];
    assert_eq!(reply, Value::Array(expected.to_vec()));
    let write = load(&mut s, include_str!("../scripts/write_if_held.lua"));
    let written = [(["t1", "v", "500"], Value::Int(1))];
    replies(&mut s, &write, &["a", "n"], &written);
    assert_eq!(s.get("n"), Some(b"v".to_vec()));
    let calls = [
        (["t2", "", "500"], Value::Int(0)),
        (["t1", "", "500"], Value::Int(1)),
    ];
    replies(&mut s, &write, &["a", "n"], &calls);
    assert_eq!(s.get("n"), None);
    let claim = load(&mut s, include_str!("../scripts/claim.lua"));
    let calls = [(["3", "1000"], bulk("3")), (["4", "1000"], bulk("3"))];
    replies(&mut s, &claim, &["size"], &calls);
    let reply = evalsha(&mut s, &inspect, &["a"], &["release"]);
    assert_eq!(reply, Value::Array(vec![row("string", bulk("t1"), 1000)]));
    assert_eq!(s.get("a"), None);
    let keys = ["rw", "rw:readers", "rw:waiting"];
    evalsha(&mut s, &batch, &keys, &["ra", "t2", "1000", "3", "", "0"]);
    s.set_time(NOW + 400);
    let rw_inspect = load(&mut s, include_str!("../scripts/rwlock_inspect.lua"));
    let reply = evalsha(&mut s, &rw_inspect, &keys, &[]);
    let readers = Value::Array(vec![Value::Array(vec![bulk("t2"), Value::Int(600)])]);
    let expected = [
        Value::Nil,
        Value::Int(-2),
        readers,
        Value::Nil,
        Value::Int(-2),
    ];
    assert_eq!(reply, Value::Array(expected.to_vec()));
}

#[test]
fn memory_script() {
    let (mut s, sha) = with(include_str!("../scripts/memory.lua"));
    let reply = evalsha(&mut s, &sha, &["m", "r:b"], &["id1", "", "id2"]);
    let now = NOW.to_string();
    let marker = format!("id1|{now}");
    let entry = format!("id2|{now}|0");
    let expected = [bulk(&marker), Value::Int(NOW as i64), bulk(&entry)];
    assert_eq!(reply, Value::Array(expected.to_vec()));
    s.set_time(NOW + 10);
    let reply = evalsha(&mut s, &sha, &["m", "r:b"], &["id9", "id1", "id3"]);
    let (marker, entry) = (format!("id9|{}", NOW + 10), format!("id3|{}|1", NOW + 10));
    let expected = [bulk(&marker), Value::Int(NOW as i64 + 10), bulk(&entry)];
    assert_eq!(reply, Value::Array(expected.to_vec()));
}

#[test]
fn fencing_scripts() {
    let (mut s, fences) = with(include_str!("../fence/next_fences.lua"));
    let reply = evalsha(&mut s, &fences, &["f:1", "f:1", "f:2"], &["1", "2"]);
    assert_eq!(reply, ints(&[1, 2]));
    assert_eq!(s.get("f:2"), Some(b"2".to_vec()));
    let bad = evalsha(&mut s, &fences, &["f:1"], &["2"]);
    assert_eq!(error_text(bad), "fence batch: bad key count 2");
    let init = load(&mut s, include_str!("../fence/init_stripes.lua"));
    let stripes = ["s", "s:0", "s:1"];
    let ranges = load(&mut s, include_str!("../fence/next_ranges.lua"));
    let missing = evalsha(&mut s, &ranges, &stripes, &["2", "1", "2"]);
    assert_eq!(error_text(missing), "NOSTRIPES s is missing");
    assert_eq!(evalsha(&mut s, &init, &stripes, &["2", "7"]), Value::Int(1));
    let argv = ["2", "1", "2", "2", "2", "3"];
    assert_eq!(evalsha(&mut s, &ranges, &stripes, &argv), ints(&[8, 9]));
    assert_eq!(s.get("s:1"), Some(b"9".to_vec()));
    let other = evalsha(&mut s, &init, &stripes, &["3", "0"]);
    assert!(error_text(other).starts_with("fence stripes: s says 2 stripes"));
}
