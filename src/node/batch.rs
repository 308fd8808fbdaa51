//! One batched script call of a node's queue: the requests it carries (capped by
//! operations, keys and bytes), the one `EVALSHA` of `scripts/batch.lua` they become, and each
//! request's own reply.

use std::collections::HashSet;
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

    /// Sends the batch and answers each request; `Err` when the call as a whole failed or
    /// `deadline` (set `timeout` after the call starts) passed first (the requests are then
    /// still to be answered, by `fail`).
    ///
    /// The batch goes as one script call, except that on our own socket a plain single-key
    /// acquire whose key no other operation of the batch touches goes as a native `SET key
    /// token NX GET PX ttl` in the same write, ahead of the script call (see [`natives`]).
    /// A server that refuses those (older than Redis 7, or an ACL that allows only scripts)
    /// gets them again as script operations, and only scripts from then on.
    pub(super) async fn run(
        &mut self,
        transport: &mut Transport,
        timeout: Duration,
        mut deadline: Pin<&mut Sleep>,
    ) -> Result<(), NodeFailure> {
        while !self.runs.is_empty() {
            let native = if transport.takes_natives() {
                natives(&self.runs)
            } else {
                Vec::new()
            };
            if !native.contains(&true) {
                let command = self.command(|_| true);
                let replies = tokio::select! {
                    biased;
                    replies = transport.evalsha(&command) => replies?,
                    () = deadline.as_mut() => return Err(NodeFailure::Timeout(timeout)),
                };
                check_count(replies.len(), self.runs.len())?;
                for ((_, reply), value) in self.runs.drain(..).zip(replies) {
                    if let Some(reply) = reply {
                        let _ = reply.send(parse(value));
                    }
                }
                break;
            }
            let in_script = native.iter().filter(|native| !**native).count();
            let script = (in_script > 0).then(|| self.command(|i| !native[i]));
            let commands = self
                .runs
                .iter()
                .zip(&native)
                .filter(|(_, native)| **native)
                .map(|((req, _), _)| native_acquire(req))
                .collect();
            let (native_replies, script_replies) = tokio::select! {
                biased;
                replies = transport.pipelined(commands, script.as_ref()) => replies?,
                () = deadline.as_mut() => return Err(NodeFailure::Timeout(timeout)),
            };
            check_count(script_replies.len(), in_script)?;
            let (mut native_replies, mut script_replies) =
                (native_replies.into_iter(), script_replies.into_iter());
            let mut refused_natives = Vec::new();
            for ((req, reply), native) in self.runs.drain(..).zip(native) {
                let answer = if native {
                    match native_outcome(native_replies.next(), &req.token) {
                        NativeOutcome::Granted => Ok(1),
                        NativeOutcome::Refused => {
                            // What the script's refusal does: mark the key as waited for.
                            transport.send_and_forget(&wait_mark(&req.keys[0], req.ttl_ms));
                            Ok(0)
                        }
                        NativeOutcome::Failed(failure) => Err(failure),
                        NativeOutcome::Unsupported => {
                            refused_natives.push((req, reply));
                            continue;
                        }
                    }
                } else {
                    script_replies
                        .next()
                        .map_or_else(|| Err(NodeFailure::Reply(count_mismatch())), parse)
                };
                if let Some(reply) = reply {
                    let _ = reply.send(answer);
                }
            }
            if !refused_natives.is_empty() {
                // Nothing else in this batch touched their keys: running them after the
                // rest keeps every key's order.
                transport.refuse_natives();
                self.runs = refused_natives;
            }
        }
        self.answer_flushes();
        Ok(())
    }

    /// The batch as one `EVALSHA` of `scripts/batch.lua`: every operation's keys, then every
    /// operation's arguments (kind, token, TTL, key count, and the fair queue's three for
    /// `f`, `l` and `R`), written straight into one command buffer (no allocation per
    /// argument).
    /// Only the operations whose index `included` accepts.
    fn command(&self, included: impl Fn(usize) -> bool) -> Cmd {
        let runs = || {
            self.runs
                .iter()
                .enumerate()
                .filter(|(i, _)| included(*i))
                .map(|(_, run)| run)
        };
        let keys: usize = runs().map(|(req, _)| req.keys.len()).sum();
        let args = 3 + keys + self.runs.len() * 7;
        let mut command = Cmd::with_capacity(args, 64 + self.bytes + self.runs.len() * 48);
        command.arg("EVALSHA").arg(BATCH.get_hash()).arg(keys);
        for (req, _) in runs() {
            for key in req.keys.iter() {
                command.arg(key.as_str());
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

/// The key suffix and the shortest time (ms) of a waiting mark, as in `scripts/batch.lua`.
const WAITING: &str = ":redfence:waiting";
const MIN_WAIT_MARK_MS: u64 = 10_000;

/// Which of `runs` go as native commands: plain single-key acquires whose key no operation
/// that goes in the script touches (so that every key's operations keep their order).
fn natives(runs: &[(Request, Option<Reply>)]) -> Vec<bool> {
    let eligible =
        |req: &Request| req.op == Op::Acquire && req.queue.is_none() && req.keys.len() == 1;
    let scripted: HashSet<&str> = runs
        .iter()
        .filter(|(req, _)| !eligible(req))
        .flat_map(|(req, _)| req.keys.iter().map(String::as_str))
        .collect();
    runs.iter()
        .map(|(req, _)| eligible(req) && !scripted.contains(req.keys[0].as_str()))
        .collect()
}

/// A plain single-key acquire as one native command: `SET key token NX GET PX ttl` sets the
/// key when it is free (reply nil) and otherwise returns who holds it: our own token when
/// this is the repeat of a request that landed (granted, as the script grants it).
fn native_acquire(req: &Request) -> Cmd {
    let mut command = Cmd::with_capacity(8, 32 + req.keys[0].len() + req.token.len());
    command
        .arg("SET")
        .arg(req.keys[0].as_str())
        .arg(&*req.token)
        .arg("NX")
        .arg("GET")
        .arg("PX")
        .arg(req.ttl_ms);
    command
}

/// Marks `key` as waited for, as a refused acquire does in the script (its next release
/// publishes).
fn wait_mark(key: &str, ttl_ms: u64) -> Cmd {
    let mut command = redis::cmd("SET");
    command
        .arg(format!("{key}{WAITING}"))
        .arg("1")
        .arg("PX")
        .arg(ttl_ms.max(MIN_WAIT_MARK_MS));
    command
}

/// What a native acquire's reply means.
#[derive(Debug)]
enum NativeOutcome {
    Granted,
    Refused,
    /// The error of this lock alone (e.g. `WRONGTYPE`: the key holds another type).
    Failed(NodeFailure),
    /// The server does not take the command (too old, or not allowed): run it as a script.
    Unsupported,
}

fn native_outcome(reply: Option<Value>, token: &str) -> NativeOutcome {
    match reply {
        Some(Value::Nil) => NativeOutcome::Granted,
        Some(Value::BulkString(holder)) if holder == token.as_bytes() => NativeOutcome::Granted,
        Some(Value::BulkString(_)) => NativeOutcome::Refused,
        Some(Value::ServerError(err)) if matches!(err.code(), "ERR" | "NOPERM") => {
            NativeOutcome::Unsupported
        }
        // Classified as the script call's own error would be (e.g. `READONLY`, `OOM`).
        Some(Value::ServerError(err)) => NativeOutcome::Failed(redis::RedisError::from(err).into()),
        Some(other) => NativeOutcome::Failed(error_reply(format!("unexpected reply {other:?}"))),
        None => NativeOutcome::Failed(NodeFailure::Reply(count_mismatch())),
    }
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

    fn req(op: Op, keys: &[&str], fair: bool) -> (Request, Option<Reply>) {
        let queue = fair.then(|| {
            std::sync::Arc::new(super::super::QueueTicket {
                waiter: "w".into(),
                ticket: 1,
                lease_ms: 1_000,
            })
        });
        let req = Request {
            op,
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            token: "token".into(),
            ttl_ms: 1_000,
            queue,
        };
        (req, None)
    }

    #[test]
    fn only_plain_single_key_acquires_whose_key_the_script_does_not_touch_go_natively() {
        let runs = [
            req(Op::Acquire, &["a"], false),
            req(Op::Acquire, &["b", "c"], false), // two keys
            req(Op::Acquire, &["d"], true),       // fair
            req(Op::Extend, &["e"], false),
            req(Op::Acquire, &["f"], false),
            req(Op::Release, &["f"], false), // after f's acquire: f stays in the script
            req(Op::Release, &["g"], false),
            req(Op::Acquire, &["g"], false), // after g's release: g too
            req(Op::Acquire, &["a"], false), // a twice, both native, in order
        ];
        assert_eq!(
            natives(&runs),
            [true, false, false, false, false, false, false, false, true]
        );
    }

    #[test]
    fn what_a_native_acquires_reply_means() {
        let granted = |reply| matches!(native_outcome(reply, "t1"), NativeOutcome::Granted);
        assert!(granted(Some(Value::Nil)), "the key was free");
        assert!(
            granted(Some(Value::BulkString(b"t1".to_vec()))),
            "the repeat of our own request that landed"
        );
        assert!(matches!(
            native_outcome(Some(Value::BulkString(b"t2".to_vec())), "t1"),
            NativeOutcome::Refused
        ));
        let error_reply = |line: &str| {
            let bytes = format!("-{line}\r\n");
            match super::super::resp::parse(bytes.as_bytes()) {
                Ok(Some((value, _))) => native_outcome(Some(value), "t1"),
                other => panic!("not an error reply: {other:?}"),
            }
        };
        match error_reply("WRONGTYPE Operation against a key holding the wrong kind of value") {
            NativeOutcome::Failed(failure) => {
                assert!(format!("{failure:?}").contains("WRONGTYPE"), "{failure:?}");
            }
            other => panic!("the lock's own error: {other:?}"),
        }
        // Any other error is classified as the script call's own would be.
        match error_reply("READONLY You can't write against a read only replica.") {
            NativeOutcome::Failed(NodeFailure::Reply(err)) => {
                assert_eq!(err.code(), Some("READONLY"), "{err}");
            }
            other => panic!("the lock's own error: {other:?}"),
        }
        // Redis 6 (no NX with GET), or a user not allowed the command: the script instead.
        for line in ["ERR syntax error", "NOPERM this user has no permissions"] {
            assert!(
                matches!(error_reply(line), NativeOutcome::Unsupported),
                "{line}"
            );
        }
        assert!(matches!(
            native_outcome(Some(Value::Int(1)), "t1"),
            NativeOutcome::Failed(_)
        ));
        assert!(matches!(
            native_outcome(None, "t1"),
            NativeOutcome::Failed(_)
        ));
    }
}
