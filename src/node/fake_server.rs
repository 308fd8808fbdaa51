//! A batch's native path against a fake RESP server, for what no real server does: one
//! that passes the probe but refuses the native command, look-alikes that get `SET ... NX
//! GET` wrong, and one whose `EVALSHA` is refused while natives are on. (Real servers: the
//! tests in `tests/native_acquire.rs`.)

use redis::Value;

use super::{Op, Request};
use crate::error::NodeFailure;
use crate::helper_keys::{PROBE, WAITING};

/// How a fake server answers `SET key value NX GET`.
#[derive(Clone, Copy, PartialEq)]
enum NxGet {
    /// As Redis 7: the old value (nothing written), or nil (written).
    Redis7,
    /// Nil when NX blocked the write.
    NilWhenBlocked,
    /// The value it was given.
    Echo,
    /// Writes despite NX, and returns the old value.
    IgnoresNx,
    /// `-ERR syntax error` for a lock's key, as Redis 7 for the probe's key.
    RefusesLockKeys,
}

/// A fake server that speaks just enough RESP for a batch: `EVALSHA` (every operation
/// answered 1), `SET ... NX GET` as `mode` says, `GET`, `DEL`, `+OK` for the rest. Returns its
/// port and the log of what it ran ("SET key", "EVALSHA key key...") for lock keys.
async fn fake_node(mode: NxGet) -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let (port, log, _) = fake_node_with_switch(mode).await;
    (port, log)
}

/// [`fake_node`], with a switch that makes it refuse `EVALSHA` (`NOPERM`) while on.
async fn fake_node_with_switch(
    mode: NxGet,
) -> (
    u16,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let refuse_scripts = Arc::new(AtomicBool::new(false));
    let server_refuses = Arc::clone(&refuse_scripts);

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let server_log = Arc::clone(&log);
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("accept");
        let (mut input, mut keys) = (Vec::new(), HashMap::<String, String>::new());
        let mut buf = vec![0u8; 64 * 1024];
        let bulk = |value: Option<&String>| match value {
            Some(v) => format!("${}\r\n{v}\r\n", v.len()),
            None => "$-1\r\n".to_owned(),
        };
        loop {
            while let Ok(Some((Value::Array(args), used))) = super::resp::parse(&input) {
                input.drain(..used);
                let args: Vec<String> = args
                    .into_iter()
                    .map(|arg| match arg {
                        Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into(),
                        other => format!("{other:?}"),
                    })
                    .collect();
                let reply = {
                    let mut log = server_log.lock().expect("log");
                    match args[0].as_str() {
                        "EVALSHA" if server_refuses.load(Ordering::SeqCst) => {
                            "-NOPERM this user has no permissions to run the 'evalsha' command\r\n"
                                .to_owned()
                        }
                        "EVALSHA" => {
                            let numkeys: usize = args[2].parse().expect("numkeys");
                            let ops = (args.len() - 3 - numkeys) / 4;
                            log.push(format!("EVALSHA {}", args[3..3 + numkeys].join(" ")));
                            format!("*{ops}\r\n{}", ":1\r\n".repeat(ops))
                        }
                        "GET" => bulk(keys.get(&args[1])),
                        "DEL" => {
                            format!(":{}\r\n", usize::from(keys.remove(&args[1]).is_some()))
                        }
                        "SET" => {
                            let (key, value) = (args[1].clone(), args[2].clone());
                            let mark = key.ends_with(WAITING) || key.ends_with(PROBE);
                            if !mark {
                                log.push(format!("SET {key}"));
                            }
                            let old = keys.get(&key).cloned();
                            match mode {
                                NxGet::RefusesLockKeys if !mark => {
                                    "-ERR syntax error\r\n".to_owned()
                                }
                                NxGet::Redis7 | NxGet::RefusesLockKeys => {
                                    if old.is_none() {
                                        keys.insert(key, value);
                                    }
                                    bulk(old.as_ref())
                                }
                                NxGet::NilWhenBlocked => {
                                    if old.is_none() {
                                        keys.insert(key, value);
                                    }
                                    bulk(None)
                                }
                                NxGet::Echo => {
                                    if old.is_none() {
                                        keys.insert(key, value.clone());
                                    }
                                    bulk(Some(&value))
                                }
                                NxGet::IgnoresNx => {
                                    keys.insert(key, value);
                                    bulk(old.as_ref())
                                }
                            }
                        }
                        _ => "+OK\r\n".to_owned(),
                    }
                };
                stream.write_all(reply.as_bytes()).await.expect("write");
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => input.extend_from_slice(&buf[..n]),
            }
        }
    });
    (port, log, refuse_scripts)
}

/// A transport with its own socket to `127.0.0.1:port`.
fn transport_to(port: u16) -> super::transport::Transport {
    let info = redis::IntoConnectionInfo::into_connection_info(format!("redis://127.0.0.1:{port}"))
        .expect("url");
    let connection = super::owned_connection::OwnedConnection::for_plain_tcp(
        &info,
        None,
        std::time::Duration::from_secs(5),
        tokio_util::task::TaskTracker::new(),
    )
    .expect("a plain TCP node");
    super::transport::Transport::Owned(Box::new(connection))
}

/// Runs `ops` (each on its own key, token "token") as one batch; every reply.
async fn run(
    transport: &mut super::transport::Transport,
    ops: &[(Op, &str)],
) -> Vec<Result<i64, NodeFailure>> {
    let timeout = std::time::Duration::from_secs(5);
    let mut batch = super::batch::Batch::default();
    let mut answers = Vec::new();
    for (op, key) in ops {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let req = Request {
            op: *op,
            keys: vec![(*key).to_owned()].into(),
            token: "token".into(),
            ttl_ms: 1_000,
            queue: None,
        };
        batch.push(super::pipeline::Job::Run {
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
        replies.push(answer.await.expect("answered once"));
    }
    replies
}

fn granted(replies: Vec<Result<i64, NodeFailure>>) -> Vec<i64> {
    replies
        .into_iter()
        .map(|reply| reply.expect("granted"))
        .collect()
}

/// A server that passes the probe but refuses the native commands themselves (`-ERR`):
/// the acquires run again as script operations, after the rest of the batch, each is
/// answered once, and the connection sends scripts only from then on.
#[tokio::test]
async fn natives_refused_by_the_server_run_again_as_script_operations() {
    let (port, log) = fake_node(NxGet::RefusesLockKeys).await;
    let mut transport = transport_to(port);
    // The first batch carries the probe, which passes.
    assert_eq!(
        granted(run(&mut transport, &[(Op::Acquire, "a")]).await),
        [1]
    );
    assert!(transport.takes_natives());
    let batch = [(Op::Acquire, "b"), (Op::Acquire, "c"), (Op::Release, "d")];
    assert_eq!(granted(run(&mut transport, &batch).await), [1, 1, 1]);
    assert!(!transport.takes_natives(), "scripts only from now on");
    assert_eq!(
        granted(run(&mut transport, &[(Op::Acquire, "e")]).await),
        [1]
    );
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

/// Look-alike servers that get `SET ... NX GET` wrong fail the probe: no native acquire
/// is ever sent to them (one of them would grant a lock another holds).
#[tokio::test]
async fn a_server_that_gets_nx_with_get_wrong_never_gets_a_native() {
    for mode in [NxGet::NilWhenBlocked, NxGet::Echo, NxGet::IgnoresNx] {
        let (port, log) = fake_node(mode).await;
        let mut transport = transport_to(port);
        for key in ["a", "b", "c"] {
            assert_eq!(
                granted(run(&mut transport, &[(Op::Acquire, key)]).await),
                [1]
            );
            assert!(!transport.takes_natives());
        }
        assert_eq!(
            *log.lock().expect("log"),
            ["EVALSHA a", "EVALSHA b", "EVALSHA c"]
        );
    }
    // And Redis 7's answers pass it: the second acquire goes natively.
    let (port, log) = fake_node(NxGet::Redis7).await;
    let mut transport = transport_to(port);
    for key in ["a", "b"] {
        assert_eq!(
            granted(run(&mut transport, &[(Op::Acquire, key)]).await),
            [1]
        );
    }
    assert_eq!(*log.lock().expect("log"), ["EVALSHA a", "SET b"]);
}

/// A script call that fails in a write that carried natives (`EVALSHA` revoked): the
/// natives' answers stand, the script's operations get its error, and the connection sends
/// no native again until a probe passes.
#[tokio::test]
async fn a_failed_script_call_sends_the_connection_back_to_the_probe() {
    use std::sync::atomic::Ordering;

    let (port, log, refuse_scripts) = fake_node_with_switch(NxGet::Redis7).await;
    let mut transport = transport_to(port);
    assert_eq!(
        granted(run(&mut transport, &[(Op::Acquire, "a")]).await),
        [1]
    );
    assert!(transport.takes_natives());
    refuse_scripts.store(true, Ordering::SeqCst);
    let replies = run(&mut transport, &[(Op::Acquire, "b"), (Op::Release, "c")]).await;
    assert!(matches!(replies[0], Ok(1)), "{replies:?}");
    assert!(
        matches!(replies[1], Err(NodeFailure::Permission(_))),
        "{replies:?}"
    );
    assert!(!transport.takes_natives(), "back to the probe");
    // The next acquire goes as a script (with the probe), refused while scripts are.
    let replies = run(&mut transport, &[(Op::Acquire, "d")]).await;
    assert!(
        matches!(replies[0], Err(NodeFailure::Permission(_))),
        "{replies:?}"
    );
    assert!(!transport.takes_natives());
    // Allowed again, the probe passes again.
    refuse_scripts.store(false, Ordering::SeqCst);
    assert_eq!(
        granted(run(&mut transport, &[(Op::Acquire, "e")]).await),
        [1]
    );
    assert_eq!(
        granted(run(&mut transport, &[(Op::Acquire, "f")]).await),
        [1]
    );
    assert_eq!(
        *log.lock().expect("log"),
        ["EVALSHA a", "SET b", "EVALSHA e", "SET f"]
    );
}
