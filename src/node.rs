//! One Redis master: a lazy, shared, auto-reconnecting connection and the three lock scripts.

use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Script};
use tokio::sync::OnceCell;

use crate::error::NodeFailure;

static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/acquire.lua")));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/extend.lua")));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release.lua")));

/// Which script a request runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Set every key to the token if none of them exists (all-or-nothing).
    Acquire,
    /// Re-arm the expiry of every key if all still hold the token.
    Extend,
    /// Delete every key that still holds the token.
    Release,
}

/// One request, sent unchanged to every node.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    pub(crate) op: Op,
    pub(crate) keys: Arc<[String]>,
    pub(crate) token: Arc<str>,
    /// The TTL in milliseconds (unused by `Release`).
    pub(crate) ttl_ms: u64,
}

/// A lock server as the quorum logic sees it. Real nodes are [`RedisNode`]s; unit tests use
/// fakes that grant, deny, fail, are slow, or never answer.
pub(crate) trait Node: Send + Sync {
    /// Runs the request's script. The reply is the script's integer: for `Acquire` and
    /// `Extend` a positive number means granted and 0 means refused; for `Release` the number
    /// of keys deleted. The future owns what it needs, so it can outlive the call.
    fn call(
        &self,
        req: &Request,
    ) -> impl Future<Output = Result<i64, NodeFailure>> + Send + 'static;

    /// The node's address, for error messages.
    fn addr(&self) -> &str;
}

/// A Redis master reached through one multiplexed, auto-reconnecting connection that every
/// lock shares. The connection is made on first use, inside the caller's runtime.
#[derive(Clone)]
pub(crate) struct RedisNode {
    index: usize,
    addr: String,
    identity: String,
    shared: Arc<LazyConnection>,
}

/// One multiplexed, auto-reconnecting connection to a Redis server, made on first use
/// (inside the caller's runtime) and shared by every call.
pub(crate) struct LazyConnection {
    client: Client,
    conn: OnceCell<ConnectionManager>,
    connect_timeout: Duration,
}

impl RedisNode {
    pub(crate) fn new(index: usize, client: Client, node_timeout: Duration) -> Self {
        let info = client.get_connection_info();
        let identity = info.addr().to_string();
        let addr = format!("{}/{}", identity, info.redis_settings().db());
        RedisNode {
            index,
            addr,
            identity,
            // Connecting is not on any lock's critical path (calls are bounded by
            // node_timeout); give it room so a slow handshake still completes.
            shared: Arc::new(LazyConnection::new(
                client,
                node_timeout.max(Duration::from_secs(1)),
            )),
        }
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// Host and port: two nodes with the same identity are the same server.
    pub(crate) fn identity(&self) -> &str {
        &self.identity
    }
}

impl LazyConnection {
    /// A connection to the server `client` points at, made on first use; connecting may take
    /// up to `connect_timeout`. Callers bound each call themselves.
    pub(crate) fn new(client: Client, connect_timeout: Duration) -> Self {
        LazyConnection {
            client,
            conn: OnceCell::new(),
            connect_timeout,
        }
    }

    /// The server's address, for messages.
    pub(crate) fn addr(&self) -> String {
        self.client.get_connection_info().addr().to_string()
    }

    /// The shared connection (a cheap clone).
    pub(crate) async fn connection(&self) -> Result<ConnectionManager, redis::RedisError> {
        let conn = self
            .conn
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    // Every call is bounded by node_timeout in the quorum logic; a response
                    // timeout here would only race with it.
                    .set_response_timeout(None)
                    // Reconnect quickly after a node restarts.
                    .set_max_delay(Duration::from_secs(1));
                let manager = ConnectionManager::new_lazy_with_config(self.client.clone(), config)?;
                // The first connection only progresses while a call polls it, and every call
                // gives up after node_timeout: a handshake slower than that would never
                // finish. Drive it in the background instead (reconnects already are).
                let mut driver = manager.clone();
                tokio::spawn(async move {
                    let _ = redis::cmd("PING").query_async::<()>(&mut driver).await;
                });
                Ok::<_, redis::RedisError>(manager)
            })
            .await?;
        Ok(conn.clone())
    }
}

impl Node for RedisNode {
    fn call(
        &self,
        req: &Request,
    ) -> impl Future<Output = Result<i64, NodeFailure>> + Send + 'static {
        let shared = Arc::clone(&self.shared);
        let req = req.clone();
        async move {
            let mut conn = shared.connection().await?;
            let script: &Script = match req.op {
                Op::Acquire => &ACQUIRE,
                Op::Extend => &EXTEND,
                Op::Release => &RELEASE,
            };
            let mut invocation = script.prepare_invoke();
            invocation.key(&*req.keys).arg(&*req.token);
            if req.op != Op::Release {
                invocation.arg(req.ttl_ms);
            }
            // EVALSHA; on NOSCRIPT (a restarted or flushed node) the script is loaded and
            // the call repeated.
            match invocation.invoke_async(&mut conn).await {
                Ok(reply) => Ok(reply),
                // The first call on a connection the server dropped (a restart, a reset) fails
                // and makes the manager reconnect: repeat it once on the new connection. All
                // three scripts are idempotent for one token; node_timeout still bounds this.
                Err(err) if err.is_io_error() || err.is_connection_dropped() => {
                    tracing::debug!(node = %shared.addr(), %err, "connection lost; retrying once");
                    Ok(invocation.invoke_async(&mut conn).await?)
                }
                Err(err) => Err(err.into()),
            }
        }
    }

    fn addr(&self) -> &str {
        &self.addr
    }
}
