//! One lock server as the quorum logic sees it: the [`Node`] trait, the request it runs, and
//! its Redis implementation. Unit tests run the same logic over fake nodes.

mod batch;
mod cached;
#[cfg(feature = "cluster")]
mod cluster;
pub(crate) mod connect;
mod connection;
#[cfg(test)]
pub(crate) mod fake;
mod pipeline;
mod redis;
mod script_call;
#[cfg(feature = "sentinel")]
mod sentinel;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tokio::sync::oneshot;

use crate::error::NodeFailure;

pub use self::connect::Tls;
pub(crate) use self::connection::LazyConnection;
pub(crate) use self::redis::RedisNode;
#[cfg(feature = "cluster")]
pub(crate) use cluster::ClusterNode;
#[cfg(feature = "sentinel")]
pub(crate) use sentinel::SentinelNode;

/// Where one request's reply goes.
pub(crate) type Reply = oneshot::Sender<Result<i64, NodeFailure>>;

/// The serving task of a node's queue is gone: its runtime shut down.
pub(crate) fn stopped() -> NodeFailure {
    NodeFailure::Reply(::redis::RedisError::from((
        ::redis::ErrorKind::Client,
        "the node's request queue stopped (its runtime shut down)",
    )))
}

/// Which script a request runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Op {
    /// Set every key to the token if none of them exists (all-or-nothing).
    Acquire,
    /// Re-arm the expiry of every key if all still hold the token.
    Extend,
    /// Delete every key that still holds the token.
    Release,
    /// Leave the fair queue of every key (fair mode: the request's [`QueueTicket`]).
    Leave,
}

/// A waiter's place in the fair queue of each key (fair mode), sent with its acquire
/// attempts: nodes grant only the waiter at the head of every key's queue.
#[derive(Clone, Debug)]
pub(crate) struct QueueTicket {
    /// The waiter's id, the same for all its attempts (its attempts' tokens differ).
    pub(crate) waiter: Arc<str>,
    /// Its place: microseconds since the Unix epoch when it started waiting (ties go by id).
    pub(crate) ticket: u64,
    /// How long the node keeps the waiter in line without hearing from it, in ms.
    pub(crate) lease_ms: u64,
}

/// One request, sent unchanged to every node.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    pub(crate) op: Op,
    pub(crate) keys: Arc<[String]>,
    pub(crate) token: Arc<str>,
    /// The TTL in milliseconds (unused by `Release`).
    pub(crate) ttl_ms: u64,
    /// Fair mode: the waiter's place in line (`Acquire`, `Leave`).
    pub(crate) queue: Option<Arc<QueueTicket>>,
}

/// A write that a node makes only while a lock key still holds our token.
#[derive(Clone, Debug)]
pub(crate) struct GuardedWrite {
    pub(crate) lock_key: Arc<str>,
    pub(crate) token: Arc<str>,
    pub(crate) key: Arc<str>,
    /// The value to set (never empty), or `None` to delete the key.
    pub(crate) value: Option<Arc<str>>,
    pub(crate) ttl_ms: u64,
}

/// A node call in flight ([`Node::call`]): on a node's own queue, the queue's answer itself
/// (no allocation: a lock makes one call per node per round); otherwise a boxed future.
pub(crate) enum NodeCall {
    /// Answered by a node's queue (`pipeline.rs`); a queue that stopped never answers.
    Queued(oneshot::Receiver<Result<i64, NodeFailure>>),
    /// Any other call.
    Boxed(BoxFuture<'static, Result<i64, NodeFailure>>),
}

impl NodeCall {
    /// `call` as a node call.
    pub(crate) fn boxed(
        call: impl Future<Output = Result<i64, NodeFailure>> + Send + 'static,
    ) -> Self {
        NodeCall::Boxed(Box::pin(call))
    }
}

impl Future for NodeCall {
    type Output = Result<i64, NodeFailure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            NodeCall::Queued(answer) => Pin::new(answer)
                .poll(cx)
                .map(|answer| answer.unwrap_or_else(|_| Err(stopped()))),
            NodeCall::Boxed(call) => call.as_mut().poll(cx),
        }
    }
}

/// A lock server. Real nodes are [`RedisNode`]s; unit tests use fakes that grant, deny, fail,
/// are slow, or never answer.
pub(crate) trait Node: Send + Sync {
    /// Runs the request's script. The reply is the script's integer: for `Acquire` and
    /// `Extend` a positive number means granted and 0 means refused; for `Release` the number
    /// of keys deleted. The future owns what it needs, so it can outlive the call; the caller
    /// bounds it with the node timeout.
    fn call(&self, req: &Request) -> NodeCall;

    /// Whether this node queues its calls: they run in the order they were made, each one
    /// to its end even when its future is dropped, and the node bounds each call's time
    /// itself (`node_timeout` on the call in flight, not on the wait in its queue). The
    /// quorum logic then neither gates a lock's calls on its earlier ones nor puts a timer on
    /// them. Defaults to `false`: calls are independent futures.
    fn pipelined(&self) -> bool {
        false
    }

    /// Resolves once every call made before it has run (a pipelined node); at once otherwise.
    fn flush(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }

    /// Reads each key's type, value (if a string) and PTTL in one atomic script; with
    /// `delete`, then deletes every key that exists, whoever holds it (the operator's forced
    /// release). Outside the lock protocol. The caller bounds it with the node timeout.
    fn inspect(
        &self,
        keys: Arc<[String]>,
        delete: bool,
    ) -> BoxFuture<'static, Result<Vec<KeyRow>, NodeFailure>>;

    /// Sets `write.key` to `write.value` with `write.ttl_ms` (or deletes it, when `value` is
    /// `None`) only while `write.lock_key` holds `write.token`, atomically; `true` when the
    /// lock held and the write was made. For a leader's record beside its election lock. The
    /// caller bounds it with the node timeout.
    fn write_if_held(&self, write: &GuardedWrite) -> BoxFuture<'static, Result<bool, NodeFailure>>;

    /// The server's `maxmemory-policy` (`CONFIG GET`). The caller bounds it with the node
    /// timeout.
    fn eviction_policy(&self) -> BoxFuture<'static, Result<String, NodeFailure>>;

    /// The server's `run_id` (`INFO server`), which tells one server from another whatever
    /// address it is reached at; `None` for a voter that is many servers (a cluster) or a
    /// fake. The caller bounds it with the node timeout.
    fn run_id(&self) -> BoxFuture<'static, Result<Option<String>, NodeFailure>> {
        Box::pin(async { Ok(None) })
    }

    /// A client for a dedicated pub/sub connection to this node, on which waiters hear of
    /// releases (`redfence:released:<key>`). `None` (the default) for voters that cannot
    /// subscribe: waiters for them poll.
    fn pubsub_client(&self) -> Option<::redis::Client> {
        None
    }

    /// Whether this node runs the fair queue (fair mode): the batch script of a single
    /// server does; cluster and Sentinel voters do not.
    fn queues(&self) -> bool {
        false
    }

    /// The node's address (host, port and database, never credentials), for error messages.
    fn addr(&self) -> &str;

    /// Two keys of `keys` (their positions) that this node cannot run in one script: a
    /// voter that is a whole Redis Cluster needs every key of a lock in one hash slot.
    /// Checked before any traffic. Defaults to none (a single server takes any keys).
    fn split_keys(&self, _keys: &[String]) -> Option<(usize, usize)> {
        None
    }
}

/// One key as a node holds it: its `TYPE` (`none` when absent), its value when it is a
/// string, and its `PTTL` in milliseconds (-2: no key, -1: no expiry).
pub(crate) type KeyRow = (String, Option<Vec<u8>>, i64);

/// The nodes of a lock manager, in the order the builder was given them.
pub(crate) type Nodes = [Arc<dyn Node>];
