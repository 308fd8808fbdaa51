//! The advisory calls every kind of node makes outside its queue (inspect, eviction policy,
//! guarded write, run id), each one script or command (`EVALSHA`, loading the script on
//! `NOSCRIPT`) on any connection, and, for a voter found through others (a Cluster), the
//! [`Connector`] it makes them on.

use std::future::Future;
use std::sync::{Arc, LazyLock};

use futures::future::BoxFuture;
use redis::aio::ConnectionLike;
use redis::{RedisError, Script};

use super::{Claim, GuardedWrite, KeyRow, RwRow};
use crate::error::NodeFailure;

static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/inspect.lua")));
static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/force_release.lua")));
static WRITE_IF_HELD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/write_if_held.lua")));
static RW_INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/rwlock_inspect.lua")));
static CLAIM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/claim.lua")));

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

/// `INFO memory`, whose `maxmemory_policy` field is the policy: unlike `CONFIG GET`, which
/// managed services (ElastiCache, Memorystore) refuse, every server answers it.
pub(crate) fn eviction_policy_cmd() -> redis::Cmd {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("memory");
    cmd
}

/// The policy in a reply to [`eviction_policy_cmd`].
pub(crate) fn policy_of(info: String) -> Result<String, redis::RedisError> {
    info.lines()
        .find_map(|line| line.strip_prefix("maxmemory_policy:"))
        .map(|policy| policy.trim().to_owned())
        .ok_or_else(|| {
            redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "INFO memory has no maxmemory_policy field",
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

/// Claims `claim.key` for `claim.value` (set if absent, refreshed if equal), as
/// [`Node::claim`](super::claim); the value stored.
pub(crate) async fn claim<C: ConnectionLike + Send>(
    conn: &mut C,
    claim: &Claim,
) -> Result<String, redis::RedisError> {
    let mut invocation = CLAIM.prepare_invoke();
    invocation
        .key(&*claim.key)
        .arg(&*claim.value)
        .arg(claim.ttl_ms);
    invocation.invoke_async(conn).await
}

/// Reads a read-write lock's keys, as [`rw_inspect`](super::rw_inspect).
pub(crate) async fn rw_inspect<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &[String],
) -> Result<RwRow, redis::RedisError> {
    let mut invocation = RW_INSPECT.prepare_invoke();
    invocation.key(keys);
    invocation.invoke_async(conn).await
}

/// [`rw_inspect`] over a [`Connector`].
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) fn rw_inspect_on<C: Connector>(
    connector: &Arc<C>,
    keys: Arc<[String]>,
) -> BoxFuture<'static, Result<RwRow, NodeFailure>> {
    let connector = Arc::clone(connector);
    Box::pin(async move { on(&*connector, async |conn| rw_inspect(conn, &keys).await).await })
}

/// [`claim`] over a [`Connector`].
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) fn claim_on<C: Connector>(
    connector: &Arc<C>,
    request: &Claim,
) -> BoxFuture<'static, Result<String, NodeFailure>> {
    let (connector, request) = (Arc::clone(connector), request.clone());
    Box::pin(async move { on(&*connector, async |conn| claim(conn, &request).await).await })
}

/// Where a voter found through others (a Cluster) gets the connection its
/// advisory calls use, and when it drops it.
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) trait Connector: Send + Sync + 'static {
    /// The connection the calls run on.
    type Conn: ConnectionLike + Send;

    /// The shared connection, made on first use, with its generation.
    fn connection(&self) -> impl Future<Output = Result<(u64, Self::Conn), RedisError>> + Send;

    /// Drops the connection of `generation` (if still the current one) after `err`, if it is
    /// a failure this kind of node recovers from only by connecting afresh.
    fn forget_after(&self, err: &RedisError, generation: u64) -> impl Future<Output = ()> + Send;
}

/// Runs `op` on `connector`'s connection and reports its failure to the connector.
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) async fn on<C: Connector, T>(
    connector: &C,
    op: impl AsyncFnOnce(&mut C::Conn) -> Result<T, RedisError>,
) -> Result<T, NodeFailure> {
    // A connect that failed left nothing to forget.
    let (generation, mut conn) = connector.connection().await?;
    let result = op(&mut conn).await;
    if let Err(err) = &result {
        connector.forget_after(err, generation).await;
    }
    Ok(result?)
}

/// [`Node::inspect`](super::Node::inspect) over a [`Connector`].
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) fn inspect_on<C: Connector>(
    connector: &Arc<C>,
    keys: Arc<[String]>,
    delete: bool,
) -> BoxFuture<'static, Result<Vec<KeyRow>, NodeFailure>> {
    let connector = Arc::clone(connector);
    Box::pin(async move { on(&*connector, async |conn| inspect(conn, &keys, delete).await).await })
}

/// [`Node::write_if_held`](super::Node::write_if_held) over a [`Connector`].
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) fn write_if_held_on<C: Connector>(
    connector: &Arc<C>,
    write: &GuardedWrite,
) -> BoxFuture<'static, Result<bool, NodeFailure>> {
    let (connector, write) = (Arc::clone(connector), write.clone());
    Box::pin(async move { on(&*connector, async |conn| write_if_held(conn, &write).await).await })
}
