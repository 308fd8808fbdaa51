//! A whole Redis Cluster as one voter: each request is one script call, routed by redis-rs's
//! cluster client to the master of the keys' hash slot (following `MOVED` and `ASK`).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::{RedisError, Value};

use super::{Advice, Advisory, Node, NodeCall, Request, advice, cached, script_call};
use crate::error::NodeFailure;

/// One Redis Cluster, reached through its seed nodes, voting once. The connection is made on
/// first use and shared; redis-rs refreshes the slot map after `MOVED`, reconnects to
/// members, and finds the new master after a failover. A call given up renews it in the
/// background (see `given_up`).
pub(crate) struct ClusterNode {
    addr: String,
    shared: Arc<Shared>,
}

struct Shared {
    client: ClusterClient,
    conn: cached::Cached<ClusterConnection>,
    /// The lock manager's `node_timeout`: how long a call waits for a member.
    node_timeout: Duration,
}

/// How many connect timeouts making the cluster connection may take: the seeds, then the
/// masters of the slot map they return, each step bounded by the connect timeout (a hung
/// member costs one in each), and the round trips in between.
const DISCOVERY_STEPS: u32 = 3;

impl ClusterNode {
    /// A voter over the cluster that `seeds` (its members' URLs) belong to; `addr` names it
    /// in messages; calls wait `node_timeout` for a member. Nothing is connected yet.
    pub(crate) fn new(
        seeds: Vec<redis::ConnectionInfo>,
        addr: String,
        node_timeout: Duration,
    ) -> Result<Self, RedisError> {
        let connect_timeout = super::redis::connect_timeout(node_timeout);
        let client = ClusterClient::builder(seeds)
            .connection_timeout(connect_timeout)
            // Every call is bounded by node_timeout; a response timeout would only race it.
            .response_timeout(Duration::from_secs(3600))
            .build()?;
        Ok(ClusterNode {
            addr,
            shared: Arc::new(Shared {
                client,
                conn: cached::Cached::new(connect_timeout * DISCOVERY_STEPS)
                    .renewals_spaced(connect_timeout),
                node_timeout,
            }),
        })
    }
}

impl script_call::Connector for Shared {
    type Conn = ClusterConnection;

    fn node_timeout(&self) -> Duration {
        self.node_timeout
    }

    /// The shared connection, or a new one (the seeds, the slot map, every master), made in a
    /// task of its own.
    async fn connection(&self) -> Result<(u64, ClusterConnection), RedisError> {
        let client = self.client.clone();
        self.conn
            .get_or_make(move || async move { client.get_async_connection().await })
            .await
    }

    /// Drops the connection after a failure the cluster client does not recover from by
    /// itself (no member reachable, authentication), so that the next call starts afresh.
    async fn forget_after(&self, err: &RedisError, generation: u64) {
        if matches!(
            err.kind(),
            redis::ErrorKind::ClusterConnectionNotFound | redis::ErrorKind::AuthenticationFailed
        ) {
            self.conn.forget(generation).await;
        }
    }

    /// A member that does not answer within `node_timeout` may be hung, or cut off, while a
    /// failover gives its slots to another: the cluster client learns of a new owner only
    /// from a reply (`MOVED`), which a hung member never sends, and its connections have no
    /// response timeout of their own. So a new connection is made in the background (the
    /// seeds asked for the slot map again) and takes over once made; the other members keep
    /// answering on the current one meanwhile. One renewal at a time, a connect timeout
    /// apart.
    fn given_up(&self, generation: u64) {
        let client = self.client.clone();
        self.conn.renew(generation, move || async move {
            client.get_async_connection().await
        });
    }
}

impl Node for ClusterNode {
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
            // Every master's: `CONFIG GET` alone goes to one member, chosen at random.
            Advisory::EvictionPolicy => {
                let shared = Arc::clone(&self.shared);
                advice(
                    Box::pin(
                        async move { script_call::on(&*shared, masters_eviction_policy).await },
                    ),
                    Advice::EvictionPolicy,
                )
            }
            // Many servers: no one run_id.
            Advisory::RunId => Box::pin(async { Ok(Advice::RunId(None)) }),
        }
    }

    fn addr(&self) -> &str {
        &self.addr
    }
}

/// The `maxmemory-policy` of every master of the cluster: theirs when they agree, or the
/// first that may evict lock keys, with the member's address.
async fn masters_eviction_policy(conn: &mut ClusterConnection) -> Result<String, RedisError> {
    let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
    let reply = conn
        .route_command(script_call::eviction_policy_cmd(), routing)
        .await?;
    let Value::Map(members) = reply else {
        return Err(unexpected("not one reply per master"));
    };
    let mut policies = Vec::with_capacity(members.len());
    for (member, reply) in members {
        let member: String = redis::from_redis_value(member)?;
        if let Value::ServerError(err) = reply {
            return Err(err.into());
        }
        let policy = script_call::policy_of(redis::from_redis_value(reply)?)?;
        policies.push((member, policy));
    }
    let Some((_, first)) = policies.first() else {
        return Err(unexpected("no master answered"));
    };
    if policies.iter().all(|(_, policy)| policy == first) {
        return Ok(first.clone());
    }
    // They differ, so one of them is not `noeviction`.
    Ok(policies
        .iter()
        .find(|(_, policy)| policy != "noeviction")
        .map_or_else(
            || first.clone(),
            |(member, policy)| format!("{policy} (on {member})"),
        ))
}

fn unexpected(what: &'static str) -> RedisError {
    RedisError::from((redis::ErrorKind::UnexpectedReturnType, what))
}
