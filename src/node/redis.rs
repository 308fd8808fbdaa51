//! One Redis master: the lock scripts over a lazy, shared `LazyConnection`.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures::future::BoxFuture;
use redis::{Client, Script};
use tokio_util::task::TaskTracker;

use super::connection::LazyConnection;
use super::{KeyRow, Node, Op, Request};
use crate::error::NodeFailure;

static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/acquire.lua")));
static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/extend.lua")));
static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/inspect.lua")));
static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/force_release.lua")));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/release.lua")));

/// A Redis master reached through one multiplexed, auto-reconnecting connection that every
/// lock shares. The connection is made on first use, inside the caller's runtime.
#[derive(Clone)]
pub(crate) struct RedisNode {
    addr: String,
    shared: Arc<LazyConnection>,
}

impl RedisNode {
    pub(crate) fn new(client: Client, node_timeout: Duration, tasks: TaskTracker) -> Self {
        let info = client.get_connection_info();
        let addr = format!("{}/{}", info.addr(), info.redis_settings().db());
        RedisNode {
            addr,
            // Connecting is not on any lock's critical path (calls are bounded by
            // node_timeout); give it room so a slow handshake still completes.
            shared: Arc::new(
                LazyConnection::new(client, node_timeout.max(Duration::from_secs(1)))
                    .tracked_by(tasks),
            ),
        }
    }
}

impl Node for RedisNode {
    fn call(&self, req: &Request) -> BoxFuture<'static, Result<i64, NodeFailure>> {
        let shared = Arc::clone(&self.shared);
        let req = req.clone();
        Box::pin(async move {
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
        })
    }

    fn inspect(
        &self,
        keys: Arc<[String]>,
        delete: bool,
    ) -> BoxFuture<'static, Result<Vec<KeyRow>, NodeFailure>> {
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let mut conn = shared.connection().await?;
            let script: &Script = if delete { &FORCE_RELEASE } else { &INSPECT };
            let mut invocation = script.prepare_invoke();
            invocation.key(&*keys);
            Ok(invocation.invoke_async(&mut conn).await?)
        })
    }

    fn eviction_policy(&self) -> BoxFuture<'static, Result<String, NodeFailure>> {
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let mut conn = shared.connection().await?;
            let reply: Vec<String> = redis::cmd("CONFIG")
                .arg("GET")
                .arg("maxmemory-policy")
                .query_async(&mut conn)
                .await?;
            reply.into_iter().nth(1).ok_or_else(|| {
                NodeFailure::Reply(redis::RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "CONFIG GET maxmemory-policy returned no value",
                )))
            })
        })
    }

    fn addr(&self) -> &str {
        &self.addr
    }
}
