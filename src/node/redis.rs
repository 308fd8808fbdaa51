//! One Redis master: a lazy, shared, auto-reconnecting connection and the three lock scripts.

use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Script};
use tokio::sync::OnceCell;
use tokio_util::task::TaskTracker;

use super::pipeline::Pipeline;
use super::{GuardedWrite, KeyRow, Node, Request};
use crate::error::NodeFailure;

static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/inspect.lua")));
static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/force_release.lua")));
static WRITE_IF_HELD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/write_if_held.lua")));

/// A Redis master reached through one multiplexed, auto-reconnecting connection that every
/// lock shares. The connection is made on first use, inside the caller's runtime.
#[derive(Clone)]
pub(crate) struct RedisNode {
    addr: String,
    shared: Arc<LazyConnection>,
    node_timeout: Duration,
    /// The node's request queue, started inside the runtime of the first call.
    pipeline: Arc<OnceLock<Arc<Pipeline>>>,
}

/// One multiplexed, auto-reconnecting connection to a Redis server, made on first use
/// (inside the caller's runtime) and shared by every call.
pub(crate) struct LazyConnection {
    client: Client,
    conn: OnceCell<ConnectionManager>,
    connect_timeout: Duration,
    /// Where the background connect runs, so that `Redlock::close` can wait for it.
    tasks: TaskTracker,
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
            node_timeout,
            pipeline: Arc::default(),
        }
    }

    /// The node's request queue, started on first use (inside a Tokio runtime).
    fn pipeline(&self) -> Result<&Arc<Pipeline>, NodeFailure> {
        if let Some(pipeline) = self.pipeline.get() {
            return Ok(pipeline);
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(NodeFailure::Reply(redis::RedisError::from((
                redis::ErrorKind::Client,
                "redfence needs a Tokio runtime to talk to a node",
            ))));
        }
        Ok(self
            .pipeline
            .get_or_init(|| Arc::new(Pipeline::start(Arc::clone(&self.shared), self.node_timeout))))
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
            tasks: TaskTracker::new(),
        }
    }

    /// The same, with its background connect tracked by `tasks`.
    pub(crate) fn tracked_by(self, tasks: TaskTracker) -> Self {
        LazyConnection { tasks, ..self }
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
                let limit = self.connect_timeout;
                self.tasks.spawn(async move {
                    let ping =
                        async move { redis::cmd("PING").query_async::<()>(&mut driver).await };
                    let _ = tokio::time::timeout(limit, ping).await;
                });
                Ok::<_, redis::RedisError>(manager)
            })
            .await?;
        Ok(conn.clone())
    }
}

impl Node for RedisNode {
    fn call(&self, req: &Request) -> BoxFuture<'static, Result<i64, NodeFailure>> {
        let queued = self
            .pipeline()
            .and_then(|pipeline| pipeline.submit(req.clone()));
        Box::pin(async move {
            match queued?.await {
                Ok(reply) => reply,
                // The serving task is gone: its runtime shut down.
                Err(_) => Err(NodeFailure::Reply(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "the node's request queue stopped (its runtime shut down)",
                )))),
            }
        })
    }

    fn pipelined(&self) -> bool {
        true
    }

    fn flush(&self) -> BoxFuture<'static, ()> {
        let pipeline = self.pipeline.get().cloned();
        Box::pin(async move {
            if let Some(pipeline) = pipeline {
                pipeline.flush().await;
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

    fn write_if_held(&self, write: &GuardedWrite) -> BoxFuture<'static, Result<bool, NodeFailure>> {
        let shared = Arc::clone(&self.shared);
        let write = write.clone();
        Box::pin(async move {
            let mut conn = shared.connection().await?;
            let mut invocation = WRITE_IF_HELD.prepare_invoke();
            invocation
                .key(&*write.lock_key)
                .key(&*write.key)
                .arg(&*write.token)
                .arg(write.value.as_deref().unwrap_or(""))
                .arg(write.ttl_ms);
            let written: i64 = invocation.invoke_async(&mut conn).await?;
            Ok(written == 1)
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
