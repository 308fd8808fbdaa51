//! Plain commands instead of the batch script, on servers that have compare-and-delete
//! (Valkey 9's `DELIFEQ`, Redis 8.4's `DELEX … IFEQ`): a single-key lock outside fair mode is
//! `SET k t NX PX ttl` to acquire, `SET k t IFEQ t PX ttl` to extend and `DELIFEQ k t`
//! (`DELEX k IFEQ t`) to release, with no Lua. Keys and values are the script's, so
//! node-redlock and redsync still interoperate. The rest of a batch (several keys, fair mode)
//! goes as script calls in the same pipeline, in order. On servers without compare-and-delete,
//! plain acquires beside scripted releases did not pay (Redis 7.0: 64-way throughput
//! 0.89–0.94×, BENCHMARKS.md): the script does everything there.
//!
//! No command brings a key's value back: the server compares it (`IFEQ`, `DELIFEQ`), and an
//! acquire asks for nothing but the `SET`'s outcome (a `SET … NX GET` shipped a foreign value
//! back on every refusal, megabytes for a large one). A `SET … NX` that finds the key taken
//! cannot tell another owner from our own `SET` landed by the first send of a batch resent
//! after a lost connection, nor from a key of another type: that acquire runs again in the
//! script after the pipeline (as a refused plain command does), which tells them apart
//! reading no more than a token's length of the value, and marks the key as waited for.
//!
//! What the script does beside a contended release follows it, best effort: a release that
//! found its key marked announces itself (the script's `n`), so that waiters in other
//! processes still hear of it.

use std::ops::Range;

use redis::{Cmd, Pipeline, RedisWrite, ToRedisArgs, Value};

use super::batch::{BATCH, Run, Touch, write_script};
use super::{Command, Op, Request};
use crate::error::Class;
use crate::helper_keys::WAITING;

/// What a server link knows of its server's commands, for the connection it uses. `false`
/// (the script for everything) on a server without compare-and-delete, for a user not allowed
/// to ask (`COMMAND INFO`), or once a plain command was refused (no permission; an unknown
/// command after the server was replaced by an older one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct PlainSupport {
    /// The server's compare-and-delete, which comes with `SET … IFEQ` (Valkey 9, Redis 8.4):
    /// plain releases and extensions, and acquires once `released`. `None`: the script.
    pub(super) delete: Option<CompareAndDelete>,
    /// A release went through on this connection (plain, or the script): acquires go plain
    /// only then, so that no lock is granted by a command this user may run that it could not
    /// release.
    pub(super) released: bool,
}

/// A server's compare-and-delete command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CompareAndDelete {
    /// `DELIFEQ key value` (Valkey 9).
    Delifeq,
    /// `DELEX key IFEQ value` (Redis 8.4).
    Delex,
}

impl PlainSupport {
    /// From the reply to `COMMAND INFO DELIFEQ DELEX` ([`detection`]): one entry per command,
    /// nil for an unknown one. `DELIFEQ` is preferred where a server has both.
    pub(super) fn detected(command_info: &Value) -> PlainSupport {
        let known = |i: usize| {
            matches!(
                command_info,
                Value::Array(entries) if matches!(entries.get(i), Some(Value::Array(_)))
            )
        };
        let delete = if known(0) {
            Some(CompareAndDelete::Delifeq)
        } else if known(1) {
            Some(CompareAndDelete::Delex)
        } else {
            None
        };
        PlainSupport {
            delete,
            released: false,
        }
    }

    /// How `req` goes: as a plain command of this kind, or in the script (`None`).
    fn plain(self, req: &Request) -> Option<Plain> {
        // A fair line's and a read-write lock's operations are the script's alone (a sorted
        // set, three keys).
        if req.keys.len() != 1 {
            return None;
        }
        let delete = self.delete?;
        match req.command() {
            Command::Acquire if self.released => Some(Plain::Acquire),
            Command::Extend => Some(Plain::Extend),
            Command::Release => Some(Plain::Release(delete)),
            _ => None,
        }
    }

    /// Whether any of `runs` would go as a plain command.
    pub(super) fn any_plain(self, runs: &[Run]) -> bool {
        runs.iter().any(|run| self.plain(&run.req).is_some())
    }
}

/// What tells a link whether its server has compare-and-delete:
/// `COMMAND INFO DELIFEQ DELEX`.
pub(super) fn detection() -> Cmd {
    let mut cmd = redis::cmd("COMMAND");
    cmd.arg("INFO").arg("DELIFEQ").arg("DELEX");
    cmd
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plain {
    Acquire,
    Extend,
    Release(CompareAndDelete),
}

/// One piece of a batch in its pipeline: a request as a plain command (a release is two:
/// compare-and-delete and `EXISTS` of its waiting mark), or consecutive requests in one
/// script call.
#[derive(Debug, PartialEq, Eq)]
enum Piece {
    Plain(Plain, usize),
    Script(Range<usize>),
}

/// A batch as one pipeline of plain commands and script calls, in the requests' order. Kept
/// by its link and written anew for each batch (its allocations reused).
#[derive(Default)]
pub(super) struct Plan {
    pieces: Vec<Piece>,
    pub(super) pipeline: Pipeline,
    /// The commands in the pipeline.
    pub(super) commands: usize,
}

/// What the replies of a [`Plan`]'s pipeline say: a reply per request (`None` for those to
/// run again in the script), and what to do beside them.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    pub(super) replies: Vec<Option<Value>>,
    /// Requests to run again in the script, in order: a script call the server had no script
    /// for (`NOSCRIPT`), a plain command it refused, or a plain acquire that found its key
    /// taken (the script tells another owner from a repeat of ours, and marks the key).
    pub(super) again: Vec<usize>,
    /// Whether a plain command was refused (the link turns to the script for everything).
    pub(super) refused: bool,
    /// Whether a script call met `NOSCRIPT`: the server may have restarted (its identity is
    /// read before the requests run again).
    pub(super) noscript: bool,
    /// Whether a release went through, plain or in a script call (see
    /// [`PlainSupport::released`]).
    pub(super) released: bool,
    /// Keys a plain release deleted while they were marked: their release is to be announced.
    pub(super) announce: Vec<String>,
}

impl Plan {
    /// `runs` as pieces, for a server whose commands are `support`.
    #[cfg(test)]
    pub(super) fn new(runs: &[Run], support: PlainSupport) -> Plan {
        let mut plan = Plan::default();
        plan.write(runs, support);
        plan
    }

    /// Writes `runs` as pieces, for a server whose commands are `support`.
    pub(super) fn write(&mut self, runs: &[Run], support: PlainSupport) {
        let pieces = &mut self.pieces;
        pieces.clear();
        for (index, run) in runs.iter().enumerate() {
            match (support.plain(&run.req), pieces.last_mut()) {
                (Some(plain), _) => pieces.push(Piece::Plain(plain, index)),
                (None, Some(Piece::Script(range))) => range.end = index + 1,
                (None, _) => pieces.push(Piece::Script(index..index + 1)),
            }
        }
        let pipeline = &mut self.pipeline;
        pipeline.clear();
        let mut commands = 0;
        for piece in pieces.iter() {
            match *piece {
                Piece::Plain(plain, index) => {
                    let req = &runs[index].req;
                    let (key, token) = (req.keys[0].as_str(), &*req.token);
                    match plain {
                        Plain::Acquire => {
                            pipeline.cmd("SET").arg(key).arg(token).arg("NX");
                            pipeline.arg("PX").arg(req.ttl_ms);
                        }
                        Plain::Extend => {
                            pipeline
                                .cmd("SET")
                                .arg(key)
                                .arg(token)
                                .arg("IFEQ")
                                .arg(token);
                            pipeline.arg("PX").arg(req.ttl_ms);
                        }
                        Plain::Release(CompareAndDelete::Delifeq) => {
                            pipeline.cmd("DELIFEQ").arg(key).arg(token);
                            pipeline.cmd("EXISTS").arg(MarkOf(key));
                            commands += 1;
                        }
                        Plain::Release(CompareAndDelete::Delex) => {
                            pipeline.cmd("DELEX").arg(key).arg("IFEQ").arg(token);
                            pipeline.cmd("EXISTS").arg(MarkOf(key));
                            commands += 1;
                        }
                    }
                    commands += 1;
                }
                Piece::Script(ref range) => {
                    let mut call = Cmd::new();
                    write_script(runs[range.clone()].iter(), Touch::WithHelpers, &mut call);
                    pipeline.add_command(call);
                    commands += 1;
                }
            }
        }
        self.commands = commands;
    }

    /// Reads the pipeline's `values` (one per command, as many as [`commands`](Self::commands))
    /// into each request's reply, in the batch script's terms (the keys acquired, extended or
    /// deleted; an operation's own error).
    pub(super) fn read(&self, runs: &[Run], values: Vec<Value>) -> Outcome {
        let mut outcome = Outcome {
            replies: std::iter::repeat_with(|| None).take(runs.len()).collect(),
            ..Outcome::default()
        };
        let mut values = values.into_iter();
        let mut next = || values.next().unwrap_or(Value::Nil);
        for piece in &self.pieces {
            match *piece {
                Piece::Plain(plain, index) => {
                    let req = &runs[index].req;
                    let key = &req.keys[0];
                    let first = next();
                    if let Value::ServerError(err) = &first {
                        if matches!(plain, Plain::Release(_)) {
                            let _ = next(); // its EXISTS
                        }
                        if refuses_plain(err.code(), err.details()) {
                            outcome.refused = true;
                            outcome.again.push(index);
                            continue;
                        }
                    }
                    let reply = match (plain, first) {
                        // An acquire's error (OOM, READONLY, LOADING, BUSY) is its own; an
                        // extension or release of a key of another type changes nothing (0),
                        // as in the script, and any other error is that request's own.
                        (Plain::Acquire, err @ Value::ServerError(_)) => err,
                        (_, Value::ServerError(err)) if err.code() == "WRONGTYPE" => Value::Int(0),
                        (_, err @ Value::ServerError(_)) => err,
                        // Free: ours now.
                        (Plain::Acquire, Value::Okay) => Value::Int(1),
                        (Plain::Acquire, Value::SimpleString(ok)) if ok == "OK" => Value::Int(1),
                        // Taken: by another owner, by another type, or by us (our first send,
                        // landed before its connection was lost): the script tells them apart.
                        (Plain::Acquire, _) => {
                            outcome.again.push(index);
                            continue;
                        }
                        (Plain::Extend, Value::Okay) => Value::Int(1),
                        (Plain::Extend, Value::SimpleString(ok)) if ok == "OK" => Value::Int(1),
                        (Plain::Extend, _) => Value::Int(0),
                        (Plain::Release(_), deleted) => {
                            outcome.released = true;
                            let deleted = matches!(deleted, Value::Int(1));
                            let marked = matches!(next(), Value::Int(1));
                            if deleted && marked {
                                outcome.announce.push(key.clone());
                            }
                            Value::Int(i64::from(deleted))
                        }
                    };
                    outcome.replies[index] = Some(reply);
                }
                Piece::Script(ref range) => match next() {
                    Value::Array(values) if values.len() == range.len() => {
                        if runs[range.clone()]
                            .iter()
                            .any(|run| run.req.op == Op::Release)
                        {
                            outcome.released = true;
                        }
                        for (index, value) in range.clone().zip(values) {
                            outcome.replies[index] = Some(value);
                        }
                    }
                    Value::ServerError(err) if Class::of_code(err.code()) == Class::NoScript => {
                        outcome.noscript = true;
                        outcome.again.extend(range.clone());
                    }
                    other => {
                        let other = match other {
                            err @ Value::ServerError(_) => err,
                            _ => Value::SimpleString(
                                "E:the batch script returned a reply count other than the \
                                 request count"
                                    .to_owned(),
                            ),
                        };
                        for index in range.clone() {
                            outcome.replies[index] = Some(other.clone());
                        }
                    }
                },
            }
        }
        outcome
    }
}

/// The waiting mark of a lock key (`K:redfence:waiting`), written as one argument without
/// an allocation of its own.
struct MarkOf<'k>(&'k str);

impl ToRedisArgs for MarkOf<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        out.write_arg_fmt(format_args!("{}{WAITING}", self.0));
    }
}

/// Whether a plain command's error says the script must do its work: no permission for it
/// (`NOPERM`), or a server that does not know it (`ERR unknown command` for `DELIFEQ`, `ERR
/// syntax error` for `SET … IFEQ`, after it was replaced by an older one).
fn refuses_plain(code: &str, details: Option<&str>) -> bool {
    code == "NOPERM"
        || (code == "ERR"
            && details
                .is_some_and(|d| d.starts_with("unknown command") || d.starts_with("syntax error")))
}

/// What follows a batch whose [`Outcome`] asks for it, as one pipeline: one script call
/// announcing the releases. `None` when there is nothing to do. (A refused acquire's waiting
/// mark is set by the script it runs again in.)
pub(super) fn follow_up(outcome: &Outcome) -> Option<(Pipeline, usize)> {
    if outcome.announce.is_empty() {
        return None;
    }
    let mut pipeline = redis::pipe();
    let call = pipeline
        .cmd("EVALSHA")
        .arg(BATCH.get_hash())
        .arg(outcome.announce.len());
    for key in &outcome.announce {
        call.arg(key);
    }
    for _ in &outcome.announce {
        call.arg("n").arg("").arg(0).arg(1);
    }
    Some((pipeline, 1))
}

#[cfg(test)]
mod tests;
