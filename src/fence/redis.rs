//! `RedisCounter`: fencing tokens from one designated Redis primary.

use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use futures::future::BoxFuture;
use redis::{Client, Script};

use super::FencingCounter;
use crate::error::BoxError;
use crate::node::{LazyConnection, Tls, connect};

/// Reads every counter key, takes the largest value plus one (`INCR` for a single key) and
/// stores it in every key, atomically.
static NEXT_FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("next_fence.lua")));

/// Default [`RedisCounter::prefix`]: `"fence:"`.
pub const DEFAULT_REDIS_FENCE_PREFIX: &str = "fence:";

/// Default [`RedisCounter::timeout`]: 1 s.
pub const DEFAULT_REDIS_FENCE_TIMEOUT: Duration = Duration::from_secs(1);

/// Fencing tokens kept in **one designated Redis primary** (not the lock nodes' majority:
/// a counter cannot be split across independent masters).
///
/// Each resource has one counter key, `{prefix}{{resource}}`, e.g. `fence:{invoice:4821}` with
/// the default prefix: the hash tag keeps a resource's key in one slot. One Lua script
/// (`EVALSHA`) reads the keys of every resource of the lock, takes the largest value plus
/// one, stores it in all of them and returns it, atomically; for a single resource that is
/// `INCR`. A resource's tokens can skip numbers (after a multi-resource lock, every resource
/// in it jumps to the largest value plus one); only their order matters.
///
/// The connection is made lazily on the first call (inside the caller's Tokio runtime),
/// shared by every call, and re-established after a failure; every call, connecting
/// included, is bounded by [`timeout`](Self::timeout).
///
/// # Failure model: read before you rely on it
///
/// The tokens are monotonic **only as long as that primary never loses an acknowledged
/// write**. Each of these breaks it, and the counter may then issue a token again, or a
/// smaller one, which lets a stale owner's write through:
///
/// - a restart without persistence, or with `appendfsync everysec` (the default for AOF,
///   up to a second of writes lost) or RDB snapshots only;
/// - a failover to a replica: replication is asynchronous, and the last increments may
///   not have reached it;
/// - a restore from an older snapshot or backup.
///
/// `appendonly yes` with `appendfsync always` makes a single primary's counter survive a
/// crash. Sending `WAIT numreplicas timeout` after each increment
/// narrows, but does not close, the failover window (a replica that acknowledged can still
/// lose the election, and `WAIT` does not make Redis strongly consistent). When a
/// regression is unacceptable, use a counter in a database with durable, consistent commits
/// (e.g. `PostgresCounter`, feature `postgres`), ideally the same database the work writes to.
///
/// Multi-resource locks need all keys on one server: on a Redis Cluster their keys live in
/// different slots and the script fails with `CROSSSLOT` (the lock then fails closed).
///
/// ```no_run
/// use redfence::{Redlock, fence::RedisCounter};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let counter = RedisCounter::open("redis://10.0.0.9:6379")?; // one primary, with AOF
/// let redlock = Redlock::builder()
///     .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
///     .fencing(counter)
///     .build()?;
/// # drop(redlock);
/// # Ok(())
/// # }
/// ```
pub struct RedisCounter {
    conn: LazyConnection,
    prefix: String,
    timeout: Duration,
}

impl RedisCounter {
    /// A counter on the Redis server `client` points at, with the default prefix and
    /// timeout. Connects on first use.
    pub fn new(client: Client) -> Self {
        RedisCounter {
            conn: LazyConnection::new(client, DEFAULT_REDIS_FENCE_TIMEOUT),
            prefix: DEFAULT_REDIS_FENCE_PREFIX.to_owned(),
            timeout: DEFAULT_REDIS_FENCE_TIMEOUT,
        }
    }

    /// A counter on the Redis server at `url` (`redis://host:port/db`,
    /// `redis://user:password@host`, or `rediss://…` for TLS with the system's trust store,
    /// which needs the feature `tls-rustls` or `tls-native-tls`). Connects on first use.
    ///
    /// # Errors
    ///
    /// The URL does not parse, or asks for TLS in a build without a TLS feature.
    pub fn open(url: &str) -> Result<Self, redis::RedisError> {
        Ok(Self::new(connect::open(url, None)?))
    }

    /// A counter on the `rediss://` server at `url`, with these [`Tls`] settings (a custom
    /// CA, a client certificate). Connects on first use.
    ///
    /// # Errors
    ///
    /// The URL does not parse or is not `rediss://`, a certificate or key does not parse, or
    /// redfence was built without a TLS feature.
    pub fn open_with_tls(url: &str, tls: &Tls) -> Result<Self, redis::RedisError> {
        Ok(Self::new(connect::open(url, Some(tls))?))
    }

    /// The prefix of every counter key: the key of a resource is `{prefix}{{resource}}`.
    /// Defaults to `"fence:"`.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest one call may take, connecting included; a slower call fails (the lock
    /// is then released: fail closed). Defaults to 1 s. The lock manager also bounds the
    /// call with its `fencing_timeout` and the lock's validity.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.conn = self.conn.with_connect_timeout(timeout);
        self
    }

    /// The counter key of `resource`: `{prefix}{{resource}}`.
    pub fn key(&self, resource: &str) -> String {
        format!("{}{{{}}}", self.prefix, resource)
    }

    async fn next(&self, resources: &[String]) -> Result<u64, BoxError> {
        if resources.is_empty() {
            return Err("the Redis fencing counter was given no resource".into());
        }
        let call = async {
            let mut conn = self.conn.connection().await?;
            let mut invocation = NEXT_FENCE.prepare_invoke();
            for resource in resources {
                invocation.key(self.key(resource));
            }
            // EVALSHA; on NOSCRIPT (a restarted or flushed server) the script is loaded and
            // the call repeated.
            invocation.invoke_async::<i64>(&mut conn).await
        };
        let reply = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(err)) => {
                return Err(format!("Redis fencing counter at {}: {err}", self.conn.addr()).into());
            }
            Err(_) => {
                return Err(format!(
                    "Redis fencing counter at {} timed out after {:?}",
                    self.conn.addr(),
                    self.timeout
                )
                .into());
            }
        };
        match u64::try_from(reply) {
            Ok(fence) if fence > 0 => Ok(fence),
            _ => Err(format!(
                "Redis fencing counter at {} returned {reply}, not a positive token (a counter key was overwritten)",
                self.conn.addr()
            )
            .into()),
        }
    }
}

impl FencingCounter for RedisCounter {
    fn next_fence<'a>(&'a self, resources: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>> {
        Box::pin(self.next(resources))
    }
}

impl fmt::Debug for RedisCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCounter")
            .field("addr", &self.conn.addr())
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_hash_tagged() -> Result<(), redis::RedisError> {
        let c = RedisCounter::open("redis://127.0.0.1:1")?;
        assert_eq!(c.key("invoice:4821"), "fence:{invoice:4821}");
        let c = c.prefix("app:fence:");
        assert_eq!(c.key("a"), "app:fence:{a}");
        Ok(())
    }
}
