//! Plain commands instead of the batch script, on servers that have compare-and-delete
//! (Valkey 9's `DELIFEQ`): a single-key lock outside fair mode is `SET k t NX GET PX ttl` to
//! acquire, `SET k t IFEQ t PX ttl` to extend and `DELIFEQ k t` to release, with no Lua. Keys
//! and values are the script's, so node-redlock and redsync still interoperate. The rest of a
//! batch (several keys, fair mode) goes as script calls in the same pipeline, in order. On
//! servers without compare-and-delete, plain acquires beside scripted releases did not pay
//! (Redis 7.0: 64-way throughput 0.89–0.94×, BENCHMARKS.md): the script does everything there.
//!
//! What the script does beside a contended operation follows it, best effort: a refused
//! acquire marks its key as waited for, and a release that found its key marked announces
//! itself (the script's `n`), so that waiters in other processes still hear of it.

use std::ops::Range;

use redis::{Cmd, Pipeline, RedisWrite, ToRedisArgs, Value};

use super::batch::{BATCH, Run, Touch, write_script};
use super::{Op, Request};
use crate::helper_keys::{MIN_WAIT_MARK_MS, WAITING};

/// What a server link knows of its server's commands, for the connection it uses. `false`
/// (the script for everything) on a server without compare-and-delete, for a user not allowed
/// to ask (`COMMAND INFO`), or once a plain command was refused (no permission; an unknown
/// command after the server was replaced by an older one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Natives {
    /// `DELIFEQ` and `SET … IFEQ` (Valkey 9): plain releases and extensions, and acquires
    /// once `released`.
    pub(super) delifeq: bool,
    /// A release went through on this connection (plain, or the script): acquires go plain
    /// only then, so that no lock is granted by a command this user may run that it could not
    /// release.
    pub(super) released: bool,
}

impl Natives {
    /// From the reply to `COMMAND INFO DELIFEQ` ([`detection`]): one entry, nil for an
    /// unknown command.
    pub(super) fn detected(command_info: &Value) -> Natives {
        let delifeq = matches!(
            command_info,
            Value::Array(entries) if matches!(entries.first(), Some(Value::Array(_)))
        );
        Natives {
            delifeq,
            released: false,
        }
    }

    /// How `req` goes: as a plain command of this kind, or in the script (`None`).
    fn plain(self, req: &Request) -> Option<Plain> {
        if req.queue.is_some() || req.keys.len() != 1 {
            return None;
        }
        match req.op {
            Op::Acquire if self.delifeq && self.released => Some(Plain::Acquire),
            Op::Extend if self.delifeq => Some(Plain::Extend),
            Op::Release if self.delifeq => Some(Plain::Release),
            _ => None,
        }
    }

    /// Whether any of `runs` would go as a plain command.
    pub(super) fn any_plain(self, runs: &[Run]) -> bool {
        runs.iter().any(|run| self.plain(&run.req).is_some())
    }
}

/// What tells a link whether its server has compare-and-delete: `COMMAND INFO DELIFEQ`.
pub(super) fn detection() -> Cmd {
    let mut cmd = redis::cmd("COMMAND");
    cmd.arg("INFO").arg("DELIFEQ");
    cmd
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plain {
    Acquire,
    Extend,
    Release,
}

/// One piece of a batch in its pipeline: a request as a plain command (a release is two:
/// `DELIFEQ` and `EXISTS` of its waiting mark), or consecutive requests in one script call.
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
    /// for (`NOSCRIPT`), or a plain command it refused.
    pub(super) again: Vec<usize>,
    /// Whether a plain command was refused (the link turns to the script for everything).
    pub(super) refused: bool,
    /// Whether a release went through, plain or in a script call (see
    /// [`Natives::released`]).
    pub(super) released: bool,
    /// Waiting marks to set: (key, TTL in milliseconds) of each refused acquire.
    pub(super) marks: Vec<(String, u64)>,
    /// Keys a plain release deleted while they were marked: their release is to be announced.
    pub(super) announce: Vec<String>,
}

impl Plan {
    /// `runs` as pieces, for a server whose commands are `natives`.
    #[cfg(test)]
    pub(super) fn new(runs: &[Run], natives: Natives) -> Plan {
        let mut plan = Plan::default();
        plan.write(runs, natives);
        plan
    }

    /// Writes `runs` as pieces, for a server whose commands are `natives`.
    pub(super) fn write(&mut self, runs: &[Run], natives: Natives) {
        let pieces = &mut self.pieces;
        pieces.clear();
        for (index, run) in runs.iter().enumerate() {
            match (natives.plain(&run.req), pieces.last_mut()) {
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
                            pipeline.cmd("SET").arg(key).arg(token).arg("NX").arg("GET");
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
                        Plain::Release => {
                            pipeline.cmd("DELIFEQ").arg(key).arg(token);
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
                        if plain == Plain::Release {
                            let _ = next(); // its EXISTS
                        }
                        if refuses_plain(err.code(), err.details()) {
                            outcome.refused = true;
                            outcome.again.push(index);
                            continue;
                        }
                    }
                    let reply = match (plain, first) {
                        // A key of another type is the acquire's own error, as in the
                        // script; an extension or release of it changes nothing (0).
                        (Plain::Acquire, err @ Value::ServerError(_)) => err,
                        (_, Value::ServerError(_)) => Value::Int(0),
                        // Free, or ours already: a repeat of this call after a lost
                        // connection, which landed after the attempt started.
                        (Plain::Acquire, Value::Nil) => Value::Int(1),
                        (Plain::Acquire, Value::BulkString(held))
                            if held == req.token.as_bytes() =>
                        {
                            Value::Int(1)
                        }
                        (Plain::Acquire, _) => {
                            outcome.marks.push((key.clone(), req.ttl_ms));
                            Value::Int(0)
                        }
                        (Plain::Extend, Value::Okay) => Value::Int(1),
                        (Plain::Extend, Value::SimpleString(ok)) if ok == "OK" => Value::Int(1),
                        (Plain::Extend, _) => Value::Int(0),
                        (Plain::Release, deleted) => {
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
                    Value::ServerError(err) if err.code() == "NOSCRIPT" => {
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
/// (`NOPERM`), or a server that does not know it (`ERR unknown command`, after it was
/// replaced by an older one).
fn refuses_plain(code: &str, details: Option<&str>) -> bool {
    code == "NOPERM" || (code == "ERR" && details.is_some_and(|d| d.starts_with("unknown command")))
}

/// What follows a batch whose [`Outcome`] asks for it, as one pipeline: the waiting marks,
/// then one script call announcing the releases. `None` when there is nothing to do.
pub(super) fn follow_up(outcome: &Outcome) -> Option<(Pipeline, usize)> {
    if outcome.marks.is_empty() && outcome.announce.is_empty() {
        return None;
    }
    let mut pipeline = redis::pipe();
    let mut commands = 0;
    for (key, ttl_ms) in &outcome.marks {
        pipeline
            .cmd("SET")
            .arg(MarkOf(key))
            .arg("1")
            .arg("PX")
            .arg((*ttl_ms).max(MIN_WAIT_MARK_MS));
        commands += 1;
    }
    if !outcome.announce.is_empty() {
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
        commands += 1;
    }
    Some((pipeline, commands))
}

#[cfg(test)]
mod tests {
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

    const ALL: Natives = Natives {
        delifeq: true,
        released: true,
    };

    fn pieces(runs: &[Run], natives: Natives) -> Vec<Piece> {
        Plan::new(runs, natives).pieces
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
                Piece::Plain(Plain::Release, 3),
                Piece::Plain(Plain::Extend, 4),
                Piece::Script(5..6),
            ]
        );
        // Acquires wait for a release to have gone through.
        let unproven = Natives {
            released: false,
            ..ALL
        };
        assert_eq!(pieces(&runs, unproven)[0], Piece::Script(0..3));
        let none = Natives::default();
        assert!(!none.any_plain(&runs));
        assert_eq!(pieces(&runs, none), vec![Piece::Script(0..6)]);
        // A release is two commands (DELIFEQ, EXISTS of the mark).
        assert_eq!(Plan::new(&runs, ALL).commands, 6);
    }

    #[test]
    fn replies_read_as_the_scripts_and_contention_asks_for_marks_and_announcements() {
        let runs = [
            run(Op::Acquire, &["free"], "t1"),
            run(Op::Acquire, &["ours"], "t2"),
            run(Op::Acquire, &["taken"], "t3"),
            run(Op::Acquire, &["hash"], "t4"),
            run(Op::Extend, &["held"], "t5"),
            run(Op::Extend, &["lost"], "t6"),
            run(Op::Release, &["waited"], "t7"),
            run(Op::Release, &["quiet"], "t8"),
            run(Op::Release, &["gone"], "t9"),
            run(Op::Release, &["wrongtype"], "t10"),
        ];
        let plan = Plan::new(&runs, ALL);
        let values = vec![
            Value::Nil,
            Value::BulkString(b"t2".to_vec()),
            Value::BulkString(b"someone".to_vec()),
            server_error("WRONGTYPE Operation against a key holding the wrong kind of value"),
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
        ];
        assert_eq!(values.len(), plan.commands);
        let outcome = plan.read(&runs, values);
        let replies: Vec<Value> = outcome.replies.iter().flatten().cloned().collect();
        assert_eq!(replies.len(), runs.len());
        let ints: Vec<Option<i64>> = replies
            .iter()
            .map(|v| match v {
                Value::Int(n) => Some(*n),
                _ => None,
            })
            .collect();
        assert_eq!(
            ints,
            vec![
                Some(1), // free: granted
                Some(1), // ours already (a repeat that landed): granted
                Some(0), // taken: refused
                None,    // a key of another type: the acquire's own error
                Some(1),
                Some(0),
                Some(1), // deleted, and marked
                Some(1), // deleted, nobody waited
                Some(0), // not ours (a waiter's mark is not ours to announce)
                Some(0), // another type: nothing deleted
            ]
        );
        assert!(matches!(replies[3], Value::ServerError(_)));
        assert_eq!(outcome.marks, vec![("taken".to_owned(), 5_000)]);
        assert_eq!(outcome.announce, vec!["waited".to_owned()]);
        assert!(outcome.released && !outcome.refused && outcome.again.is_empty());
        let (_, commands) = follow_up(&outcome).expect("a follow-up");
        assert_eq!(commands, 2, "one mark, one announcing script call");
    }

    #[test]
    fn a_refused_plain_command_or_a_missing_script_runs_again_in_the_script() {
        let runs = [
            run(Op::Release, &["r"], "t1"),
            run(Op::Acquire, &["x", "y"], "t2"),
            run(Op::Extend, &["e"], "t3"),
            run(Op::Release, &["s"], "t4"),
        ];
        let plan = Plan::new(&runs, ALL);
        let values = vec![
            server_error("NOPERM User app has no permissions to run the 'delifeq' command"),
            Value::Int(0),
            server_error("NOSCRIPT No matching script."),
            server_error("ERR unknown command 'SET', with args beginning with:"),
            Value::Int(1),
            Value::Int(0),
        ];
        let outcome = plan.read(&runs, values);
        assert!(outcome.refused);
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
    fn the_server_has_delifeq_when_command_info_describes_it() {
        let described = Value::Array(vec![Value::Array(vec![Value::BulkString(
            b"delifeq".to_vec(),
        )])]);
        let valkey_9 = Natives::detected(&described);
        assert!(valkey_9.delifeq && !valkey_9.released);
        let unknown = Value::Array(vec![Value::Nil]);
        assert_eq!(Natives::detected(&unknown), Natives::default());
        let refused = server_error("NOPERM this user has no permissions to run the 'command'");
        assert_eq!(Natives::detected(&refused), Natives::default());
    }
}
