//! The advisory calls (inspect, forced release, guarded write, claim, read-write inspect,
//! eviction policy, run id): each one script or command (`EVALSHA`, loading the script on
//! `NOSCRIPT`) on any connection. A node's queue makes them in line with its lock calls, on
//! its link's connection ([`Link::advise`](super::batch::Link::advise)).

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{RedisError, Script};

use super::{Advice, Advisory, Claim, GuardedWrite, KeyRow, RwRow};

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

/// Runs `advisory` on `conn`, a connection to one server (a Cluster's connection routes each
/// by its keys; its eviction policy and run id are its own: see `cluster.rs`).
pub(crate) async fn run<C: ConnectionLike + Send>(
    conn: &mut C,
    advisory: &Advisory,
) -> Result<Advice, RedisError> {
    Ok(match advisory {
        Advisory::Inspect { keys, delete } => Advice::Keys(inspect(conn, keys, *delete).await?),
        Advisory::WriteIfHeld(write) => Advice::Written(write_if_held(conn, write).await?),
        Advisory::EvictionPolicy => Advice::EvictionPolicy(eviction_policy(conn).await?),
        Advisory::RunId => Advice::RunId(run_id(conn).await?),
        Advisory::Claim(request) => Advice::Claimed(claim(conn, request).await?),
        Advisory::RwInspect { keys } => Advice::RwKeys(rw_inspect(conn, keys).await?),
    })
}
