//! Unit tests of a batch: its caps, and how replies are read.

use super::*;
use crate::node::{Command, RwMode};

fn run(key: String) -> Job {
    Job::Run(Run::unanswered(Request {
        op: Op::Acquire,
        keys: vec![key].into(),
        token: "token".into(),
        ttl_ms: 1_000,
        queue: None,
        rw: None,
    }))
}

#[test]
fn a_batch_stops_at_max_bytes_and_a_larger_request_goes_alone() {
    let mut batch = Batch::default();
    let big = || run("k".repeat(MAX_BYTES / 4));
    for _ in 0..3 {
        assert!(batch.try_push(big()).is_ok());
    }
    assert!(
        batch.try_push(big()).is_err(),
        "a fourth would pass MAX_BYTES"
    );
    assert!(batch.try_push(run("small".into())).is_ok());
    assert!(!batch.full());
    // The serving loop pushes the first request whatever its size: it goes alone.
    let mut alone = Batch::default();
    alone.push(run("k".repeat(MAX_BYTES + 1)));
    assert!(alone.full());
    assert!(alone.try_push(run("small".into())).is_err());
}

#[test]
fn replies_are_integers_or_the_operations_own_error() {
    assert_eq!(parse(Value::Int(2)).ok(), Some(2));
    let err = parse(Value::BulkString(
        b"E:WRONGTYPE Operation against a key holding the wrong kind of value".to_vec(),
    ))
    .expect_err("an error");
    assert!(err.to_string().contains("error reply"), "{err}");
    assert!(format!("{err:?}").contains("WRONGTYPE"), "{err:?}");
}

#[test]
fn a_read_write_locks_operation_is_written_with_its_kind_waiter_and_mark() {
    let rw = |op, mode| {
        Run::unanswered(Request {
            op,
            keys: vec!["w".to_owned(), "r".to_owned(), "x".to_owned()].into(),
            token: "tok".into(),
            ttl_ms: 1_000,
            queue: None,
            rw: Some(std::sync::Arc::new(crate::node::RwOp {
                mode,
                waiter: "waiter".into(),
                wait_ms: 700,
            })),
        })
    };
    let runs = [rw(Op::Acquire, RwMode::Read), rw(Op::Leave, RwMode::Write)];
    let mut cmd = Cmd::new();
    // The repair flag does not touch them.
    write_call(
        runs.iter(),
        Touch::WithHelpers,
        &mut cmd,
        ("EVAL", "body"),
        true,
        None,
    );
    let args: Vec<String> = cmd
        .args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            _ => String::new(),
        })
        .collect();
    let expected = [
        "EVAL", "body", "6", "w", "r", "x", "w", "r", "x", "ra", "tok", "1000", "3", "waiter",
        "700", "wl", "tok", "1000", "3", "waiter", "700",
    ];
    assert_eq!(args, expected);
    let kind = |mode, op| Command::ReadWrite(mode, op).script_kind(false);
    assert_eq!(kind(RwMode::Write, Op::Extend), "we");
    assert_eq!(kind(RwMode::Read, Op::Release), "rr");
}
