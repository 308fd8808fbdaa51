//! One lock server as the quorum logic sees it: the [`Node`] trait, the request it runs, and
//! its Redis implementation. Unit tests run the same logic over fake nodes.

pub(crate) mod advisory;
pub(crate) mod batch;
#[cfg(feature = "cluster")]
mod cluster;
mod plain;
pub(crate) mod queue;
mod redis;
mod server_link;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tokio::sync::oneshot;

use crate::error::NodeFailure;

pub(crate) use self::advisory::{
    Advice, Advisory, Claim, GuardedWrite, KeyRow, RwRow, claim, eviction_policy, inspect, run_id,
    rw_inspect, write_if_held,
};
pub(crate) use self::redis::RedisNode;
#[cfg(feature = "cluster")]
pub(crate) use cluster::cluster_node;

/// Where one request's reply goes.
pub(crate) type Reply = oneshot::Sender<Result<i64, NodeFailure>>;

/// The serving task of a node's queue is gone: its runtime shut down.
pub(crate) fn stopped() -> NodeFailure {
    NodeFailure::NotRun("the node's request queue stopped (its runtime shut down)")
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
    /// A read-write lock's operation (its keys are the lock's three: writer, readers,
    /// writer-waiting): the batch script's read-write kinds, never a plain command.
    pub(crate) rw: Option<Arc<RwOp>>,
}

impl Request {
    /// Which of the batch script's operations this request is: decided here, from the
    /// request's shape, for every encoder (the script call, the plain commands).
    pub(crate) fn command(&self) -> Command {
        if let Some(rw) = self.rw.as_deref() {
            return Command::ReadWrite(rw.mode, self.op);
        }
        match (self.op, self.queue.is_some()) {
            (Op::Acquire, false) => Command::Acquire,
            (Op::Acquire, true) => Command::FairAcquire,
            (Op::Extend, false) => Command::Extend,
            (Op::Extend, true) => Command::FairExtend,
            (Op::Release, false) => Command::Release,
            (Op::Release, true) => Command::FairRelease,
            (Op::Leave, _) => Command::Leave,
        }
    }
}

/// One of the batch script's operations (`scripts/batch.lua`), as a request's shape says
/// ([`Request::command`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Command {
    /// `a`: set every key if none exists.
    Acquire,
    /// `f`: the same, for the waiter at the head of every key's fair line only.
    FairAcquire,
    /// `e` (or `E`, repairing a missing key on a server out of quarantine): re-arm every key
    /// that holds the token.
    Extend,
    /// The same, for a lock taken in the fair line (the script's alone: never a plain
    /// command).
    FairExtend,
    /// `r`: delete every key that holds the token.
    Release,
    /// `R`: the same, leaving the fair line too.
    FairRelease,
    /// `l`: leave the fair line.
    Leave,
    /// A read-write lock's operation: its side, then the operation (`ra`, `re`, `rr`; `wa`,
    /// `we`, `wr`, `wl`). Never repaired, never a plain command.
    ReadWrite(RwMode, Op),
}

impl Command {
    /// The batch script's name for it; an extension as `E` with `repair`.
    pub(crate) fn script_kind(self, repair: bool) -> &'static str {
        match self {
            Command::Acquire => "a",
            Command::FairAcquire => "f",
            Command::Extend | Command::FairExtend if repair => "E",
            Command::Extend | Command::FairExtend => "e",
            Command::Release => "r",
            Command::FairRelease => "R",
            Command::Leave => "l",
            Command::ReadWrite(RwMode::Read, Op::Acquire) => "ra",
            Command::ReadWrite(RwMode::Read, Op::Extend) => "re",
            Command::ReadWrite(RwMode::Read, Op::Release | Op::Leave) => "rr",
            Command::ReadWrite(RwMode::Write, Op::Acquire) => "wa",
            Command::ReadWrite(RwMode::Write, Op::Extend) => "we",
            Command::ReadWrite(RwMode::Write, Op::Release) => "wr",
            Command::ReadWrite(RwMode::Write, Op::Leave) => "wl",
        }
    }

    /// Whether the script takes the fair line's three arguments after the common four
    /// (waiter, ticket, lease).
    fn in_line(self) -> bool {
        matches!(
            self,
            Command::FairAcquire | Command::FairRelease | Command::Leave
        )
    }
}

/// Which side of a read-write lock a request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum RwMode {
    /// A reader: a member of the readers' sorted set.
    Read,
    /// The writer: the writer key.
    Write,
}

/// What a read-write lock's request carries beside the lock's own: the mode, and for a
/// writer the waiting mark it leaves when refused.
#[derive(Clone, Debug)]
pub(crate) struct RwOp {
    pub(crate) mode: RwMode,
    /// The waiting writer's id, the same for all the attempts of one acquisition (their
    /// tokens differ); empty for a reader.
    pub(crate) waiter: Arc<str>,
    /// How long a refused writer marks the lock as waited for, in ms (0: no mark, a
    /// `try_acquire_write`); for a leave, unused.
    pub(crate) wait_ms: u64,
}

/// A node call in flight ([`Node::call`]): the answer of the node's queue itself (no
/// allocation: a lock makes one call per node per round), or a boxed future (a queue on a
/// current-thread runtime, waited for with a watchdog; a request refused before it was
/// queued; a fake node).
pub(crate) enum NodeCall {
    /// Answered by a node's queue (`queue/`); a queue that stopped never answers.
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

/// A lock server: one voter. Every real voter (a server, a Sentinel group's master, a Cluster)
/// is a [`QueuedNode`](queue::QueuedNode): its calls on its one ordered queue, over its link;
/// unit tests use fakes (the same queue over a fake link) that grant, deny, fail, are slow, or
/// never answer.
pub(crate) trait Node: Send + Sync {
    /// Runs the request's script. The reply is the script's integer: for `Acquire` and
    /// `Extend` a positive number means granted and 0 means refused; for `Release` the number
    /// of keys deleted. The request is queued by the time this returns: it runs on the node
    /// after every call made before it, and to its end even when the returned future is
    /// dropped. The node bounds the call itself: `node_timeout` on the call in flight, not on
    /// the wait in its queue behind others while the node answers.
    fn call(&self, req: &Request) -> NodeCall;

    /// Resolves once every call made before it has run (or failed), and the releases given up
    /// on the way have been answered or have expired; at once on a node without a queue.
    fn flush(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }

    /// Makes a call outside the lock protocol (see [`Advisory`]) and answers with the
    /// [`Advice`] of the same kind: on the node's queue, after every call made before it, on
    /// the same connection. The caller bounds it with the node timeout; the typed wrappers
    /// [`inspect`], [`write_if_held`], [`eviction_policy`] and [`run_id`] say what each call
    /// does.
    fn advise(&self, advisory: Advisory) -> BoxFuture<'static, Result<Advice, NodeFailure>>;

    /// The node's address (host, port and database, never credentials), for error messages.
    fn addr(&self) -> &str;

    /// Whether this node's votes count now, or it may have forgotten locks it granted (see
    /// [`RedlockBuilder::restart_quarantine`](crate::RedlockBuilder::restart_quarantine)).
    /// Voters that do not track their memory (a Cluster, fakes) always count.
    fn standing(&self) -> crate::memory::Standing {
        crate::memory::Standing::Counts
    }
}

/// What kind of voter a node is, known when it is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VoterKind {
    /// One Redis server: it runs the batch script, fair queue included.
    Server,
    /// A whole Redis Cluster: every key of a lock must be in one hash slot; no fair queue.
    #[cfg(feature = "cluster")]
    Cluster,
    /// A Sentinel-managed master: one server, found through the sentinels; it runs the
    /// batch script, fair queue included.
    #[cfg(feature = "sentinel")]
    Sentinel,
}

impl VoterKind {
    /// Whether this kind of voter runs the fair queue (fair mode): every one-server voter.
    pub(crate) fn queues(self) -> bool {
        match self {
            VoterKind::Server => true,
            #[cfg(feature = "sentinel")]
            VoterKind::Sentinel => true,
            #[cfg(feature = "cluster")]
            VoterKind::Cluster => false,
        }
    }

    /// Two keys of `keys` (their positions) that this kind of voter cannot run in one
    /// script: a whole Redis Cluster needs every key of a lock in one hash slot. Checked before
    /// any traffic.
    pub(crate) fn split_keys(self, keys: &[String]) -> Option<(usize, usize)> {
        match self {
            #[cfg(feature = "cluster")]
            VoterKind::Cluster => {
                use ::redis::cluster_routing::Slot;
                let first = Slot::for_key(keys.first()?);
                keys.iter()
                    .position(|key| Slot::for_key(key) != first)
                    .map(|other| (0, other))
            }
            _ => {
                let _ = keys;
                None
            }
        }
    }
}

/// One voter as the builder makes it: the node, and what is known of it before any traffic.
pub(crate) struct Voter {
    pub(crate) node: Arc<dyn Node>,
    pub(crate) kind: VoterKind,
    /// The server addresses it answers at (for duplicate detection).
    pub(crate) identities: std::collections::BTreeSet<String>,
    /// Where its dedicated pub/sub connection goes, on which waiters hear of releases
    /// (`redfence:released:<key>`); `None` for voters that cannot subscribe (waiters poll).
    pub(crate) pubsub: Option<PubSub>,
}

/// Where a voter's release subscriber connects: the client of the server that answers for
/// the voter now, asked for at each connect (a Sentinel group's master changes).
#[derive(Clone)]
pub(crate) struct PubSub(Arc<dyn Fn() -> Option<::redis::Client> + Send + Sync>);

impl PubSub {
    /// The client `client` gives at each connect; `None` when no server is known yet.
    pub(crate) fn new(
        client: impl Fn() -> Option<::redis::Client> + Send + Sync + 'static,
    ) -> Self {
        PubSub(Arc::new(client))
    }

    /// The client to connect with now, if a server is known.
    pub(crate) fn client(&self) -> Option<::redis::Client> {
        (self.0)()
    }
}

impl std::fmt::Debug for PubSub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PubSub")
    }
}

/// The nodes of a lock manager, in the order the builder was given them.
pub(crate) type Nodes = [Arc<dyn Node>];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requests_shape_names_its_command_once_for_every_encoder() {
        let ticket = Arc::new(QueueTicket {
            waiter: "w".into(),
            ticket: 1,
            lease_ms: 1,
        });
        let rw = Arc::new(RwOp {
            mode: RwMode::Write,
            waiter: "w".into(),
            wait_ms: 1,
        });
        let req = |op, queue: Option<&Arc<QueueTicket>>, rw: Option<&Arc<RwOp>>| Request {
            op,
            keys: vec!["k".to_owned()].into(),
            token: "t".into(),
            ttl_ms: 1,
            queue: queue.cloned(),
            rw: rw.cloned(),
        };
        let kinds = |repair| {
            [
                req(Op::Acquire, None, None),
                req(Op::Acquire, Some(&ticket), None),
                req(Op::Extend, None, None),
                req(Op::Extend, Some(&ticket), None),
                req(Op::Release, None, None),
                req(Op::Release, Some(&ticket), None),
                req(Op::Leave, Some(&ticket), None),
                req(Op::Leave, None, Some(&rw)),
            ]
            .map(|r| r.command().script_kind(repair))
        };
        assert_eq!(kinds(false), ["a", "f", "e", "e", "r", "R", "l", "wl"]);
        assert_eq!(kinds(true), ["a", "f", "E", "E", "r", "R", "l", "wl"]);
        assert!(Command::FairAcquire.in_line() && !Command::FairExtend.in_line());
    }
}

#[cfg(all(test, feature = "cluster"))]
mod cluster_tests {
    use super::VoterKind;

    #[test]
    fn a_cluster_voter_needs_a_locks_keys_in_one_slot() {
        let keys = |ks: &[&str]| ks.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        let cluster = VoterKind::Cluster;
        assert_eq!(
            cluster.split_keys(&keys(&["{order:42}:a", "{order:42}:b"])),
            None
        );
        assert_eq!(cluster.split_keys(&keys(&["a"])), None);
        // "a" and "b" hash to slots 15495 and 3300.
        assert_eq!(cluster.split_keys(&keys(&["a", "a", "b"])), Some((0, 2)));
        assert_eq!(VoterKind::Server.split_keys(&keys(&["a", "b"])), None);
    }
}
