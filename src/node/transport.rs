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
                evalsha_once_more(command, &mut **conn, retry).await
            }
            Transport::Shared(conn) => {
                let mut connection = conn.connection().await?;
                evalsha_once_more(command, &mut connection, true).await
            }
        }
    }
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
