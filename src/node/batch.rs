//! One batched script call of a node's queue: the requests it carries (capped by
//! operations, keys and bytes), the one `EVALSHA` of `scripts/batch.lua` they become, and each
//! request's own reply.

use std::pin::Pin;
use std::sync::LazyLock;
use std::time::Duration;

use redis::{Cmd, Script, Value};
use tokio::sync::oneshot;
use tokio::time::Sleep;

use super::pipeline::{Job, Reply};
use super::transport::Transport;
use super::{Op, Request};
use crate::error::NodeFailure;

pub(super) const BATCH_SOURCE: &str = include_str!("../scripts/batch.lua");
pub(super) static BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(BATCH_SOURCE));

/// The most operations one batched call carries.
pub(crate) const MAX_OPS: usize = 512;
/// The most keys one batched call carries (an operation with more keys goes alone).
pub(crate) const MAX_KEYS: usize = 4_096;
/// The most bytes of key names, tokens and waiter ids one batched call carries (an operation
/// with more goes alone).
pub(crate) const MAX_BYTES: usize = 1 << 20;
/// The requests of one call, and the markers that wait for it.
#[derive(Default)]
pub(super) struct Batch {
    runs: Vec<(Request, Option<Reply>)>,
    flushes: Vec<oneshot::Sender<()>>,
    keys: usize,
    bytes: usize,
}

/// The bytes of names and ids a request adds to a call.
fn size(req: &Request) -> usize {
    req.keys.iter().map(String::len).sum::<usize>()
        + req.token.len()
        + req.queue.as_deref().map_or(0, |q| q.waiter.len())
}

impl Batch {
    /// Adds `job` whatever its size: the first of a batch (one larger than the caps goes
    /// alone).
    pub(super) fn push(&mut self, job: Job) {
        let _ = self.add(job, true);
    }

    /// Adds `job` if it fits within the caps; gives it back if not.
    pub(super) fn try_push(&mut self, job: Job) -> Result<(), Job> {
        self.add(job, false)
    }

    fn add(&mut self, job: Job, always: bool) -> Result<(), Job> {
        match job {
            Job::Run { req, reply } => {
                let keys = self.keys + req.keys.len();
                let bytes = self.bytes + size(&req);
                if !always && (keys > MAX_KEYS || bytes > MAX_BYTES) {
                    return Err(Job::Run { req, reply });
                }
                self.keys = keys;
                self.bytes = bytes;
                self.runs.push((req, reply));
            }
            Job::Flush(done) => self.flushes.push(done),
        }
        Ok(())
    }

    pub(super) fn full(&self) -> bool {
        self.runs.len() >= MAX_OPS || self.keys >= MAX_KEYS || self.bytes >= MAX_BYTES
    }

    /// Sends the batch as one script call and answers each request; `Err` when the call as a
    /// whole failed or `deadline` (set `timeout` after the call starts) passed first (the
    /// requests are then still to be answered, by `fail`).
    pub(super) async fn run(
        &mut self,
        transport: &mut Transport,
        timeout: Duration,
        deadline: Pin<&mut Sleep>,
    ) -> Result<(), NodeFailure> {
        if self.runs.is_empty() {
            self.answer_flushes();
            return Ok(());
        }
        let command = self.command();
        let replies = tokio::select! {
            biased;
            replies = transport.evalsha(&command) => replies?,
            () = deadline => return Err(NodeFailure::Timeout(timeout)),
        };
        if replies.len() != self.runs.len() {
            return Err(NodeFailure::Reply(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "the batch script returned a reply count other than the request count",
            ))));
        }
        for ((_, reply), value) in self.runs.drain(..).zip(replies) {
            if let Some(reply) = reply {
                let _ = reply.send(parse(value));
            }
        }
        self.answer_flushes();
        Ok(())
    }

    /// The batch as one `EVALSHA` of `scripts/batch.lua`: every operation's keys, then every
    /// operation's arguments (kind, token, TTL, key count, and the fair queue's three for
    /// `f`, `l` and `R`), written straight into one command buffer (no allocation per
    /// argument).
    fn command(&self) -> Cmd {
        let keys = self.keys;
        let args = 3 + keys + self.runs.len() * 7;
        let mut command = Cmd::with_capacity(args, 64 + self.bytes + self.runs.len() * 48);
        command.arg("EVALSHA").arg(BATCH.get_hash()).arg(keys);
        for (req, _) in &self.runs {
            for key in req.keys.iter() {
                command.arg(key.as_str());
            }
        }
        for (req, _) in &self.runs {
            let kind = match (req.op, &req.queue) {
                (Op::Acquire, None) => "a",
                (Op::Acquire, Some(_)) => "f",
                (Op::Extend, _) => "e",
                (Op::Release, None) => "r",
                (Op::Release, Some(_)) => "R",
                (Op::Leave, _) => "l",
            };
            command
                .arg(kind)
                .arg(&*req.token)
                .arg(req.ttl_ms)
                .arg(req.keys.len());
            if matches!(kind, "f" | "l" | "R") {
                let (waiter, ticket, lease) = req
                    .queue
                    .as_deref()
                    .map_or(("", 0, 0), |q| (&*q.waiter, q.ticket, q.lease_ms));
                command.arg(waiter).arg(ticket).arg(lease);
            }
        }
        command
    }

    pub(super) fn fail(&mut self, failure: &NodeFailure) {
        for (_, reply) in self.runs.drain(..) {
            if let Some(reply) = reply {
                let _ = reply.send(Err(failure.clone()));
            }
        }
        self.answer_flushes();
    }

    fn answer_flushes(&mut self) {
        for done in self.flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

/// `SCRIPT LOAD` of the batch script.
pub(crate) fn load_batch_script() -> Cmd {
    let mut load = redis::cmd("SCRIPT");
    load.arg("LOAD").arg(BATCH_SOURCE);
    load
}

/// One operation's reply: its integer, or the error of that operation alone.
fn parse(value: Value) -> Result<i64, NodeFailure> {
    let error = |detail: String| {
        NodeFailure::Reply(redis::RedisError::from((
            redis::ErrorKind::Extension,
            "error reply",
            detail,
        )))
    };
    match value {
        Value::Int(n) => Ok(n),
        Value::BulkString(bytes) => Err(error(
            String::from_utf8_lossy(&bytes)
                .trim_start_matches("E:")
                .to_owned(),
        )),
        Value::SimpleString(text) => Err(error(text.trim_start_matches("E:").to_owned())),
        other => Err(error(format!("unexpected reply {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(key: String) -> Job {
        Job::Run {
            req: Request {
                op: Op::Acquire,
                keys: vec![key].into(),
                token: "token".into(),
                ttl_ms: 1_000,
                queue: None,
            },
            reply: None,
        }
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
}
