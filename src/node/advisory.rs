//! The advisory calls (inspect, forced release, guarded write, claim, read-write inspect,
//! eviction policy, run id): each one script or command (`EVALSHA`, loading the script on
//! `NOSCRIPT`) on any connection. A node's queue makes them in line with its lock calls, on
//! its link's connection ([`Link::advise`](super::batch::Link::advise)).

use std::sync::LazyLock;

use redis::Script;
use redis::aio::ConnectionLike;

use std::sync::Arc;

use super::Node;
use crate::error::NodeFailure;

/// Reads keys; with the [`RELEASE`] argument, also deletes them (the forced release).
static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/inspect.lua")));
/// `scripts/inspect.lua`'s argument that deletes each key after reading it.
const RELEASE: &str = "release";
static WRITE_IF_HELD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/write_if_held.lua")));
static RW_INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/rwlock_inspect.lua")));
static CLAIM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/claim.lua")));

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

/// A value that every client of a name must agree on, kept at `key` for `ttl_ms` (a
/// semaphore's number of permits).
#[derive(Clone, Debug)]
pub(crate) struct Claim {
    pub(crate) key: Arc<str>,
    pub(crate) value: Arc<str>,
    pub(crate) ttl_ms: u64,
}

/// A call outside the lock protocol: operators' reads and forced releases, a leader's
/// record, the production checks.
#[derive(Clone, Debug)]
pub(crate) enum Advisory {
    /// See [`inspect`].
    Inspect { keys: Arc<[String]>, delete: bool },
    /// See [`write_if_held`].
    WriteIfHeld(GuardedWrite),
    /// See [`eviction_policy`].
    EvictionPolicy,
    /// See [`run_id`].
    RunId,
    /// See [`claim`].
    Claim(Claim),
    /// See [`rw_inspect`].
    RwInspect { keys: Arc<[String]> },
}

/// The answer to an [`Advisory`], of the same kind.
#[derive(Debug)]
pub(crate) enum Advice {
    Keys(Vec<KeyRow>),
    Written(bool),
    EvictionPolicy(String),
    RunId(Option<String>),
    Claimed(String),
    RwKeys(RwRow),
}

/// `node`'s answer to `advisory`, taken apart by `expect` (the variant asked for).
async fn advised<T>(
    node: &dyn Node,
    advisory: Advisory,
    expect: fn(Advice) -> Result<T, Advice>,
) -> Result<T, NodeFailure> {
    let call = node.advise(advisory);
    expect(call.await?).map_err(|other| {
        NodeFailure::UnexpectedReply(format!(
            "an advisory call answered with another kind of answer: {other:?}"
        ))
    })
}

/// Reads each key's type, value (if a string) and PTTL in one atomic script
/// (`scripts/inspect.lua`); with `delete`, then deletes every key that exists, whoever holds
/// it (the operator's forced release: the script's `release` argument).
pub(crate) async fn inspect(
    node: &dyn Node,
    keys: Arc<[String]>,
    delete: bool,
) -> Result<Vec<KeyRow>, NodeFailure> {
    advised(
        node,
        Advisory::Inspect { keys, delete },
        |advice| match advice {
            Advice::Keys(rows) => Ok(rows),
            other => Err(other),
        },
    )
    .await
}

/// Sets `write.key` to `write.value` with `write.ttl_ms` (or deletes it, when `value` is
/// `None`) only while `write.lock_key` holds `write.token`, atomically; `true` when the lock
/// held and the write was made. For a leader's record beside its election lock.
pub(crate) async fn write_if_held(
    node: &dyn Node,
    write: GuardedWrite,
) -> Result<bool, NodeFailure> {
    advised(node, Advisory::WriteIfHeld(write), |advice| match advice {
        Advice::Written(made) => Ok(made),
        other => Err(other),
    })
    .await
}

/// The server's `maxmemory-policy` (`INFO memory`); a Cluster voter's, every master's.
pub(crate) async fn eviction_policy(node: &dyn Node) -> Result<String, NodeFailure> {
    advised(node, Advisory::EvictionPolicy, |advice| match advice {
        Advice::EvictionPolicy(policy) => Ok(policy),
        other => Err(other),
    })
    .await
}

/// The server's `run_id` (`INFO server`), which tells one server from another whatever address
/// it is reached at; `None` for a voter that is many servers (a cluster) or a fake.
pub(crate) async fn run_id(node: &dyn Node) -> Result<Option<String>, NodeFailure> {
    advised(node, Advisory::RunId, |advice| match advice {
        Advice::RunId(id) => Ok(id),
        other => Err(other),
    })
    .await
}

/// Sets `claim.key` to `claim.value` for `claim.ttl_ms` if it does not exist, refreshes its
/// TTL if it holds that value, and answers with the value stored (ours or another): one
/// atomic script (`scripts/claim.lua`).
pub(crate) async fn claim(node: &dyn Node, claim: Claim) -> Result<String, NodeFailure> {
    advised(node, Advisory::Claim(claim), |advice| match advice {
        Advice::Claimed(value) => Ok(value),
        other => Err(other),
    })
    .await
}

/// Reads a read-write lock's keys (writer, readers, waiting mark) in one atomic script
/// (`scripts/rwlock_inspect.lua`), writing nothing.
pub(crate) async fn rw_inspect(node: &dyn Node, keys: Arc<[String]>) -> Result<RwRow, NodeFailure> {
    advised(node, Advisory::RwInspect { keys }, |advice| match advice {
        Advice::RwKeys(row) => Ok(row),
        other => Err(other),
    })
    .await
}

/// A read-write lock as a node holds it: the writer's token (if any) and its `PTTL`, the
/// live readers' tokens with the milliseconds each has left, the waiting writer's id (if any)
/// and its `PTTL`.
pub(crate) type RwRow = (Option<String>, i64, Vec<(String, i64)>, Option<String>, i64);

/// One key as a node holds it: its `TYPE` (`none` when absent), its value when it is a
/// string, and its `PTTL` in milliseconds (-2: no key, -1: no expiry).
pub(crate) type KeyRow = (String, Option<Vec<u8>>, i64);

/// Reads (and with `delete`, deletes) `keys` on `conn`, as [`inspect`].
async fn read_keys<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &[String],
    delete: bool,
) -> Result<Vec<KeyRow>, redis::RedisError> {
    let mut invocation = INSPECT.prepare_invoke();
    invocation.key(keys);
    if delete {
        invocation.arg(RELEASE);
    }
    invocation.invoke_async(conn).await
}

/// The server's `maxmemory-policy`, as [`eviction_policy`].
async fn read_policy<C: ConnectionLike + Send>(conn: &mut C) -> Result<String, NodeFailure> {
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
pub(crate) fn policy_of(info: String) -> Result<String, NodeFailure> {
    info.lines()
        .find_map(|line| line.strip_prefix("maxmemory_policy:"))
        .map(|policy| policy.trim().to_owned())
        .ok_or_else(|| {
            NodeFailure::UnexpectedReply("INFO memory has no maxmemory_policy field".to_owned())
        })
}

/// The server's `run_id` (`INFO server`), as [`run_id`].
async fn read_run_id<C: ConnectionLike + Send>(
    conn: &mut C,
) -> Result<Option<String>, redis::RedisError> {
    let info: String = redis::cmd("INFO").arg("server").query_async(conn).await?;
    Ok(info
        .lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(|id| id.trim().to_owned()))
}

/// Writes `write.key` if `write.lock_key` still holds our token, as
/// [`write_if_held`].
async fn guarded_write<C: ConnectionLike + Send>(
    conn: &mut C,
    write: &GuardedWrite,
) -> Result<bool, redis::RedisError> {
    let written: i64 = WRITE_IF_HELD
        .key(&*write.lock_key)
        .key(&*write.key)
        .arg(&*write.token)
        .arg(write.value.as_deref().unwrap_or(""))
        .arg(write.ttl_ms)
        .invoke_async(conn)
        .await?;
    Ok(written == 1)
}

/// Claims `claim.key` for `claim.value` (set if absent, refreshed if equal), as
/// [`claim`]; the value stored.
async fn claim_value<C: ConnectionLike + Send>(
    conn: &mut C,
    claim: &Claim,
) -> Result<String, redis::RedisError> {
    CLAIM
        .key(&*claim.key)
        .arg(&*claim.value)
        .arg(claim.ttl_ms)
        .invoke_async(conn)
        .await
}

/// Reads a read-write lock's keys, as [`rw_inspect`].
async fn read_rw<C: ConnectionLike + Send>(
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
) -> Result<Advice, NodeFailure> {
    Ok(match advisory {
        Advisory::Inspect { keys, delete } => Advice::Keys(read_keys(conn, keys, *delete).await?),
        Advisory::WriteIfHeld(write) => Advice::Written(guarded_write(conn, write).await?),
        Advisory::EvictionPolicy => Advice::EvictionPolicy(read_policy(conn).await?),
        Advisory::RunId => Advice::RunId(read_run_id(conn).await?),
        Advisory::Claim(request) => Advice::Claimed(claim_value(conn, request).await?),
        Advisory::RwInspect { keys } => Advice::RwKeys(read_rw(conn, keys).await?),
    })
}
