//! How a node's queue reaches the server: a socket of its own (a plain `redis://` node) or
//! redis-rs's shared connection, and the batch script's `EVALSHA` over either, with its
//! `NOSCRIPT` reload and its one retry after a lost connection.

use std::sync::Arc;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, ServerErrorKind, Value};
use tokio::sync::mpsc;

use super::batch::BATCH;
use super::connection::LazyConnection;
use super::owned_connection::OwnedConnection;
use super::pipeline::Job;
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
                let replies = evalsha_once_more(command, &mut **conn, retry).await?;
                conn.script_ran();
                Ok(replies)
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
    /// call: on our own socket, while its server has not refused one.
    pub(super) fn takes_natives(&self) -> bool {
        matches!(self, Transport::Owned(conn) if conn.takes_natives())
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

    /// Runs `natives` and then, if any, the batch script's `EVALSHA` `script` in one pipeline
    /// on our own socket ([`takes_natives`](Self::takes_natives)): each native's raw reply
    /// (an error reply as a value), and the script's replies. Repeated once after a lost
    /// connection, as [`evalsha`](Self::evalsha) (a native acquire is repeat-safe too: it
    /// finds its own token); on `NOSCRIPT`, the script is loaded and its call alone repeated
    /// (the natives ran).
    pub(super) async fn pipelined(
        &mut self,
        natives: Vec<Cmd>,
        script: Option<&Cmd>,
    ) -> Result<(Vec<Value>, Vec<Value>), NodeFailure> {
        let Transport::Owned(conn) = self else {
            return Err(NodeFailure::Reply(redis::RedisError::from((
                ErrorKind::Client,
                "native commands go on a node's own socket only",
            ))));
        };
        let mut commands = natives;
        commands.extend(script.cloned());
        let retry = conn.is_connected();
        let mut replies = match conn.call_all(&commands).await {
            Err(err) if retry && (err.is_io_error() || err.is_connection_dropped()) => {
                tracing::debug!(%err, "connection lost; retrying the batch once");
                conn.call_all(&commands).await?
            }
            other => other?,
        };
        let Some(script) = script else {
            return Ok((replies, Vec::new()));
        };
        let last = match replies.pop() {
            Some(Value::ServerError(err)) if err.kind() == Some(ServerErrorKind::NoScript) => {
                let loaded = conn.call(&super::batch::load_batch_script()).await?;
                if let Value::ServerError(err) = loaded {
                    return Err(redis::RedisError::from(err).into());
                }
                conn.call(script).await?
            }
            Some(last) => last,
            None => return Err(NodeFailure::Reply(out_of_step())),
        };
        let script_replies = match last {
            Value::Array(values) => values,
            Value::ServerError(err) => return Err(redis::RedisError::from(err).into()),
            _ => return Err(NodeFailure::Reply(out_of_step())),
        };
        Ok((replies, script_replies))
    }
}

fn out_of_step() -> redis::RedisError {
    redis::RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "the batch script's call did not return an array",
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
