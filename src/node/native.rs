//! Plain acquires as native commands: on a node's own socket, a batch sends each plain
//! single-key acquire (not fair mode) as one `SET key token NX GET PX ttl` in the same write as
//! its script call, instead of as an operation inside the script; the server does about a
//! quarter of the work. Keys and values are those of the script (node-redlock and redsync
//! still interoperate), and so is every lock's answer:
//!
//! - nil: the key was free and is ours; our own token: the repeat of our request that landed
//!   (granted, as the script grants it; every attempt has a token of its own, so the key was
//!   set after the attempt started and outlives the validity computed from that start);
//! - another token: refused, and the key is marked as waited for, as the script marks it (with
//!   a `SET` sent with the node's next write, so a release in between does not publish: the
//!   waiter then polls, one retry delay at most);
//! - `WRONGTYPE` (and any error but the two below): that lock's own error.
//!
//! Only an acquire whose key no other operation of the batch touches goes natively: the
//! natives are written before the script call, and every key keeps the order of its
//! operations. A connection sends natives only once it has passed the **probe**: a script call
//! that succeeded (a user who may not run the scripts must not get locks it cannot release),
//! with two `SET k v NX GET PX 100` on a waiting mark written after it, answered nil then `v`
//! as Redis 7 and Valkey answer them. A server that answers otherwise (older than Redis 7, a
//! look-alike that gets `NX` with `GET` wrong, an ACL that does not cover the marks) gets
//! scripts only on that connection, and so does one that refuses a native (`ERR`, `NOPERM`):
//! those acquires run again as script operations after the rest of the batch.

use std::collections::HashSet;

use redis::{Cmd, Value};

use super::pipeline::Reply;
use super::{Op, Request};
use crate::error::NodeFailure;

/// The key suffix and the shortest time (ms) of a waiting mark, as in `scripts/batch.lua`.
const WAITING: &str = ":redfence:waiting";
const MIN_WAIT_MARK_MS: u64 = 10_000;
/// The value the probe sets, for 100 ms, on a waiting mark that does not exist.
const PROBE_VALUE: &str = "redfence:probe";

/// Which of `runs` go as native commands: plain single-key acquires whose key no operation
/// that goes in the script touches (so that every key's operations keep their order).
pub(super) fn natives(runs: &[(Request, Option<Reply>)]) -> Vec<bool> {
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
/// key when it is free (reply nil) and otherwise returns who holds it.
pub(super) fn native_acquire(req: &Request) -> Cmd {
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
pub(super) fn wait_mark(key: &str, ttl_ms: u64) -> Cmd {
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
pub(super) enum NativeOutcome {
    Granted,
    Refused,
    /// The error of this lock alone (e.g. `WRONGTYPE`: the key holds another type).
    Failed(NodeFailure),
    /// The server does not take the command (too old, or not allowed): run it as a script.
    Unsupported,
}

pub(super) fn native_outcome(reply: Option<Value>, token: &str) -> NativeOutcome {
    match reply {
        Some(Value::Nil) => NativeOutcome::Granted,
        Some(Value::BulkString(holder)) if holder == token.as_bytes() => NativeOutcome::Granted,
        Some(Value::BulkString(_)) => NativeOutcome::Refused,
        Some(Value::ServerError(err)) if matches!(err.code(), "ERR" | "NOPERM") => {
            NativeOutcome::Unsupported
        }
        // Classified as the script call's own error would be (e.g. `READONLY`, `OOM`).
        Some(Value::ServerError(err)) => NativeOutcome::Failed(redis::RedisError::from(err).into()),
        Some(other) => NativeOutcome::Failed(NodeFailure::Reply(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "a native acquire's reply",
            format!("{other:?}"),
        )))),
        None => NativeOutcome::Failed(NodeFailure::Reply(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "no reply to a native acquire",
        )))),
    }
}

/// The probe's two commands, on `key`'s waiting mark.
pub(super) fn probe(key: &str) -> [Cmd; 2] {
    let set = || {
        let mut command = redis::cmd("SET");
        command
            .arg(format!("{key}{WAITING}"))
            .arg(PROBE_VALUE)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(100);
        command
    };
    [set(), set()]
}

/// What the probe's replies say about the server.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Probed {
    /// Nil, then the value: `SET ... NX GET` works as in Redis 7.
    Works,
    /// The mark was there already (someone waits): ask again with a later batch.
    Unknown,
    /// Anything else: scripts only.
    Broken,
}

pub(super) fn probed(replies: &[Value]) -> Probed {
    match replies {
        [Value::Nil, Value::BulkString(value)] if value == PROBE_VALUE.as_bytes() => Probed::Works,
        [Value::BulkString(first), Value::BulkString(second)] if first == second => Probed::Unknown,
        _ => Probed::Broken,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn the_probe_passes_only_on_nil_then_its_value() {
        let value = || Value::BulkString(PROBE_VALUE.as_bytes().to_vec());
        assert_eq!(probed(&[Value::Nil, value()]), Probed::Works);
        // Someone waits (or another probe ran): no answer yet.
        let mark = || Value::BulkString(b"1".to_vec());
        assert_eq!(probed(&[mark(), mark()]), Probed::Unknown);
        assert_eq!(probed(&[value(), value()]), Probed::Unknown);
        // A look-alike that answers nil when NX blocked the write, one that ignores GET,
        // Redis 6's syntax error, an ACL without the marks.
        let error = |line: &str| match super::super::resp::parse(format!("-{line}\r\n").as_bytes())
        {
            Ok(Some((value, _))) => value,
            other => panic!("not an error reply: {other:?}"),
        };
        let ok = || Value::Okay;
        for replies in [
            [Value::Nil, Value::Nil],
            [ok(), ok()],
            [error("ERR syntax error"), error("ERR syntax error")],
            [
                error("NOPERM no permissions"),
                error("NOPERM no permissions"),
            ],
            [Value::Nil, mark()],
        ] {
            assert_eq!(probed(&replies), Probed::Broken, "{replies:?}");
        }
    }

    /// A server that passes the probe but refuses the native commands themselves (`-ERR`):
    /// the acquires run again as script operations, after the rest of the batch, each is
    /// answered once, and the connection sends scripts only from then on. (Real servers all
    /// take the native command; this fake speaks just enough RESP for the batch.)
    #[tokio::test]
    async fn natives_refused_by_the_server_run_again_as_script_operations() {
        use std::sync::{Arc, Mutex};
        use std::time::Duration;

        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        use tokio::net::TcpListener;
        use tokio::sync::oneshot;
        use tokio_util::task::TaskTracker;

        use super::super::batch::Batch;
        use super::super::owned_connection::OwnedConnection;
        use super::super::pipeline::Job;
        use super::super::transport::Transport;

        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // What the server ran, in order: "SET key" or "EVALSHA key key...".
        let log = Arc::new(Mutex::new(Vec::<String>::new()));
        let server_log = Arc::clone(&log);
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let (mut input, mut marks) = (Vec::new(), std::collections::HashMap::new());
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                while let Ok(Some((Value::Array(args), used))) = super::super::resp::parse(&input) {
                    input.drain(..used);
                    let args: Vec<String> = args
                        .into_iter()
                        .map(|arg| match arg {
                            Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into(),
                            other => format!("{other:?}"),
                        })
                        .collect();
                    let reply = match args[0].as_str() {
                        "EVALSHA" => {
                            let keys: usize = args[2].parse().expect("numkeys");
                            let ops = (args.len() - 3 - keys) / 4;
                            server_log
                                .lock()
                                .expect("log")
                                .push(format!("EVALSHA {}", args[3..3 + keys].join(" ")));
                            format!("*{ops}\r\n{}", ":1\r\n".repeat(ops))
                        }
                        "SET" if args[2] == PROBE_VALUE => {
                            match marks.insert(args[1].clone(), args[2].clone()) {
                                None => "$-1\r\n".to_owned(),
                                Some(v) => format!("${}\r\n{v}\r\n", v.len()),
                            }
                        }
                        "SET" => {
                            server_log
                                .lock()
                                .expect("log")
                                .push(format!("SET {}", args[1]));
                            "-ERR syntax error\r\n".to_owned()
                        }
                        _ => "+OK\r\n".to_owned(),
                    };
                    stream.write_all(reply.as_bytes()).await.expect("write");
                }
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => input.extend_from_slice(&buf[..n]),
                }
            }
        });

        let info =
            redis::IntoConnectionInfo::into_connection_info(format!("redis://127.0.0.1:{port}"))
                .expect("url");
        let connection =
            OwnedConnection::for_plain_tcp(&info, None, Duration::from_secs(5), TaskTracker::new())
                .expect("a plain TCP node");
        let mut transport = Transport::Owned(Box::new(connection));
        let timeout = Duration::from_secs(5);
        let run = async |transport: &mut Transport, ops: &[(Op, &str)]| {
            let mut batch = Batch::default();
            let mut answers = Vec::new();
            for (op, key) in ops {
                let (reply, answer) = oneshot::channel();
                let req = Request {
                    op: *op,
                    keys: vec![(*key).to_owned()].into(),
                    token: "token".into(),
                    ttl_ms: 1_000,
                    queue: None,
                };
                batch.push(Job::Run {
                    req,
                    reply: Some(reply),
                });
                answers.push(answer);
            }
            let deadline = tokio::time::sleep(timeout);
            tokio::pin!(deadline);
            batch
                .run(transport, timeout, deadline.as_mut())
                .await
                .expect("the batch ran");
            let mut replies = Vec::new();
            for answer in answers {
                replies.push(answer.await.expect("answered").expect("granted"));
            }
            replies
        };

        // The first batch carries the probe, which passes.
        assert_eq!(run(&mut transport, &[(Op::Acquire, "a")]).await, [1]);
        assert!(transport.takes_natives());
        let batch = [(Op::Acquire, "b"), (Op::Acquire, "c"), (Op::Release, "d")];
        assert_eq!(run(&mut transport, &batch).await, [1, 1, 1]);
        assert!(!transport.takes_natives(), "scripts only from now on");
        assert_eq!(run(&mut transport, &[(Op::Acquire, "e")]).await, [1]);
        assert_eq!(
            *log.lock().expect("log"),
            [
                "EVALSHA a",
                "SET b",
                "SET c",
                "EVALSHA d",
                "EVALSHA b c",
                "EVALSHA e"
            ]
        );
    }
}
