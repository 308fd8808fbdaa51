//! A Sentinel-managed master as one voter: the current master is resolved through the
//! sentinels, and resolved again after any failure of its connection (a failover demotes it:
//! `READONLY`; it refuses writes: `NOREPLICAS`) or a call it did not answer in time, each
//! request being one script call.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{AsyncConnectionConfig, RedisError};
use tokio::sync::Mutex;

use super::{Advice, Advisory, Node, NodeCall, Request, advice, cached, script_call};
use crate::error::NodeFailure;

/// The master named `master` in a Sentinel group, voting once.
pub(crate) struct SentinelNode {
    addr: String,
    shared: Arc<Shared>,
}

struct Shared {
    /// One client per sentinel, asked all at once: redis-rs's client over several sentinels
    /// takes their answers in the order given, so a hung first sentinel (it accepts
    /// connections and never answers) costs its connect and response timeouts (1 s and
    /// 0.5 s) before the next one counts, and that takes the whole of a short connect bound.
    clients: Arc<[Arc<Mutex<SentinelClient>>]>,
    conn: cached::Cached<MultiplexedConnection>,
    /// How the master connection is made: `connect_timeout` bounds connecting.
    config: AsyncConnectionConfig,
    node_timeout: Duration,
}

impl SentinelNode {
    /// A voter over the master `master` that the sentinels at `sentinels` watch; `addr`
    /// names it in messages; calls wait `node_timeout` for the master. Nothing is connected
    /// yet.
    pub(crate) fn new(
        sentinels: Vec<redis::ConnectionInfo>,
        master: String,
        addr: String,
        node_timeout: Duration,
    ) -> Result<Self, RedisError> {
        let connect_timeout = super::redis::connect_timeout(node_timeout);
        if sentinels.is_empty() {
            return Err(no_sentinel());
        }
        let clients = sentinels
            .into_iter()
            .map(|sentinel| {
                let client = SentinelClient::build(
                    vec![sentinel],
                    master.clone(),
                    None,
                    SentinelServerType::Master,
                )?;
                Ok(Arc::new(Mutex::new(client)))
            })
            .collect::<Result<_, RedisError>>()?;
        Ok(SentinelNode {
            addr,
            shared: Arc::new(Shared {
                clients,
                conn: cached::Cached::new(connect_timeout),
                config: AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    // Every call is bounded by node_timeout; a response timeout would only
                    // race it.
                    .set_response_timeout(None),
                node_timeout,
            }),
        })
    }
}

impl script_call::Connector for Shared {
    type Conn = MultiplexedConnection;

    fn node_timeout(&self) -> Duration {
        self.node_timeout
    }

    /// The cached master connection, or a new one through the sentinels (asking them,
    /// checking the master's `ROLE`, connecting), made in a task of its own.
    async fn connection(&self) -> Result<(u64, MultiplexedConnection), RedisError> {
        let (clients, config) = (Arc::clone(&self.clients), self.config.clone());
        self.conn
            .get_or_make(move || first_master(clients, config))
            .await
    }

    /// Forgets the master after a failure that may mean it is no longer the master (its
    /// connection broke, it was demoted, it refuses writes), so that the next call asks the
    /// sentinels again.
    async fn forget_after(&self, err: &RedisError, generation: u64) {
        if err.is_io_error()
            || err.is_connection_dropped()
            || err.is_unrecoverable_error()
            || matches!(
                err.code(),
                Some("READONLY" | "MASTERDOWN" | "LOADING" | "NOAUTH" | "WRONGPASS" | "NOREPLICAS")
            )
        {
            self.conn.forget(generation).await;
        }
    }

    /// A master that does not answer within `node_timeout` may be hung, or cut off and
    /// replaced by a failover: the next call asks the sentinels again. (The connection has no
    /// response timeout of its own, so without this a hung master would be kept until TCP
    /// gives up, many minutes later.) When the connection is being made right now, that
    /// attempt stands.
    fn given_up(&self, generation: u64) {
        self.conn.try_forget(generation);
    }
}

/// Asks every sentinel at once (one client each) for the master and connects to it: the
/// first sentinel whose master answers as a master wins, and the others are dropped (a hung
/// one included). When all fail, an error about a master a sentinel named (a refused login,
/// a master that is not one) is kept over a sentinel that does not know the name.
async fn first_master(
    clients: Arc<[Arc<Mutex<SentinelClient>>]>,
    config: AsyncConnectionConfig,
) -> Result<MultiplexedConnection, RedisError> {
    let mut asked: FuturesUnordered<_> = clients
        .iter()
        .cloned()
        .map(|client| {
            let config = config.clone();
            async move {
                client
                    .lock()
                    .await
                    .get_async_connection_with_config(&config)
                    .await
            }
        })
        .collect();
    let unnamed = |e: &RedisError| e.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel;
    let mut failure: Option<RedisError> = None;
    while let Some(answer) = asked.next().await {
        match answer {
            Ok(conn) => return Ok(conn),
            Err(err)
                if failure
                    .as_ref()
                    .is_none_or(|kept| unnamed(kept) && !unnamed(&err)) =>
            {
                failure = Some(err);
            }
            Err(_) => {}
        }
    }
    Err(failure.unwrap_or_else(no_sentinel))
}

fn no_sentinel() -> RedisError {
    RedisError::from((
        redis::ErrorKind::EmptySentinelList,
        "a sentinel voter needs at least one sentinel",
    ))
}

impl Node for SentinelNode {
    fn call(&self, req: &Request) -> NodeCall {
        NodeCall::Boxed(script_call::call(&self.shared, req))
    }

    fn advise(&self, advisory: Advisory) -> BoxFuture<'static, Result<Advice, NodeFailure>> {
        match advisory {
            Advisory::Inspect { keys, delete } => advice(
                script_call::inspect_on(&self.shared, keys, delete),
                Advice::Keys,
            ),
            Advisory::WriteIfHeld(write) => advice(
                script_call::write_if_held_on(&self.shared, &write),
                Advice::Written,
            ),
            Advisory::EvictionPolicy => advice(
                script_call::eviction_policy_on(&self.shared),
                Advice::EvictionPolicy,
            ),
            Advisory::RunId => advice(script_call::run_id_on(&self.shared), Advice::RunId),
        }
    }

    fn addr(&self) -> &str {
        &self.addr
    }
}
