//! One request as one script call (`EVALSHA`, loading the script on `NOSCRIPT`) on any
//! connection: what the node kinds without batching (cluster, sentinel) send, and the
//! advisory calls every node kind makes (inspect, eviction policy, guarded write).

use std::future::Future;
use std::sync::{Arc, LazyLock};

use futures::future::BoxFuture;
use redis::aio::ConnectionLike;
use redis::{RedisError, Script};

use super::{GuardedWrite, KeyRow, Op, Request};
use crate::error::NodeFailure;
use crate::guard::DropGuard;

static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/acquire.lua")));
static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/extend.lua")));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/release.lua")));
static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/inspect.lua")));
static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/force_release.lua")));
static WRITE_IF_HELD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/write_if_held.lua")));

/// Runs `req`'s script on `conn` and returns its integer reply.
#[cfg_attr(not(any(feature = "cluster", feature = "sentinel")), allow(dead_code))]
pub(crate) async fn run<C: ConnectionLike + Send>(
    conn: &mut C,
    req: &Request,
) -> Result<i64, redis::RedisError> {
    let script: &Script = match req.op {
        Op::Acquire => &ACQUIRE,
        Op::Extend => &EXTEND,
        Op::Release => &RELEASE,
        // These voters have no fair queue (`build()` refuses fair mode over them).
        Op::Leave => return Ok(0),
    };
    let mut invocation = script.prepare_invoke();
    invocation.key(&*req.keys).arg(&*req.token);
    if req.op != Op::Release {
        invocation.arg(req.ttl_ms);
    }
    invocation.invoke_async(conn).await
}

/// Reads (and with `delete`, deletes) `keys` on `conn`, as [`Node::inspect`](super::Node::inspect).
pub(crate) async fn inspect<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &[String],
    delete: bool,
) -> Result<Vec<KeyRow>, redis::RedisError> {
    let script: &Script = if delete { &FORCE_RELEASE } else { &INSPECT };
    let mut invocation = script.prepare_invoke();
    invocation.key(keys);
    invocation.invoke_async(conn).await
}

/// The server's `maxmemory-policy`, as [`Node::eviction_policy`](super::Node::eviction_policy).
pub(crate) async fn eviction_policy<C: ConnectionLike + Send>(
    conn: &mut C,
) -> Result<String, redis::RedisError> {
    policy_of(eviction_policy_cmd().query_async(conn).await?)
}

/// `CONFIG GET maxmemory-policy`.
pub(crate) fn eviction_policy_cmd() -> redis::Cmd {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    cmd
}

/// The policy in a reply to [`eviction_policy_cmd`] (name, value).
pub(crate) fn policy_of(reply: Vec<String>) -> Result<String, redis::RedisError> {
    reply.into_iter().nth(1).ok_or_else(|| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "CONFIG GET maxmemory-policy returned no value",
        ))
    })
}

/// The server's `run_id` (`INFO server`), as [`Node::run_id`](super::Node::run_id).
pub(crate) async fn run_id<C: ConnectionLike + Send>(
    conn: &mut C,
) -> Result<Option<String>, redis::RedisError> {
    let info: String = redis::cmd("INFO").arg("server").query_async(conn).await?;
    Ok(info
        .lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(|id| id.trim().to_owned()))
}

/// [`Node::run_id`](super::Node::run_id) over a [`Connector`].
#[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
pub(crate) fn run_id_on<C: Connector>(
    connector: &Arc<C>,
) -> BoxFuture<'static, Result<Option<String>, NodeFailure>> {
    let connector = Arc::clone(connector);
    Box::pin(async move { on(&*connector, async |conn| run_id(conn).await).await })
}

/// Writes `write.key` if `write.lock_key` still holds our token, as
/// [`Node::write_if_held`](super::Node::write_if_held).
pub(crate) async fn write_if_held<C: ConnectionLike + Send>(
    conn: &mut C,
    write: &GuardedWrite,
) -> Result<bool, redis::RedisError> {
    let mut invocation = WRITE_IF_HELD.prepare_invoke();
    invocation
        .key(&*write.lock_key)
        .key(&*write.key)
        .arg(&*write.token)
        .arg(write.value.as_deref().unwrap_or(""))
        .arg(write.ttl_ms);
    let written: i64 = invocation.invoke_async(conn).await?;
    Ok(written == 1)
}

/// Where a node that sends one script per request (a cluster or a Sentinel voter) gets its
/// connection, and when it drops it.
#[cfg_attr(not(any(feature = "cluster", feature = "sentinel")), allow(dead_code))]
pub(crate) trait Connector: Send + Sync + 'static {
    /// The connection the scripts run on.
    type Conn: ConnectionLike + Send;

    /// The shared connection, made on first use, with its generation (see
    /// [`given_up`](Self::given_up)).
    fn connection(&self) -> impl Future<Output = Result<(u64, Self::Conn), RedisError>> + Send;

    /// Drops the connection of `generation` (if still the current one) after `err`, if it is
    /// a failure this kind of node recovers from only by connecting afresh.
    fn forget_after(&self, err: &RedisError, generation: u64) -> impl Future<Output = ()> + Send;

    /// How long a call waits for the server (the lock manager's `node_timeout`).
    fn node_timeout(&self) -> std::time::Duration;

    /// A call on the connection of `generation` was given up before its answer, after at least
    /// half its `node_timeout` (the timeout passed, or its caller cancelled it late): the
    /// server may be hung, and this kind of node may recover only by connecting afresh (see
    /// [`Cached::try_forget`](super::cached::Cached::try_forget) and
    /// [`Cached::renew`](super::cached::Cached::renew)). A call its caller cancelled sooner (a
    /// `select!` or a short timeout around `acquire`) says nothing about the server and is not
    /// reported. Must not block (it runs on drop).
    fn given_up(&self, _generation: u64) {}
}

/// Runs `op` on `connector`'s connection and reports its failure to the connector, a call
/// dropped before its answer included.
pub(crate) async fn on<C: Connector, T>(
    connector: &C,
    op: impl AsyncFnOnce(&mut C::Conn) -> Result<T, RedisError>,
) -> Result<T, NodeFailure> {
    // A connect that failed left nothing to forget.
    let (generation, mut conn) = connector.connection().await?;
    let sent = tokio::time::Instant::now();
    let mut abandoned = DropGuard::new((connector, generation, sent), |(c, generation, sent)| {
        if sent.elapsed() >= c.node_timeout() / 2 {
            c.given_up(*generation);
        }
    });
    let result = op(&mut conn).await;
    abandoned.disarm();
    if let Err(err) = &result {
        connector.forget_after(err, generation).await;
    }
    Ok(result?)
}

/// [`Node::call`](super::Node::call) over a [`Connector`].
#[cfg_attr(not(any(feature = "cluster", feature = "sentinel")), allow(dead_code))]
pub(crate) fn call<C: Connector>(
    connector: &Arc<C>,
    req: &Request,
) -> BoxFuture<'static, Result<i64, NodeFailure>> {
    let (connector, req) = (Arc::clone(connector), req.clone());
    Box::pin(async move { on(&*connector, async |conn| run(conn, &req).await).await })
}

/// [`Node::inspect`](super::Node::inspect) over a [`Connector`].
#[cfg_attr(not(any(feature = "cluster", feature = "sentinel")), allow(dead_code))]
pub(crate) fn inspect_on<C: Connector>(
    connector: &Arc<C>,
    keys: Arc<[String]>,
    delete: bool,
) -> BoxFuture<'static, Result<Vec<KeyRow>, NodeFailure>> {
    let connector = Arc::clone(connector);
    Box::pin(async move { on(&*connector, async |conn| inspect(conn, &keys, delete).await).await })
}

/// [`Node::write_if_held`](super::Node::write_if_held) over a [`Connector`].
#[cfg_attr(not(any(feature = "cluster", feature = "sentinel")), allow(dead_code))]
pub(crate) fn write_if_held_on<C: Connector>(
    connector: &Arc<C>,
    write: &GuardedWrite,
) -> BoxFuture<'static, Result<bool, NodeFailure>> {
    let (connector, write) = (Arc::clone(connector), write.clone());
    Box::pin(async move { on(&*connector, async |conn| write_if_held(conn, &write).await).await })
}

/// [`Node::eviction_policy`](super::Node::eviction_policy) over a [`Connector`] (one server).
#[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
pub(crate) fn eviction_policy_on<C: Connector>(
    connector: &Arc<C>,
) -> BoxFuture<'static, Result<String, NodeFailure>> {
    let connector = Arc::clone(connector);
    Box::pin(async move { on(&*connector, async |conn| eviction_policy(conn).await).await })
}
