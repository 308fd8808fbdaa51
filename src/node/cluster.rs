//! A whole Redis Cluster as one voter: the node's queue ([`Queue`]) sends each batch split by
//! hash slot, one `EVALSHA` of the batch script per slot, routed by redis-rs's cluster
//! connection to the slot's master (following `MOVED` and `ASK`).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr,
};
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::time::{Instant, Sleep};

use super::batch::{Link, PATIENCE, Replies, Run, Touch, check_count, write_eval, write_script};
use super::queue::{Queue, QueuedNode};
use super::{Advice, Advisory, advisory};
use crate::connection::Holder;
use crate::error::NodeFailure;

/// A Cluster voter's connection: made on first use and shared by its link's lock and advisory
/// calls; redis-rs refreshes the slot map after `MOVED`, reconnects to members after I/O
/// errors, and finds the new master after a failover it hears of.
struct Shared {
    client: ClusterClient,
    conn: Holder<ClusterConnection>,
}

/// How many connect timeouts making the cluster connection may take: the seeds, then the
/// masters of the slot map they return, each step bounded by the connect timeout (a hung
/// member costs one in each), and the round trips in between.
const DISCOVERY_STEPS: u32 = 3;

/// One Redis Cluster as a voter, voting once: the cluster that `seeds` (its members' URLs)
/// belong to; `addr` names it in messages; a call in flight waits `node_timeout` for a member.
/// A slot whose master leaves calls unanswered for [`PATIENCE`] has the connection made again
/// (the slot map asked for), in the background. Nothing is connected yet.
pub(crate) fn cluster_node(
    seeds: Vec<redis::ConnectionInfo>,
    addr: String,
    node_timeout: Duration,
) -> Result<QueuedNode, RedisError> {
    let connect_timeout = super::redis::connect_timeout(node_timeout);
    let client = ClusterClient::builder(seeds)
        .connection_timeout(connect_timeout)
        // Every call is bounded by node_timeout; a response timeout would only race it.
        .response_timeout(Duration::from_secs(3600))
        .build()?;
    let shared = Arc::new(Shared {
        client,
        conn: Holder::new(connect_timeout * DISCOVERY_STEPS).renewals_spaced(connect_timeout),
    });
    let queue = Queue::new(&addr, node_timeout, move || ClusterLink {
        shared: Arc::clone(&shared),
        stalled: HashMap::new(),
        generation: 0,
    });
    Ok(QueuedNode::new(addr, queue, None))
}

impl Shared {
    /// Makes a new connection in the background (the seeds asked for the slot map again),
    /// which takes the place of the connection of `generation` once made; see
    /// [`Holder::renew`].
    fn renew(&self, generation: u64) {
        let client = self.client.clone();
        self.conn.renew(generation, move || async move {
            client.get_async_connection().await
        });
    }
}

impl Shared {
    /// The shared connection, or a new one (the seeds, the slot map, every master), made in a
    /// task of its own that a call given up does not abandon.
    async fn connection(&self) -> Result<(u64, ClusterConnection), NodeFailure> {
        let client = self.client.clone();
        self.conn
            .get_or_make(move || async move { client.get_async_connection().await })
            .await
    }

    /// Drops the connection after a failure the cluster client does not recover from by
    /// itself (no member reachable, authentication), so that the next call starts afresh.
    async fn forget_after(&self, failure: &NodeFailure, generation: u64) {
        if failure.redis().is_some_and(|err| {
            matches!(
                err.kind(),
                ErrorKind::ClusterConnectionNotFound | ErrorKind::AuthenticationFailed
            )
        }) {
            self.conn.forget(generation);
        }
    }
}

/// A Cluster voter's link: a batch split by hash slot (every key of a lock is in one slot, as
/// `build()` and the request checks make sure), one batch script per slot, the slots' calls
/// sent together, each one's requests in queue order.
///
/// A member that hangs is kept: the connection to it carries the calls made before, and a
/// call sent now goes behind them, so when it resumes a release runs after its acquire. Only
/// once a slot's calls have gone unanswered for [`PATIENCE`] is the cluster connection made
/// again (the slot map asked for): its master may have been replaced by a failover, which
/// the cluster client learns of only from a reply (`MOVED`) that a hung member never sends.
/// The connection is one for every member, so it is made again only when every slot waiting
/// on it has waited its window.
struct ClusterLink {
    shared: Arc<Shared>,
    /// Since when each slot's calls have gone unanswered on the connection of `generation`.
    stalled: HashMap<Slot, Instant>,
    generation: u64,
}

impl Link for ClusterLink {
    /// A member that hangs says nothing of the others: the calls behind a call that timed out
    /// on it wait for their turn (each costs at most about two node timeouts) instead of
    /// failing with it.
    fn hangs_whole(&self) -> bool {
        false
    }

    async fn advise<'a>(&'a mut self, advisory: &'a Advisory) -> Result<Advice, NodeFailure> {
        // A connect that failed left nothing to forget.
        let (generation, mut conn) = self.shared.connection().await?;
        let advised = match advisory {
            // Every master's: `INFO memory` alone goes to one member, chosen at random.
            Advisory::EvictionPolicy => masters_eviction_policy(&mut conn)
                .await
                .map(Advice::EvictionPolicy),
            // Many servers: no one run_id.
            Advisory::RunId => Ok(Advice::RunId(None)),
            other => advisory::run(&mut conn, other).await,
        };
        if let Err(err) = &advised {
            self.shared.forget_after(err, generation).await;
        }
        advised
    }

    async fn send<'a>(
        &'a mut self,
        runs: &'a [Run],
        timeout: Duration,
        deadline: Pin<&'a mut Sleep>,
    ) -> Result<Replies, NodeFailure> {
        let at = deadline.deadline();
        let (generation, conn) = match tokio::time::timeout_at(at, self.shared.connection()).await {
            Ok(made) => made?,
            Err(_) => return Err(NodeFailure::Timeout(timeout)),
        };
        if generation != self.generation {
            self.generation = generation;
            self.stalled.clear();
        }
        // The requests of each slot, in queue order.
        let mut slots: Vec<(Slot, Vec<usize>)> = Vec::new();
        for (index, run) in runs.iter().enumerate() {
            let slot = run
                .req
                .keys
                .first()
                .map_or(Slot::for_key(""), Slot::for_key);
            match slots.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, members)) => members.push(index),
                None => slots.push((slot, vec![index])),
            }
        }
        let calls = slots.iter().map(|(slot, members)| {
            let group = members.iter().map(|&i| &runs[i]);
            let (mut script, mut eval) = (Cmd::new(), Cmd::new());
            write_script(group.clone(), Touch::KeysOnly, &mut script);
            write_eval(group, Touch::KeysOnly, &mut eval);
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                Route::with_slot(*slot, SlotAddr::Master),
            ));
            let mut conn = conn.clone();
            async move {
                match tokio::time::timeout_at(at, evalsha_on(&mut conn, &script, &eval, route))
                    .await
                {
                    Ok(replies) => replies,
                    Err(_) => Err(NodeFailure::Timeout(timeout)),
                }
            }
        });
        let outcomes = join_all(calls).await;
        let now = Instant::now();
        let mut replies: Vec<Option<Result<Value, NodeFailure>>> =
            std::iter::repeat_with(|| None).take(runs.len()).collect();
        let mut first_failure = None;
        let mut answered = false;
        for ((slot, members), outcome) in slots.iter().zip(outcomes) {
            let outcome = outcome.and_then(|values| {
                check_count(values.len(), members.len())?;
                Ok(values)
            });
            match outcome {
                Ok(values) => {
                    answered = true;
                    self.stalled.remove(slot);
                    for (&i, value) in members.iter().zip(values) {
                        replies[i] = Some(Ok(value));
                    }
                }
                Err(failure) => {
                    if let NodeFailure::Timeout(_) = failure {
                        self.stalled.entry(*slot).or_insert(now);
                    } else {
                        // Answered, if with an error: the member is not hung.
                        self.stalled.remove(slot);
                        self.forget_after(&failure, generation).await;
                    }
                    for &i in members {
                        replies[i] = Some(Err(failure.clone()));
                    }
                    first_failure.get_or_insert(failure);
                }
            }
        }
        // Every slot waiting on the connection has waited its whole window: a new connection
        // replaces it for every member, and a slot whose calls were still within their window
        // (another member briefly stalled) would see its release overtake its acquire.
        if !self.stalled.is_empty()
            && self
                .stalled
                .values()
                .all(|since| now.duration_since(*since) >= PATIENCE)
        {
            tracing::debug!(
                "the hash slots' masters have not answered for the patience window; making the cluster connection again"
            );
            self.shared.renew(generation);
        }
        match first_failure {
            None => Ok(Replies::All(
                replies
                    .into_iter()
                    .flatten()
                    .filter_map(Result::ok)
                    .collect(),
            )),
            // Every slot failed: the call as a whole did.
            Some(failure) if !answered => Err(failure),
            Some(failure) => Ok(Replies::Each(
                replies
                    .into_iter()
                    .map(|reply| reply.unwrap_or_else(|| Err(failure.clone())))
                    .collect(),
            )),
        }
    }
}

impl ClusterLink {
    async fn forget_after(&self, failure: &NodeFailure, generation: u64) {
        self.shared.forget_after(failure, generation).await;
    }
}

/// Runs `script` (an `EVALSHA` of the batch script) on the master that `route` names, or
/// `eval` (the same as an `EVAL` of its source) when the server that runs it does not have the
/// script (`NOSCRIPT`: a new member, a restart, a slot being imported, reached through `ASK`).
async fn evalsha_on(
    conn: &mut ClusterConnection,
    script: &Cmd,
    eval: &Cmd,
    route: RoutingInfo,
) -> Result<Vec<Value>, NodeFailure> {
    // (A server's error comes back as a value from a routed command.)
    let reply = match conn
        .route_command(script.clone(), route.clone())
        .await
        .and_then(Value::extract_error)
    {
        Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => conn
            .route_command(eval.clone(), route)
            .await
            .and_then(Value::extract_error)?,
        other => other?,
    };
    Ok(redis::from_redis_value(reply).map_err(RedisError::from)?)
}

/// The `maxmemory-policy` of every master of the cluster: theirs when they agree, or the
/// first that may evict lock keys, with the member's address.
async fn masters_eviction_policy(conn: &mut ClusterConnection) -> Result<String, NodeFailure> {
    let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
    let reply = conn
        .route_command(advisory::eviction_policy_cmd(), routing)
        .await?;
    let Value::Map(members) = reply else {
        return Err(unexpected("not one reply per master"));
    };
    let mut policies = Vec::with_capacity(members.len());
    for (member, reply) in members {
        let member: String = parsed(member)?;
        if let Value::ServerError(err) = reply {
            return Err(RedisError::from(err).into());
        }
        let policy = advisory::policy_of(parsed(reply)?)?;
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

/// `value` as a `T`, or an unexpected reply.
fn parsed<T: redis::FromRedisValue>(value: Value) -> Result<T, NodeFailure> {
    redis::from_redis_value(value).map_err(|err| NodeFailure::UnexpectedReply(err.to_string()))
}

fn unexpected(what: &'static str) -> NodeFailure {
    NodeFailure::UnexpectedReply(format!("INFO memory from every master: {what}"))
}
