//! One batched script call of a node's queue: the requests it carries (capped by
//! operations, keys and bytes), the one `EVALSHA` of `scripts/batch.lua` they become, and each
//! request's own reply.

use std::pin::Pin;
use std::sync::LazyLock;
use std::time::Duration;

use redis::{Cmd, Script, Value};
use tokio::sync::oneshot;
use tokio::time::Sleep;

use super::native::{self, NativeOutcome};
use super::pipeline::{Job, Reply};
use super::socket::Packed;
use super::transport::{PipelineError, Pipelined, Transport};
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
    /// The call being sent, kept for the next batch's: its native commands (then the script
    /// call and the probe, as written), and its script call.
    natives: Packed,
    script: Cmd,
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

    /// Starts the next batch with `job`, as [`push`](Self::push), keeping the last batch's
    /// allocations (a queue under load runs thousands of batches a second). The last batch
    /// was answered ([`run`](Self::run) or [`fail`](Self::fail)).
    pub(super) fn start(&mut self, job: Job) {
        debug_assert!(self.runs.is_empty() && self.flushes.is_empty());
        self.keys = 0;
        self.bytes = 0;
        self.push(job);
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

    /// Sends the batch and answers each request; `Err` when the call as a whole failed or
    /// `deadline` (set `timeout` after the call starts) passed first (the requests are then
    /// still to be answered, by `fail`).
    ///
    /// The batch goes as one script call, except that on a node's own socket plain
    /// single-key acquires may go as native commands in the same write, and a connection
    /// not probed yet carries the probe (see `node/native.rs`).
    pub(super) async fn run(
        &mut self,
        transport: &mut Transport,
        timeout: Duration,
        mut deadline: Pin<&mut Sleep>,
    ) -> Result<(), NodeFailure> {
        let mut repeated = false;
        while !self.runs.is_empty() {
            let native = if transport.takes_natives() {
                native::natives(&self.runs)
            } else {
                vec![false; self.runs.len()]
            };
            let natives = native.iter().filter(|native| **native).count();
            let probe = (natives == 0 && transport.wants_probe())
                .then(|| {
                    let (first, _) = &self.runs[0];
                    let key = first.keys.first()?;
                    Some(native::Probe::new(key, &first.token))
                })
                .flatten();
            if natives == 0 && probe.is_none() {
                self.write_script(|_| true);
                let replies = tokio::select! {
                    biased;
                    replies = transport.evalsha(&self.script) => replies?,
                    () = deadline.as_mut() => {
                        transport.script_failed();
                        return Err(NodeFailure::Timeout(timeout));
                    }
                };
                check_count(replies.len(), self.runs.len())?;
                for ((_, reply), value) in self.runs.drain(..).zip(replies) {
                    if let Some(reply) = reply {
                        let _ = reply.send(parse(value));
                    }
                }
                break;
            }
            let in_script = self.runs.len() - natives;
            if in_script > 0 {
                self.write_script(|i| !native[i]);
            }
            let script = (in_script > 0).then_some(&self.script);
            self.natives.clear();
            for ((req, _), _) in self.runs.iter().zip(&native).filter(|(_, native)| **native) {
                native::push_native_acquire(&mut self.natives, req);
            }
            let pipelined = tokio::select! {
                biased;
                pipelined = transport.pipelined(&mut self.natives, script, probe.as_ref()) => {
                    pipelined
                }
                () = deadline.as_mut() => {
                    transport.script_failed();
                    return Err(NodeFailure::Timeout(timeout));
                }
            };
            let Pipelined {
                natives: native_replies,
                script: script_replies,
            } = match pipelined {
                Ok(pipelined) => pipelined,
                // On the new connection the batch goes as scripts (natives wait for the
                // probe); each operation is repeat-safe.
                Err(PipelineError::Lost(_)) if !repeated => {
                    repeated = true;
                    continue;
                }
                Err(PipelineError::Lost(failure) | PipelineError::Failed(failure)) => {
                    return Err(failure);
                }
            };
            let mut script_replies = match script_replies {
                Ok(replies) => {
                    check_count(replies.len(), in_script)?;
                    Ok(replies.into_iter())
                }
                Err(failure) => Err(failure),
            };
            let mut native_replies = native_replies.into_iter();
            let mut unsupported = Vec::new();
            for ((req, reply), native) in self.runs.drain(..).zip(native) {
                let answer = if native {
                    match native::native_outcome(native_replies.next(), &req.token) {
                        NativeOutcome::Granted => Ok(1),
                        NativeOutcome::Refused => {
                            transport.send_and_forget(&native::wait_mark(&req.keys[0], req.ttl_ms));
                            Ok(0)
                        }
                        NativeOutcome::Failed(failure) => Err(failure),
                        NativeOutcome::Unsupported => {
                            unsupported.push((req, reply));
                            continue;
                        }
                    }
                } else {
                    match &mut script_replies {
                        Ok(replies) => replies
                            .next()
                            .map_or_else(|| Err(NodeFailure::Reply(count_mismatch())), parse),
                        Err(failure) => Err(failure.clone()),
                    }
                };
                if let Some(reply) = reply {
                    let _ = reply.send(answer);
                }
            }
            if !unsupported.is_empty() {
                // Nothing else in this batch touched their keys: running them after the
                // rest, as script operations, keeps every key's order.
                transport.refuse_natives();
                self.runs = unsupported;
            }
        }
        self.answer_flushes();
        Ok(())
    }

    /// The batch as one `EVALSHA` of `scripts/batch.lua`: every operation's keys, then every
    /// operation's arguments (kind, token, TTL, key count, and the fair queue's three for
    /// `f`, `l` and `R`), written straight into one command buffer (no allocation per
    /// argument).
    /// Only the operations whose index `included` accepts. Written into `self.script`,
    /// whose allocation the next batch reuses.
    fn write_script(&mut self, included: impl Fn(usize) -> bool) {
        let Batch { runs, script, .. } = self;
        let runs = || {
            runs.iter()
                .enumerate()
                .filter(|(i, _)| included(*i))
                .map(|(_, run)| run)
        };
        let keys: usize = runs().map(|(req, _)| req.keys.len()).sum();
        script.clear();
        script.arg("EVALSHA").arg(BATCH.get_hash()).arg(keys);
        for (req, _) in runs() {
            for key in req.keys.iter() {
                script.arg(key.as_str());
            }
        }
        for (req, _) in runs() {
            let kind = match (req.op, &req.queue) {
                (Op::Acquire, None) => "a",
                (Op::Acquire, Some(_)) => "f",
                (Op::Extend, _) => "e",
                (Op::Release, None) => "r",
                (Op::Release, Some(_)) => "R",
                (Op::Leave, _) => "l",
            };
            script
                .arg(kind)
                .arg(&*req.token)
                .arg(req.ttl_ms)
                .arg(req.keys.len());
            if matches!(kind, "f" | "l" | "R") {
                let (waiter, ticket, lease) = req
                    .queue
                    .as_deref()
                    .map_or(("", 0, 0), |q| (&*q.waiter, q.ticket, q.lease_ms));
                script.arg(waiter).arg(ticket).arg(lease);
            }
        }
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

fn check_count(replies: usize, requests: usize) -> Result<(), NodeFailure> {
    if replies == requests {
        Ok(())
    } else {
        Err(NodeFailure::Reply(count_mismatch()))
    }
}

fn count_mismatch() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "the batch script returned a reply count other than the request count",
    ))
}

fn error_reply(detail: String) -> NodeFailure {
    NodeFailure::Reply(redis::RedisError::from((
        redis::ErrorKind::Extension,
        "error reply",
        detail,
    )))
}

/// One operation's reply: its integer, or the error of that operation alone.
fn parse(value: Value) -> Result<i64, NodeFailure> {
    let error = error_reply;
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
