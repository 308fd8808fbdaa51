//! Unit tests of the plain-command plans (`Plan`, `Outcome`) and their follow-ups.

use std::sync::Arc;

use super::*;
use crate::node::QueueTicket;
use crate::node::batch::test_jobs;

fn run(op: Op, keys: &[&str], token: &str) -> Run {
    Run::unanswered(Request {
        keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        ttl_ms: 5_000,
        ..test_jobs::request(op, token)
    })
}

/// The error reply `-text` as a pipeline holds it.
fn server_error(text: &str) -> Value {
    let value =
        redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).expect("an error reply");
    assert!(matches!(value, Value::ServerError(_)), "{value:?}");
    value
}

const ALL: PlainSupport = PlainSupport {
    delete: Some(CompareAndDelete::Delifeq),
    released: true,
};

/// What the server's `values` (one per command sent) say of `runs`, all sent plain where
/// they can be.
fn answered(runs: &[Run], values: Vec<Value>) -> Outcome {
    let plan = Plan::new(runs, ALL);
    assert_eq!(values.len(), plan.commands);
    plan.read(runs, values)
}

fn pieces(runs: &[Run], support: PlainSupport) -> Vec<Piece> {
    Plan::new(runs, support).pieces
}

#[test]
fn a_read_write_locks_operations_never_go_plain() {
    for op in [Op::Acquire, Op::Extend, Op::Release] {
        // Even on one key (a read-write lock has three): the script's kinds alone.
        let mut rw = run(op, &["k"], "t");
        rw.req.rw = Some(Arc::new(crate::node::RwOp {
            mode: crate::node::RwMode::Write,
            waiter: "w".into(),
            wait_ms: 1_000,
        }));
        assert_eq!(pieces(&[rw], ALL), vec![Piece::Script(0..1)]);
    }
}

#[test]
fn only_single_key_locks_outside_fair_mode_go_plain_and_the_rest_is_grouped() {
    let mut fair = run(Op::Acquire, &["f"], "t");
    fair.req.queue = Some(Arc::new(QueueTicket {
        waiter: "w".into(),
        ticket: 1,
        lease_ms: 1_000,
    }));
    let runs = [
        run(Op::Acquire, &["a"], "t"),
        run(Op::Acquire, &["b", "c"], "t"),
        fair,
        run(Op::Release, &["d"], "t"),
        run(Op::Extend, &["e"], "t"),
        run(Op::Leave, &["g"], "t"),
    ];
    assert_eq!(
        pieces(&runs, ALL),
        vec![
            Piece::Plain(Plain::Acquire, 0),
            Piece::Script(1..3),
            Piece::Plain(Plain::Release(CompareAndDelete::Delifeq), 3),
            Piece::Plain(Plain::Extend, 4),
            Piece::Script(5..6),
        ]
    );
    // Acquires wait for a release to have gone through.
    let unproven = PlainSupport {
        released: false,
        ..ALL
    };
    assert_eq!(pieces(&runs, unproven)[0], Piece::Script(0..3));
    let none = PlainSupport::default();
    assert!(!none.any_plain(&runs));
    assert_eq!(pieces(&runs, none), vec![Piece::Script(0..6)]);
    // A release is two commands (DELIFEQ, EXISTS of the mark).
    assert_eq!(Plan::new(&runs, ALL).commands, 6);
}

#[test]
fn replies_read_as_the_scripts_and_a_taken_key_runs_again_in_the_script() {
    let runs = [
        run(Op::Acquire, &["free"], "t1"),
        run(Op::Acquire, &["taken"], "t2"),
        run(Op::Acquire, &["full"], "t3"),
        run(Op::Extend, &["held"], "t5"),
        run(Op::Extend, &["lost"], "t6"),
        run(Op::Release, &["waited"], "t7"),
        run(Op::Release, &["quiet"], "t8"),
        run(Op::Release, &["gone"], "t9"),
        run(Op::Release, &["wrongtype"], "t10"),
    ];
    let outcome = answered(
        &runs,
        vec![
            Value::Okay,
            // SET … NX found the key taken (another owner, another type, or our own first send
            // of a batch resent after a lost connection): the script tells which.
            Value::Nil,
            server_error("OOM command not allowed when used memory > 'maxmemory'."),
            Value::Okay,
            Value::Nil,
            Value::Int(1),
            Value::Int(1),
            Value::Int(1),
            Value::Int(0),
            Value::Int(0),
            Value::Int(1),
            server_error("WRONGTYPE Operation against a key holding the wrong kind of value"),
            Value::Int(0),
        ],
    );
    assert_eq!(
        outcome.again,
        vec![1],
        "the taken key's acquire, in the script"
    );
    assert_eq!(outcome.replies[1], None);
    let ints: Vec<Option<i64>> = outcome
        .replies
        .iter()
        .map(|v| match v {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        })
        .collect();
    assert_eq!(
        ints,
        vec![
            Some(1), // free: granted
            None,    // taken: run again in the script
            None,    // the server's error: the acquire's own
            Some(1),
            Some(0),
            Some(1), // deleted, and marked
            Some(1), // deleted, nobody waited
            Some(0), // not ours (a waiter's mark is not ours to announce)
            Some(0), // another type: nothing deleted
        ]
    );
    assert!(matches!(outcome.replies[2], Some(Value::ServerError(_))));
    assert_eq!(outcome.announce, vec!["waited".to_owned()]);
    assert!(outcome.released && !outcome.refused && !outcome.noscript);
    let (_, commands) = follow_up(&outcome).expect("a follow-up");
    assert_eq!(
        commands, 1,
        "one announcing script call (the script marks the taken key)"
    );
}

#[test]
fn no_plain_acquire_asks_for_the_keys_value() {
    let runs = [run(Op::Acquire, &["a"], "t1")];
    let plan = Plan::new(&runs, ALL);
    let sent = String::from_utf8_lossy(&plan.pipeline.get_packed_pipeline()).into_owned();
    assert!(!sent.contains("GET"), "{sent}");
    assert!(sent.contains("NX"), "{sent}");
}

#[test]
fn a_refused_plain_command_or_a_missing_script_runs_again_in_the_script() {
    let runs = [
        run(Op::Release, &["r"], "t1"),
        run(Op::Acquire, &["x", "y"], "t2"),
        run(Op::Extend, &["e"], "t3"),
        run(Op::Release, &["s"], "t4"),
    ];
    let outcome = answered(
        &runs,
        vec![
            server_error("NOPERM User app has no permissions to run the 'delifeq' command"),
            Value::Int(0),
            server_error("NOSCRIPT No matching script."),
            server_error("ERR unknown command 'SET', with args beginning with:"),
            Value::Int(1),
            Value::Int(0),
        ],
    );
    assert!(outcome.refused && outcome.noscript);
    assert_eq!(outcome.again, vec![0, 1, 2]);
    assert_eq!(outcome.replies[3], Some(Value::Int(1)));
    assert!(follow_up(&outcome).is_none());
    // Another error of the script call is each of its requests' own.
    let plan = Plan::new(&runs[1..2], ALL);
    let outcome = plan.read(&runs[1..2], vec![server_error("BUSY Redis is busy")]);
    assert!(matches!(outcome.replies[0], Some(Value::ServerError(_))));
    assert!(outcome.again.is_empty() && !outcome.refused);
}

#[test]
fn a_plain_release_or_extension_keeps_its_own_server_error() {
    let runs = [
        run(Op::Release, &["r"], "t1"),
        run(Op::Extend, &["e"], "t2"),
        run(Op::Extend, &["old"], "t3"),
    ];
    let outcome = answered(
        &runs,
        vec![
            server_error("LOADING Redis is loading the dataset in memory"),
            Value::Int(0),
            server_error("READONLY You can't write against a read only replica."),
            // A server replaced by one without SET … IFEQ.
            server_error("ERR syntax error"),
        ],
    );
    // Errors, not "deleted nothing" / "not ours" (which would read as a lost lock).
    assert!(matches!(outcome.replies[0], Some(Value::ServerError(_))));
    assert!(matches!(outcome.replies[1], Some(Value::ServerError(_))));
    // The old server's refusal turns the link to the script, which runs the request again.
    assert!(outcome.refused && !outcome.noscript);
    assert_eq!(outcome.again, vec![2]);
    assert!(!outcome.released);
}

/// `COMMAND INFO`'s entry for a command the server has (its name first).
fn described(name: &str) -> Value {
    Value::Array(vec![Value::BulkString(name.as_bytes().to_vec())])
}

#[test]
fn the_server_has_compare_and_delete_when_command_info_describes_it() {
    // `COMMAND INFO DELIFEQ DELEX`: Valkey 9 knows the first, Redis 8.4 the second.
    let valkey_9 = PlainSupport::detected(&Value::Array(vec![described("delifeq"), Value::Nil]));
    assert_eq!(valkey_9.delete, Some(CompareAndDelete::Delifeq));
    assert!(!valkey_9.released);
    let redis_8_4 = PlainSupport::detected(&Value::Array(vec![Value::Nil, described("delex")]));
    assert_eq!(redis_8_4.delete, Some(CompareAndDelete::Delex));
    let both = Value::Array(vec![described("delifeq"), described("delex")]);
    assert_eq!(
        PlainSupport::detected(&both).delete,
        Some(CompareAndDelete::Delifeq)
    );
    let unknown = Value::Array(vec![Value::Nil, Value::Nil]);
    assert_eq!(PlainSupport::detected(&unknown), PlainSupport::default());
    let refused = server_error("NOPERM this user has no permissions to run the 'command'");
    assert_eq!(PlainSupport::detected(&refused), PlainSupport::default());
}

#[test]
fn on_redis_8_4_a_release_is_delex_ifeq_and_the_rest_is_as_on_valkey_9() {
    let support = PlainSupport {
        delete: Some(CompareAndDelete::Delex),
        released: true,
    };
    let runs = [
        run(Op::Acquire, &["a"], "t1"),
        run(Op::Extend, &["a"], "t1"),
        run(Op::Release, &["a"], "t1"),
    ];
    let plan = Plan::new(&runs, support);
    let expected = redis::pipe()
        .cmd("SET")
        .arg("a")
        .arg("t1")
        .arg("NX")
        .arg("PX")
        .arg(5_000)
        .cmd("SET")
        .arg("a")
        .arg("t1")
        .arg("IFEQ")
        .arg("t1")
        .arg("PX")
        .arg(5_000)
        .cmd("DELEX")
        .arg("a")
        .arg("IFEQ")
        .arg("t1")
        .cmd("EXISTS")
        .arg(format!("a{WAITING}"))
        .get_packed_pipeline();
    assert_eq!(
        String::from_utf8_lossy(&plan.pipeline.get_packed_pipeline()),
        String::from_utf8_lossy(&expected)
    );
    assert_eq!(plan.commands, 4);
    // DELEX answers as DELIFEQ does: 1 deleted, 0 not ours.
    let outcome = plan.read(
        &runs,
        vec![Value::Okay, Value::Okay, Value::Int(1), Value::Int(0)],
    );
    assert_eq!(
        outcome.replies,
        vec![
            Some(Value::Int(1)),
            Some(Value::Int(1)),
            Some(Value::Int(1))
        ]
    );
    assert!(outcome.released && outcome.announce.is_empty());
}
