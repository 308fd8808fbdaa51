//! Unit tests of the simulated server's commands: each command's main forms, expiry by the
//! clock, errors, `EVAL` and Redis's conversions, `INFO` and restarts. The scripts' tests are
//! in `script_tests.rs`; the comparison with a real server in `differential.rs`.

use redis::Value;

use super::SimServer;

/// Runs `args` (words) on `server`.
pub(super) fn run(server: &mut SimServer, args: &[&str]) -> Value {
    let args: Vec<Vec<u8>> = args.iter().map(|a| a.as_bytes().to_vec()).collect();
    server.command(&args)
}

/// A bulk string.
pub(super) fn bulk(text: &str) -> Value {
    Value::BulkString(text.as_bytes().to_vec())
}

/// An array of bulk strings.
fn bulks(texts: &[&str]) -> Value {
    Value::Array(texts.iter().map(|t| bulk(t)).collect())
}

/// An array of integers.
pub(super) fn ints(values: &[i64]) -> Value {
    Value::Array(values.iter().map(|&n| Value::Int(n)).collect())
}

/// An error reply's text (`CODE details`), or a panic.
pub(super) fn error_text(value: Value) -> String {
    match value {
        Value::ServerError(e) => format!("{} {}", e.code(), e.details().unwrap_or("")),
        other => panic!("no error: {other:?}"),
    }
}

/// `SCRIPT LOAD`s `source` and checks the hash is redis-rs's.
pub(super) fn load(server: &mut SimServer, source: &str) -> String {
    let sha = run(server, &["SCRIPT", "LOAD", source]);
    let expected = redis::Script::new(source).get_hash().to_owned();
    assert_eq!(sha, bulk(&expected));
    expected
}

#[test]
fn a_server_can_move_between_threads() {
    fn sendable<T: Send + Sync>() {}
    sendable::<SimServer>();
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
    assert_eq!(run(&mut s, &["PTTL", "k"]), Value::Int(0));
    s.set_time(1_101);
    assert_eq!(s.get("k"), None);
    assert_eq!(run(&mut s, &["PTTL", "k"]), Value::Int(-2));
    assert_eq!(run(&mut s, &["EXISTS", "k"]), Value::Int(0));
}

#[test]
fn set_options() {
    let mut s = SimServer::new(0);
    assert_eq!(run(&mut s, &["SET", "k", "v", "XX"]), Value::Nil);
    assert_eq!(run(&mut s, &["SET", "k", "v", "GET"]), Value::Nil);
    assert_eq!(run(&mut s, &["SET", "k", "w", "NX", "GET"]), bulk("v"));
    assert_eq!(
        run(&mut s, &["SET", "k", "w", "XX", "GET", "PX", "50"]),
        bulk("v")
    );
    assert_eq!(run(&mut s, &["SET", "k", "x", "KEEPTTL"]), Value::Okay);
    assert_eq!(run(&mut s, &["PTTL", "k"]), Value::Int(50));
    assert_eq!(run(&mut s, &["SET", "k", "y"]), Value::Okay);
    assert_eq!(run(&mut s, &["PTTL", "k"]), Value::Int(-1));
    let invalid = "ERR invalid expire time in 'set' command";
    assert_eq!(
        error_text(run(&mut s, &["SET", "k", "v", "PX", "0"])),
        invalid
    );
    let not_int = "ERR value is not an integer or out of range";
    assert_eq!(
        error_text(run(&mut s, &["SET", "k", "v", "PX", "x"])),
        not_int
    );
    assert_eq!(
        error_text(run(&mut s, &["SET", "k", "v", "NX", "XX"])),
        "ERR syntax error"
    );
    assert_eq!(
        error_text(run(&mut s, &["SET", "k", "v", "PX"])),
        "ERR syntax error"
    );
    let arity = "ERR wrong number of arguments for 'set' command";
    assert_eq!(error_text(run(&mut s, &["SET", "k"])), arity);
    run(&mut s, &["ZADD", "z", "1", "m"]);
    let wrong = "WRONGTYPE Operation against a key holding the wrong kind of value";
    assert_eq!(error_text(run(&mut s, &["SET", "z", "v", "GET"])), wrong);
    assert_eq!(error_text(run(&mut s, &["GET", "z"])), wrong);
    assert_eq!(run(&mut s, &["SET", "z", "v"]), Value::Okay);
    assert_eq!(
        run(&mut s, &["TYPE", "z"]),
        Value::SimpleString("string".into())
    );
}

#[test]
fn generic_commands() {
    let mut s = SimServer::new(10_000);
    run(&mut s, &["SET", "a", "1"]);
    run(&mut s, &["ZADD", "z", "1", "m"]);
    assert_eq!(run(&mut s, &["EXISTS", "a", "a", "z", "n"]), Value::Int(3));
    assert_eq!(
        run(&mut s, &["TYPE", "z"]),
        Value::SimpleString("zset".into())
    );
    assert_eq!(
        run(&mut s, &["TYPE", "n"]),
        Value::SimpleString("none".into())
    );
    assert_eq!(run(&mut s, &["DEL", "a", "n", "z"]), Value::Int(2));
    assert_eq!(run(&mut s, &["TIME"]), bulks(&["10", "0"]));
    s.set_time(12_345);
    assert_eq!(run(&mut s, &["TIME"]), bulks(&["12", "345000"]));
    assert_eq!(run(&mut s, &["PUBLISH", "ch", "x"]), Value::Int(0));
    assert_eq!(run(&mut s, &["PING"]), Value::SimpleString("PONG".into()));
    let unknown = "ERR unknown command 'FOO', with args beginning with: 'a' 'b' ";
    assert_eq!(error_text(run(&mut s, &["FOO", "a", "b"])), unknown);
    let arity = "ERR wrong number of arguments for 'get' command";
    assert_eq!(error_text(run(&mut s, &["GET"])), arity);
}

#[test]
fn scan_and_redis_rs_commands() {
    let mut s = SimServer::new(0);
    for key in ["fence:{a}", "fence:{b}", "other"] {
        run(&mut s, &["SET", key, "1"]);
    }
    run(&mut s, &["ZADD", "fence:z", "1", "m"]);
    let all = Value::Array(vec![
        bulk("0"),
        bulks(&["fence:z", "fence:{a}", "fence:{b}", "other"]),
    ]);
    assert_eq!(run(&mut s, &["SCAN", "0"]), all);
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(0)
        .arg("MATCH")
        .arg("fence:{*}")
        .arg("COUNT")
        .arg(100);
    let matched = Value::Array(vec![bulk("0"), bulks(&["fence:{a}", "fence:{b}"])]);
    assert_eq!(s.run_cmd(&cmd), matched);
    let typed = run(&mut s, &["SCAN", "0", "TYPE", "zset"]);
    assert_eq!(typed, Value::Array(vec![bulk("0"), bulks(&["fence:z"])]));
    assert_eq!(
        error_text(run(&mut s, &["SCAN", "x"])),
        "ERR invalid cursor"
    );
    let mut mget = redis::cmd("MGET");
    mget.arg(&["fence:{a}", "none"]);
    assert_eq!(s.run_cmd(&mget), Value::Array(vec![bulk("1"), Value::Nil]));
}

#[test]
fn pexpire_and_its_options() {
    let mut s = SimServer::new(1_000);
    assert_eq!(run(&mut s, &["PEXPIRE", "k", "100"]), Value::Int(0));
    run(&mut s, &["SET", "k", "v"]);
    assert_eq!(run(&mut s, &["PEXPIRE", "k", "100", "XX"]), Value::Int(0));
    assert_eq!(run(&mut s, &["PEXPIRE", "k", "100", "GT"]), Value::Int(0));
    assert_eq!(run(&mut s, &["PEXPIRE", "k", "100", "LT"]), Value::Int(1));
    assert_eq!(run(&mut s, &["PEXPIRE", "k", "200", "NX"]), Value::Int(0));
    assert_eq!(run(&mut s, &["PEXPIRE", "k", "50", "GT"]), Value::Int(0));
    assert_eq!(run(&mut s, &["PEXPIRE", "k", "300", "GT"]), Value::Int(1));
    assert_eq!(run(&mut s, &["PTTL", "k"]), Value::Int(300));
    let clash = "ERR NX and XX, GT or LT options at the same time are not compatible";
    assert_eq!(
        error_text(run(&mut s, &["PEXPIRE", "k", "1", "NX", "GT"])),
        clash
    );
    assert_eq!(run(&mut s, &["PEXPIRE", "k", "0"]), Value::Int(1));
    assert_eq!(run(&mut s, &["EXISTS", "k"]), Value::Int(0));
}

#[test]
fn getrange_strlen_and_incr() {
    let mut s = SimServer::new(0);
    run(&mut s, &["SET", "k", "Hello", "PX", "500"]);
    for (start, end, expected) in [
        ("0", "3", "Hell"),
        ("-3", "-1", "llo"),
        ("0", "-1", "Hello"),
        ("10", "100", ""),
        ("-1", "-3", ""),
        ("3", "1", ""),
        ("-100", "1", "He"),
    ] {
        assert_eq!(run(&mut s, &["GETRANGE", "k", start, end]), bulk(expected));
    }
    assert_eq!(run(&mut s, &["GETRANGE", "n", "0", "5"]), bulk(""));
    assert_eq!(run(&mut s, &["STRLEN", "k"]), Value::Int(5));
    let not_int = "ERR value is not an integer or out of range";
    assert_eq!(error_text(run(&mut s, &["INCR", "k"])), not_int);
    run(&mut s, &["SET", "k", "41", "PX", "500"]);
    assert_eq!(run(&mut s, &["INCR", "k"]), Value::Int(42));
    assert_eq!(run(&mut s, &["INCRBY", "k", "-50"]), Value::Int(-8));
    assert_eq!(run(&mut s, &["PTTL", "k"]), Value::Int(500));
    assert_eq!(run(&mut s, &["INCR", "new"]), Value::Int(1));
    let overflow = "ERR increment or decrement would overflow";
    let max = i64::MAX.to_string();
    assert_eq!(error_text(run(&mut s, &["INCRBY", "new", &max])), overflow);
    assert_eq!(
        run(&mut s, &["MGET", "k", "n"]),
        Value::Array(vec![bulk("-8"), Value::Nil])
    );
}

#[test]
fn sorted_sets() {
    let mut s = SimServer::new(0);
    assert_eq!(run(&mut s, &["ZADD", "z", "XX", "1", "a"]), Value::Int(0));
    assert_eq!(run(&mut s, &["EXISTS", "z"]), Value::Int(0));
    assert_eq!(
        run(&mut s, &["ZADD", "z", "1", "a", "2", "b", "3", "c"]),
        Value::Int(3)
    );
    assert_eq!(
        run(&mut s, &["ZADD", "z", "NX", "9", "a", "4", "d"]),
        Value::Int(1)
    );
    assert_eq!(
        run(&mut s, &["ZADD", "z", "CH", "5", "d", "5", "e"]),
        Value::Int(2)
    );
    assert_eq!(
        run(&mut s, &["ZADD", "z", "GT", "CH", "0", "a"]),
        Value::Int(0)
    );
    assert_eq!(run(&mut s, &["ZADD", "z", "INCR", "0.5", "a"]), bulk("1.5"));
    assert_eq!(run(&mut s, &["ZSCORE", "z", "a"]), bulk("1.5"));
    assert_eq!(run(&mut s, &["ZSCORE", "z", "x"]), Value::Nil);
    assert_eq!(run(&mut s, &["ZCARD", "z"]), Value::Int(5));
    assert_eq!(run(&mut s, &["ZRANGE", "z", "0", "0"]), bulks(&["a"]));
    assert_eq!(
        run(&mut s, &["ZRANGE", "z", "-2", "-1"]),
        bulks(&["d", "e"])
    );
    assert_eq!(
        run(&mut s, &["ZRANGE", "z", "0", "1", "REV", "WITHSCORES"]),
        bulks(&["e", "5", "d", "5"])
    );
    let by_score = ["ZRANGE", "z", "(1.5", "+inf", "BYSCORE", "LIMIT", "1", "2"];
    assert_eq!(run(&mut s, &by_score), bulks(&["c", "d"]));
    assert_eq!(
        run(&mut s, &["ZRANGEBYSCORE", "z", "-inf", "(3"]),
        bulks(&["a", "b"])
    );
    let limited = [
        "ZRANGEBYSCORE",
        "z",
        "2",
        "5",
        "WITHSCORES",
        "LIMIT",
        "0",
        "1",
    ];
    assert_eq!(run(&mut s, &limited), bulks(&["b", "2"]));
    assert_eq!(run(&mut s, &["ZRANGEBYSCORE", "z", "3", "2"]), bulks(&[]));
    let not_float = "ERR min or max is not a float";
    assert_eq!(
        error_text(run(&mut s, &["ZRANGEBYSCORE", "z", "x", "2"])),
        not_float
    );
    assert_eq!(
        run(&mut s, &["ZREMRANGEBYSCORE", "z", "-inf", "(3"]),
        Value::Int(2)
    );
    assert_eq!(run(&mut s, &["ZREM", "z", "c", "x"]), Value::Int(1));
    assert_eq!(run(&mut s, &["ZREM", "z", "d", "e"]), Value::Int(2));
    assert_eq!(
        run(&mut s, &["TYPE", "z"]),
        Value::SimpleString("none".into())
    );
    run(&mut s, &["ZADD", "z", "0.1", "m", "1e17", "n"]);
    assert_eq!(
        run(&mut s, &["ZRANGE", "z", "0", "-1", "WITHSCORES"]),
        bulks(&["m", "0.10000000000000001", "n", "1e+17"])
    );
    run(&mut s, &["SET", "k", "v"]);
    let wrong = "WRONGTYPE Operation against a key holding the wrong kind of value";
    assert_eq!(error_text(run(&mut s, &["ZADD", "k", "1", "m"])), wrong);
    assert_eq!(error_text(run(&mut s, &["ZRANGE", "k", "0", "1"])), wrong);
    let float = "ERR value is not a valid float";
    assert_eq!(error_text(run(&mut s, &["ZADD", "z", "x", "m"])), float);
}

#[test]
fn eval_converts_as_redis() {
    let mut s = SimServer::new(0);
    let eval = |s: &mut SimServer, source: &str| run(s, &["EVAL", source, "1", "k", "arg"]);
    let mixed = "return {1, 2.7, -2.7, 'x', false, true, {3}, KEYS[1], ARGV[1], nil, 9}";
    assert_eq!(
        eval(&mut s, mixed),
        Value::Array(vec![
            Value::Int(1),
            Value::Int(2),
            Value::Int(-2),
            bulk("x"),
            Value::Nil,
            Value::Int(1),
            ints(&[3]),
            bulk("k"),
            bulk("arg"),
        ])
    );
    assert_eq!(
        eval(&mut s, "return redis.status_reply('FINE')"),
        Value::SimpleString("FINE".into())
    );
    assert_eq!(
        error_text(eval(&mut s, "return redis.error_reply('My Error')")),
        "My Error"
    );
    assert_eq!(error_text(eval(&mut s, "return {err='boom'}")), "boom ");
    assert_eq!(
        eval(&mut s, "return redis.call('GET', KEYS[1])"),
        Value::Nil
    );
    assert_eq!(
        eval(&mut s, "return redis.call('SET', KEYS[1], 0.1)"),
        Value::Okay
    );
    assert_eq!(s.get("k"), Some(b"0.10000000000000001".to_vec()));
    let pcall = "local r = redis.pcall('INCR', KEYS[1])\nreturn r.err";
    assert_eq!(
        eval(&mut s, pcall),
        bulk("ERR value is not an integer or out of range")
    );
    let raised = "\nreturn redis.call('INCR', KEYS[1])";
    let sha = redis::Script::new(raised).get_hash().to_owned();
    let expected =
        format!("ERR value is not an integer or out of range script: {sha}, on @user_script:2.");
    assert_eq!(error_text(eval(&mut s, raised)), expected);
    let missing = error_text(eval(&mut s, "return nope"));
    assert!(missing.contains("Script attempted to access nonexistent global variable 'nope'"));
    let readonly = error_text(eval(&mut s, "x = 1"));
    assert!(readonly.contains("user_script:1: Attempt to modify a readonly table"));
    let compile = error_text(eval(&mut s, "return +"));
    assert!(compile.starts_with("ERR Error compiling script (new function): user_script:1:"));
    let negative = run(&mut s, &["EVAL", "return 1", "-1"]);
    assert_eq!(error_text(negative), "ERR Number of keys can't be negative");
    let greater = run(&mut s, &["EVAL", "return 1", "2", "k"]);
    assert_eq!(
        error_text(greater),
        "ERR Number of keys can't be greater than number of args"
    );
}

#[test]
fn scripts_are_loaded_and_flushed() {
    let mut s = SimServer::new(0);
    let sha = load(&mut s, "return ARGV[1]");
    assert_eq!(
        run(&mut s, &["EVALSHA", &sha.to_uppercase(), "0", "x"]),
        bulk("x")
    );
    let missing = "ffffffffffffffffffffffffffffffffffffffff";
    assert_eq!(
        run(&mut s, &["SCRIPT", "EXISTS", &sha, missing]),
        ints(&[1, 0])
    );
    assert_eq!(run(&mut s, &["SCRIPT", "FLUSH"]), Value::Okay);
    let noscript = "NOSCRIPT No matching script. Please use EVAL.";
    assert_eq!(error_text(run(&mut s, &["EVALSHA", &sha, "0"])), noscript);
    // EVAL loads the script too.
    run(&mut s, &["EVAL", "return ARGV[1]", "0", "y"]);
    assert_eq!(run(&mut s, &["EVALSHA", &sha, "0", "z"]), bulk("z"));
}

#[test]
fn info_ping_and_restart() {
    let mut s = SimServer::new(5_000);
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
        run(&mut s, &["EVALSHA", &sha, "0"]),
        Value::ServerError(_)
    ));
}
