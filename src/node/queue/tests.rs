//! The queue over fake links: advisory calls in line, the backlog behind a hung call.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::*;
use crate::node::batch::test_jobs::job;
use crate::node::{GuardedWrite, Node, Op, Request, write_if_held};
use crate::testing::fake::{FAKE_TIMEOUT, Fake, FakeNode};

fn acquire(key: &str, token: &str) -> Request {
    Request {
        op: Op::Acquire,
        keys: vec![key.to_owned()].into(),
        token: token.into(),
        ttl_ms: 10_000,
        queue: None,
        rw: None,
    }
}

fn write(lock_key: &str, token: &str) -> GuardedWrite {
    GuardedWrite {
        lock_key: lock_key.into(),
        token: token.into(),
        key: "record".into(),
        value: Some("leader".into()),
        ttl_ms: 10_000,
    }
}

#[tokio::test(start_paused = true)]
async fn an_advisory_call_runs_in_line_after_the_lock_calls_made_before_it() {
    let node = FakeNode::new(Fake::Real);
    // Not awaited: queued, as a lock's acquire is before its holder's guarded write.
    let granted = node.call(&acquire("lock", "t1"));
    let written = write_if_held(&node, write("lock", "t1")).await;
    assert!(
        written.expect("answered"),
        "the write ran after the acquire"
    );
    assert_eq!(granted.await.expect("granted"), 1);
    assert_eq!(node.holder("record").as_deref(), Some("leader"));
}

#[tokio::test(start_paused = true)]
async fn an_advisory_call_behind_a_hung_call_is_answered_within_one_timeout() {
    let node = Arc::new(FakeNode::new(Fake::Never));
    let hung = node.call(&acquire("lock", "t1"));
    let start = tokio::time::Instant::now();
    let written = write_if_held(&*node, write("lock", "t1")).await;
    assert!(written.is_err(), "{written:?}");
    assert!(start.elapsed() <= FAKE_TIMEOUT, "{:?}", start.elapsed());
    assert!(hung.await.is_err());
    // The node answers again: the next call runs.
    node.set(Op::Acquire, Fake::Real);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        node.call(&acquire("other", "t2")).await.expect("granted"),
        1
    );
}

fn tokens(backlog: &VecDeque<Job>) -> Vec<String> {
    backlog
        .iter()
        .map(|job| match job {
            Job::Run(run) => run.req.token.to_string(),
            Job::Flush(_) => "flush".to_owned(),
            Job::Advise { .. } => "advise".to_owned(),
        })
        .collect()
}

#[test]
fn behind_a_hung_call_every_caller_is_answered_and_the_cleanups_are_kept_in_order() {
    let failure = NodeFailure::Timeout(Duration::from_millis(50));
    let mut backlog = VecDeque::new();
    let mut answers = Vec::new();
    for (op, token) in [
        (Op::Acquire, "a1"),
        (Op::Release, "r1"),
        (Op::Extend, "e1"),
        (Op::Leave, "l1"),
        (Op::Release, "r2"),
    ] {
        let (job, answer) = job(op, token);
        backlog.push_back(job);
        answers.push(answer);
    }
    let (flushed, _) = oneshot::channel();
    backlog.push_back(Job::Flush(flushed));

    answer_behind_hung_call(&mut backlog, &failure);

    for mut answer in answers {
        assert!(matches!(
            answer.try_recv(),
            Ok(Err(NodeFailure::Timeout(_)))
        ));
    }
    // The acquire and the extend were never sent: dropped.
    let kept = ["r1", "l1", "r2", "flush"];
    assert_eq!(tokens(&backlog), kept);
    // A second timeout answers nobody twice and keeps the same jobs.
    answer_behind_hung_call(&mut backlog, &failure);
    assert_eq!(tokens(&backlog), kept);
}

#[test]
fn a_node_that_stays_hung_keeps_a_bounded_backlog() {
    let failure = NodeFailure::Timeout(Duration::from_millis(50));
    let mut backlog = VecDeque::new();
    for round in 0..3 {
        for i in 0..QUEUE_CAPACITY {
            backlog.push_back(job(Op::Release, &format!("r{round}-{i}")).0);
            backlog.push_back(job(Op::Acquire, &format!("a{round}-{i}")).0);
        }
        answer_behind_hung_call(&mut backlog, &failure);
        assert_eq!(backlog.len(), QUEUE_CAPACITY);
    }
    // The oldest releases are kept: they follow the acquires most likely to have landed.
    assert_eq!(tokens(&backlog)[..2], ["r0-0", "r0-1"]);
}
