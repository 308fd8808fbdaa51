//! Unit tests of the simulated server: each command's main forms, expiry by the clock, and
//! every script of redfence through `SCRIPT LOAD` and `EVALSHA`.

use redis::Value;

use super::SimServer;

/// Runs `args` (words) on `server`.
fn run(server: &mut SimServer, args: &[&str]) -> Value {
    let args: Vec<Vec<u8>> = args.iter().map(|a| a.as_bytes().to_vec()).collect();
    server.command(&args)
}

/// A bulk string.
fn bulk(text: &str) -> Value {
    Value::BulkString(text.as_bytes().to_vec())
}

#[test]
fn strings_and_expiry() {
    let mut s = SimServer::new(1_000);
    assert_eq!(
        run(&mut s, &["SET", "k", "v", "NX", "PX", "100"]),
        Value::Okay
    );
    assert_eq!(run(&mut s, &["set", "k", "w", "nx"]), Value::Nil);
    assert_eq!(run(&mut s, &["GET", "k"]), bulk("v"));
    assert_eq!(run(&mut s, &["PTTL", "k"]), Value::Int(100));
    s.set_time(1_100);
    assert_eq!(s.get("k"), Some(b"v".to_vec()));
    s.set_time(1_101);
    assert_eq!(s.get("k"), None);
    assert_eq!(run(&mut s, &["PTTL", "k"]), Value::Int(-2));
}

/// `SCRIPT LOAD`s `source` and checks the hash is redis-rs's.
fn load(server: &mut SimServer, source: &str) -> String {
    let sha = run(server, &["SCRIPT", "LOAD", source]);
    let expected = redis::Script::new(source).get_hash().to_owned();
    assert_eq!(sha, bulk(&expected));
    expected
}

/// `EVALSHA sha numkeys args...`.
fn evalsha(server: &mut SimServer, sha: &str, keys: &[&str], argv: &[&str]) -> Value {
    let numkeys = keys.len().to_string();
    let mut args = vec!["EVALSHA", sha, &numkeys];
    args.extend(keys);
    args.extend(argv);
    run(server, &args)
}

const BATCH: &str = include_str!("../scripts/batch.lua");

#[test]
fn batch_acquire_extend_release() {
    let mut s = SimServer::new(1_700_000_000_000);
    assert!(matches!(
        evalsha(&mut s, "0123456789012345678901234567890123456789", &["a"], &[]),
        Value::ServerError(e) if e.code() == "NOSCRIPT"
    ));
    let sha = load(&mut s, BATCH);
    let acquire = evalsha(&mut s, &sha, &["a"], &["a", "t1", "1000", "1"]);
    assert_eq!(acquire, Value::Array(vec![Value::Int(1)]));
    assert_eq!(s.get("a"), Some(b"t1".to_vec()));
    let contended = evalsha(&mut s, &sha, &["a"], &["a", "t2", "1000", "1"]);
    assert_eq!(contended, Value::Array(vec![Value::Int(0)]));
    assert_eq!(s.get("a:redfence:waiting"), Some(b"1".to_vec()));
    s.set_time(1_700_000_000_500);
    let extend = evalsha(&mut s, &sha, &["a"], &["e", "t1", "1000", "1"]);
    assert_eq!(extend, Value::Array(vec![Value::Int(1)]));
    assert_eq!(run(&mut s, &["PTTL", "a"]), Value::Int(1000));
    let release = evalsha(
        &mut s,
        &sha,
        &["a", "a"],
        &["r", "t2", "0", "1", "r", "t1", "0", "1"],
    );
    assert_eq!(release, Value::Array(vec![Value::Int(0), Value::Int(1)]));
    assert_eq!(s.get("a"), None);
    assert_eq!(s.get("a:redfence:waiting"), None);
}

#[test]
fn info_ping_and_restart() {
    let mut s = SimServer::new(5_000);
    assert_eq!(run(&mut s, &["PING"]), Value::SimpleString("PONG".into()));
    let text = |s: &mut SimServer, args: &[&str]| match run(s, args) {
        Value::BulkString(b) => String::from_utf8(b).unwrap(),
        other => panic!("INFO answered {other:?}"),
    };
    let server = text(&mut s, &["INFO", "server"]);
    let run_id = s.run_id();
    assert!(server.contains(&format!("run_id:{run_id}\r\n")), "{server}");
    assert!(server.contains("uptime_in_seconds:0\r\n"), "{server}");
    assert!(!server.contains("maxmemory_policy"), "{server}");
    assert!(text(&mut s, &["INFO", "memory"]).contains("maxmemory_policy:noeviction\r\n"));
    s.set_info("maxmemory_policy", "allkeys-lru");
    assert!(text(&mut s, &["INFO"]).contains("maxmemory_policy:allkeys-lru\r\n"));
    let sha = load(&mut s, "return 1");
    run(&mut s, &["SET", "k", "v"]);
    s.set_time(8_000);
    assert!(text(&mut s, &["INFO", "server"]).contains("uptime_in_seconds:3\r\n"));
    s.restart();
    assert_ne!(s.run_id(), run_id);
    assert_eq!(s.get("k"), None);
    assert!(text(&mut s, &["INFO", "server"]).contains("uptime_in_seconds:0\r\n"));
    assert!(matches!(
        evalsha(&mut s, &sha, &[], &[]),
        Value::ServerError(_)
    ));
}
