//! How a node's queue reaches the server: a socket of its own (a plain `redis://` node) or
//! redis-rs's shared connection, and the batch script's `EVALSHA` over either, with its
//! `NOSCRIPT` reload and its one retry after a lost connection.

use std::sync::Arc;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, ServerErrorKind, Value};
use tokio::sync::mpsc;

use super::batch::BATCH;
use super::connection::LazyConnection;
use super::native;
use super::owned_connection::OwnedConnection;
use super::pipeline::Job;
use super::socket::Packed;
use crate::error::NodeFailure;

/// How a node's queue reaches the server.
pub(crate) enum Transport {
    /// A socket the queue's task owns (a plain `redis://` node): no task in between.
    Owned(Box<OwnedConnection>),
    /// redis-rs's multiplexed, auto-reconnecting connection (TLS and Unix-socket nodes).
    Shared(Arc<LazyConnection>),
}

impl Transport {
    /// The next job; meanwhile, the calls given up on our own socket make progress (their
    /// bytes are written, their replies read), so that a release cut short by a timeout
    /// reaches the node even when nothing follows it.
    pub(super) async fn next_job(&mut self, queue: &mut mpsc::Receiver<Job>) -> Option<Job> {
        if let Transport::Owned(conn) = self
            && conn.unsettled()
        {
            tokio::select! {
                biased;
                job = queue.recv() => return job,
                () = conn.settle() => {}
            }
        }
        queue.recv().await
    }

    /// Runs `command` (an `EVALSHA` of the batch script) and returns the script's replies.
    /// The first call on a connection the server dropped (a restart, a reset) fails and
    /// reconnects: it is repeated once (every operation is idempotent for its token); on our
    /// own socket, a connect that failed is not.
    pub(super) async fn evalsha(&mut self, command: &Cmd) -> Result<Vec<Value>, NodeFailure> {
        match self {
            Transport::Owned(conn) => {
                let retry = conn.is_connected();
                let replies = evalsha_once_more(command, &mut **conn, retry).await;
                if replies.is_err() {
                    conn.script_failed();
                }
                replies
            }
            Transport::Shared(conn) => {
                let mut connection = conn.connection().await?;
                evalsha_once_more(command, &mut connection, true).await
            }
        }
    }
}

impl Transport {
    /// Whether the batch may send single-key acquires as native commands beside its script
    /// call (`node/native.rs`): on our own socket, once it passed the probe.
    pub(super) fn takes_natives(&self) -> bool {
        matches!(self, Transport::Owned(conn) if conn.takes_natives())
    }

    /// Whether the next script call should carry the probe (our own socket, not probed yet).
    pub(super) fn wants_probe(&self) -> bool {
        matches!(self, Transport::Owned(conn) if conn.wants_probe())
    }

    /// A script call may not have run (its deadline passed): natives wait for one to succeed.
    pub(super) fn script_failed(&mut self) {
        if let Transport::Owned(conn) = self {
            conn.script_failed();
        }
    }

    /// The server refused a native command: scripts only, on this connection.
    pub(super) fn refuse_natives(&mut self) {
        if let Transport::Owned(conn) = self {
            conn.refuse_natives();
        }
    }

    /// Sends `command` with the next call, its reply dropped (best effort; our own socket
    /// only).
    pub(super) fn send_and_forget(&mut self, command: &Cmd) {
        if let Transport::Owned(conn) = self {
            conn.send_and_forget(command);
        }
    }

    /// Runs `natives`, then the batch script's `EVALSHA` `script` (if any), then the `probe`
    /// (if any) in one pipeline on our own socket (the last two are appended to `natives`,
    /// whose allocation the caller keeps): each native's raw reply (an error reply as
    /// a value), and the script's replies or its error. On `NOSCRIPT`, the script is loaded
    /// and its call alone repeated (the natives ran). A connection lost after it may have
    /// been written is [`Lost`](PipelineError::Lost), for the batch to run once more.
    pub(super) async fn pipelined(
        &mut self,
        natives: &mut Packed,
        script: Option<&Cmd>,
        probe: Option<&native::Probe>,
    ) -> Result<Pipelined, PipelineError> {
        let Transport::Owned(conn) = self else {
            return Err(PipelineError::Failed(NodeFailure::Reply(
                redis::RedisError::from((
                    ErrorKind::Client,
                    "native commands go on a node's own socket only",
                )),
            )));
        };
        let count = natives.len();
        if let Some(script) = script {
            natives.push_command(script);
        }
        for command in probe.map_or(&[][..], native::Probe::commands) {
            natives.push_command(command);
        }
        let calls = natives.len();
        let was_connected = conn.is_connected();
        let called = conn.call_all(natives, &[]).await;
        // Whatever went wrong, natives wait for a script call to succeed again.
        if !matches!(&called, Ok(replies) if replies.len() == calls) {
            conn.script_failed();
        }
        let mut replies = match called {
            Ok(replies) if replies.len() == calls => replies,
            Ok(_) => return Err(PipelineError::Failed(NodeFailure::Reply(out_of_step()))),
            // Lost: the socket broke and was dropped (not a stall: nothing was written then).
            Err(err)
                if was_connected
                    && !conn.is_connected()
                    && (err.is_io_error() || err.is_connection_dropped()) =>
            {
                tracing::debug!(%err, "connection lost; retrying the batch once");
                return Err(PipelineError::Lost(err.into()));
            }
            Err(err) => return Err(PipelineError::Failed(err.into())),
        };
        let probed = probe.map(|probe| {
            let replies = replies.split_off(replies.len() - probe.commands().len());
            probe.passed(&replies)
        });
        let script_reply = script.and_then(|_| replies.pop());
        let script_replies = match (script, script_reply) {
            (None, _) => Ok(Vec::new()),
            (Some(script), Some(Value::ServerError(err)))
                if err.kind() == Some(ServerErrorKind::NoScript) =>
            {
                let loaded = conn.call(&super::batch::load_batch_script()).await;
                let again = match loaded {
                    Ok(Value::ServerError(err)) => Err(redis::RedisError::from(err)),
                    Ok(_) => conn.call(script).await,
                    Err(err) => Err(err),
                };
                match again {
                    Ok(reply) => script_result(reply),
                    Err(err) => {
                        conn.script_failed();
                        return Err(PipelineError::Failed(err.into()));
                    }
                }
            }
            (Some(_), Some(reply)) => script_result(reply),
            (Some(_), None) => Err(NodeFailure::Reply(out_of_step())),
        };
        match (&script_replies, probed) {
            (Err(_), _) => conn.script_failed(),
            (Ok(_), Some(passed)) => conn.probed(passed),
            (Ok(_), None) => {}
        }
        debug_assert_eq!(replies.len(), count);
        Ok(Pipelined {
            natives: replies,
            script: script_replies,
        })
    }
}

/// What [`Transport::pipelined`] brings back.
pub(super) struct Pipelined {
    /// Each native command's raw reply, in order.
    pub(super) natives: Vec<Value>,
    /// The script's replies, or its error (the natives' replies stand).
    pub(super) script: Result<Vec<Value>, NodeFailure>,
}

/// Why [`Transport::pipelined`] brought nothing back.
pub(super) enum PipelineError {
    /// The connection was lost after the pipeline may have been written: the batch may run
    /// once more (every operation is repeat-safe for its token).
    Lost(NodeFailure),
    /// The node could not be reached, or answered out of step.
    Failed(NodeFailure),
}

/// The script call's reply: its array of per-operation replies, or its error.
fn script_result(reply: Value) -> Result<Vec<Value>, NodeFailure> {
    match reply {
        Value::Array(values) => Ok(values),
        Value::ServerError(err) => Err(redis::RedisError::from(err).into()),
        _ => Err(NodeFailure::Reply(out_of_step())),
    }
}

fn out_of_step() -> redis::RedisError {
    redis::RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "a batch's pipeline was answered out of step",
    ))
}

/// [`evalsha`], repeated once (with `retry`) after the connection was lost.
async fn evalsha_once_more(
    command: &Cmd,
    connection: &mut impl ConnectionLike,
    retry: bool,
) -> Result<Vec<Value>, NodeFailure> {
    match evalsha(command, connection).await {
        Err(err) if retry && (err.is_io_error() || err.is_connection_dropped()) => {
            tracing::debug!(%err, "connection lost; retrying the batch once");
            Ok(evalsha(command, connection).await?)
        }
        other => Ok(other?),
    }
}

/// Runs `command` (an `EVALSHA` of the batch script), loading the script first when the
/// server does not have it (`NOSCRIPT`: first use, a restart, a `SCRIPT FLUSH`).
async fn evalsha(
    command: &Cmd,
    connection: &mut impl ConnectionLike,
) -> redis::RedisResult<Vec<Value>> {
    match command.query_async(connection).await {
        Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            BATCH.load_async(connection).await?;
            command.query_async(connection).await
        }
        other => other,
    }
}
