//! Unit tests of the profiles: each server's plain commands and their errors, what `COMMAND
//! INFO` and `INFO server` tell a client, and the script errors and doubles that differ (every
//! expected reply is the real server's, as the differential test reads it).

use redis::Value;

use super::profile::Profile;
use super::server::SimServer;
use super::tests::{bulk, error_text, run};

const NOW: u64 = 1_700_000_000_000;

fn server(profile: Profile) -> SimServer {
    SimServer::with_profile(profile, NOW)
}

#[test]
fn redis_7_has_no_conditions_and_no_compare_and_delete() {
    let mut s = SimServer::new(NOW);
    assert_eq!(s.profile(), Profile::Redis7);
    assert_eq!(
        run(&mut s, &["SET", "k", "t", "NX", "GET", "PX", "60000"]),
        Value::Nil
    );
    let syntax = "ERR syntax error";
    assert_eq!(
        error_text(run(&mut s, &["SET", "k", "u", "IFEQ", "t"])),
        syntax
    );
    let unknown = "ERR unknown command 'DELIFEQ', with args beginning with: 'k' 't' ";
    assert_eq!(error_text(run(&mut s, &["DELIFEQ", "k", "t"])), unknown);
    let unknown = "ERR unknown command 'DELEX', with args beginning with: 'k' 'IFEQ' 't' ";
    assert_eq!(
        error_text(run(&mut s, &["DELEX", "k", "IFEQ", "t"])),
        unknown
    );
    let info = run(&mut s, &["COMMAND", "INFO", "DELIFEQ", "DELEX"]);
    assert_eq!(info, Value::Array(vec![Value::Nil, Value::Nil]));
}

#[test]
fn valkey_9_has_set_ifeq_and_delifeq() {
    let mut s = server(Profile::Valkey9);
    assert_eq!(
        run(&mut s, &["SET", "k", "t", "NX", "GET", "PX", "60000"]),
        Value::Nil
    );
    assert_eq!(
        run(&mut s, &["SET", "k", "t", "IFEQ", "x", "PX", "9"]),
        Value::Nil
    );
    assert_eq!(
        run(&mut s, &["SET", "k", "t", "IFEQ", "t", "PX", "90000"]),
        Value::Okay
    );
    assert_eq!(run(&mut s, &["PTTL", "k"]), Value::Int(90000));
    assert_eq!(
        run(&mut s, &["SET", "k", "u", "IFEQ", "t", "GET"]),
        bulk("t")
    );
    assert_eq!(run(&mut s, &["PTTL", "k"]), Value::Int(-1));
    for refused in [
        &["IFEQ", "u", "NX"][..],
        &["NX", "IFEQ", "u"],
        &["IFEQ", "u", "IFEQ", "u"],
    ] {
        let mut args = vec!["SET", "k", "v"];
        args.extend_from_slice(refused);
        assert_eq!(
            error_text(run(&mut s, &args)),
            "ERR syntax error",
            "{args:?}"
        );
    }
    assert_eq!(run(&mut s, &["DELIFEQ", "k", "t"]), Value::Int(0));
    assert_eq!(run(&mut s, &["DELIFEQ", "k", "u"]), Value::Int(1));
    assert_eq!(run(&mut s, &["SET", "k", "t", "IFEQ", "u"]), Value::Nil);
    run(&mut s, &["ZADD", "z", "1", "m"]);
    let wrong = "WRONGTYPE Operation against a key holding the wrong kind of value";
    assert_eq!(error_text(run(&mut s, &["DELIFEQ", "z", "t"])), wrong);
    assert_eq!(
        error_text(run(&mut s, &["SET", "z", "t", "IFEQ", "t"])),
        wrong
    );
    let arity = "ERR wrong number of arguments for 'delifeq' command";
    assert_eq!(error_text(run(&mut s, &["DELIFEQ", "k"])), arity);
    assert!(error_text(run(&mut s, &["DELEX", "k"])).starts_with("ERR unknown command 'DELEX'"));
    let Value::Array(info) = run(&mut s, &["COMMAND", "INFO", "DELIFEQ", "DELEX"]) else {
        panic!("COMMAND INFO is an array");
    };
    assert!(matches!(&info[..], [Value::Array(_), Value::Nil]));
}

#[test]
fn redis_8_has_set_conditions_and_delex() {
    let mut s = server(Profile::Redis8);
    assert_eq!(run(&mut s, &["SET", "k", "t", "IFNE", "x"]), Value::Okay);
    assert_eq!(
        run(&mut s, &["SET", "k", "u", "IFEQ", "t", "XX"]),
        Value::Okay
    );
    assert_eq!(
        run(&mut s, &["SET", "k", "v", "IFEQ", "u", "NX"]),
        Value::Nil
    );
    assert_eq!(
        run(&mut s, &["SET", "k", "v", "IFEQ", "x", "IFEQ", "u"]),
        Value::Okay
    );
    let syntax = "ERR syntax error";
    assert_eq!(
        error_text(run(&mut s, &["SET", "k", "v", "NX", "IFEQ", "v"])),
        syntax
    );
    assert_eq!(
        error_text(run(&mut s, &["SET", "k", "v", "IFEQ", "v", "IFNE", "v"])),
        syntax
    );
    let digest = "ERR must be exactly 16 hexadecimal characters";
    assert_eq!(
        error_text(run(&mut s, &["SET", "k", "v", "IFDEQ", "zz"])),
        digest
    );
    assert_eq!(run(&mut s, &["SET", "n", "v", "IFDEQ", "zz"]), Value::Nil);
    assert_eq!(run(&mut s, &["DELEX", "k", "IFEQ", "x"]), Value::Int(0));
    assert_eq!(run(&mut s, &["DELEX", "k", "ifeq", "v"]), Value::Int(1));
    assert_eq!(run(&mut s, &["DELEX", "gone", "FOO", "v"]), Value::Int(0));
    run(&mut s, &["SET", "k", "v"]);
    let condition = "ERR Invalid condition. Use IFEQ, IFNE, IFDEQ, or IFDNE";
    assert_eq!(
        error_text(run(&mut s, &["DELEX", "k", "FOO", "v"])),
        condition
    );
    run(&mut s, &["ZADD", "z", "1", "m"]);
    let string = "ERR Key should be of string type if conditions are specified";
    assert_eq!(
        error_text(run(&mut s, &["DELEX", "z", "IFEQ", "v"])),
        string
    );
    assert_eq!(run(&mut s, &["DELEX", "z"]), Value::Int(1));
    let arity = "ERR wrong number of arguments for 'delex' command";
    assert_eq!(error_text(run(&mut s, &["DELEX", "k", "IFEQ"])), arity);
    let Value::Array(info) = run(&mut s, &["COMMAND", "INFO", "DELIFEQ", "DELEX"]) else {
        panic!("COMMAND INFO is an array");
    };
    assert!(matches!(&info[..], [Value::Nil, Value::Array(_)]));
}

#[test]
fn info_server_names_each_server_as_it_does() {
    for (profile, fields) in [
        (
            Profile::Redis7,
            &["redis_version:7.0.15", "redis_mode:standalone"][..],
        ),
        (
            Profile::Valkey9,
            &[
                "redis_version:7.2.4",
                "server_name:valkey",
                "valkey_version:9.1.2",
            ],
        ),
        (
            Profile::Redis8,
            &["redis_version:8.6.3", "redis_mode:standalone"],
        ),
    ] {
        let mut s = server(profile);
        let Value::BulkString(info) = run(&mut s, &["INFO", "server"]) else {
            panic!("INFO is a bulk string");
        };
        let info = String::from_utf8_lossy(&info).into_owned();
        for field in fields {
            assert!(
                info.contains(&format!("{field}\r\n")),
                "{profile:?}: {info}"
            );
        }
        assert!(info.contains("run_id:") && info.contains("uptime_in_seconds:0\r\n"));
    }
}

#[test]
fn scripts_errors_and_doubles_differ_as_the_servers_do() {
    let script = "redis.call('SET', KEYS[1], 0.1)\nreturn redis.call('GET', KEYS[1])";
    let nosuch = "return redis.call('NOSUCH')";
    for (profile, double, unknown) in [
        (
            Profile::Redis7,
            "0.10000000000000001",
            "ERR Unknown Redis command called from script script: ",
        ),
        (
            Profile::Valkey9,
            "0.1",
            "ERR Unknown command called from script script: on @user_script:1.",
        ),
        (
            Profile::Redis8,
            "0.1",
            "ERR Unknown Redis command called from script script: ",
        ),
    ] {
        let mut s = server(profile);
        assert_eq!(run(&mut s, &["EVAL", script, "1", "k"]), bulk(double));
        let error = error_text(run(&mut s, &["EVAL", nosuch, "0"]));
        assert!(error.starts_with(unknown), "{profile:?}: {error}");
    }
}
