//! `RedisCounter`: fencing tokens from one designated Redis primary.

use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use futures::future::BoxFuture;
use redis::{Client, Script};

use super::batch::{Batcher, IssueBatch};
use super::redis_stripes::StripedKeys;
use super::{FencingCounter, Stripes};
use crate::address;
use crate::connection::{ServerConnection, Source, Tls, connect};
use crate::error::{BoxError, ConfigError};

/// For each request of a batch in turn: reads every counter key of it, takes the largest
/// value plus one (`INCR` for a single key) and stores it in every key; all atomically.
static NEXT_FENCES: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("next_fences.lua")));

/// Default [`RedisCounter::prefix`]: `"fence:"`.
pub(crate) const DEFAULT_REDIS_FENCE_PREFIX: &str = "fence:";

/// Default [`RedisCounter::timeout`]: 1 s.
pub(crate) const DEFAULT_REDIS_FENCE_TIMEOUT: Duration = Duration::from_secs(1);

/// Fencing tokens kept in **one designated Redis primary** (not the lock nodes' majority:
/// a counter cannot be split across independent masters).
///
/// Each resource has one counter key, `{prefix}{{resource}}`, e.g. `fence:{invoice:4821}` with
/// the default prefix: the hash tag keeps a resource's key in one slot. For each request, a
/// Lua script (`EVALSHA`) reads the keys of every resource of the lock, takes the largest
/// value plus one, stores it in all of them and returns it, atomically; for a single
/// resource that is `INCR`. A resource's tokens can skip numbers (after a multi-resource
/// lock, every resource in it jumps to the largest value plus one); only their order matters.
///
/// Or, [`striped`](Self::striped), S stripe keys, each shared by the resources that map to
/// it: one script call reads and writes at most S keys and issues a range of tokens per
/// stripe, whatever the number of resources.
///
/// Requests are **batched** like `PostgresCounter`'s (crate `redfence-postgres`): one script
/// call at a time, and requests that arrive while it is in flight go together in the next
/// call (up to 256), handled in arrival order inside the one atomic script. A request that
/// finds nothing in flight goes out at once. A call that fails or takes longer than
/// [`timeout`](Self::timeout) fails every request in it (each lock fails closed); one that
/// may have run only leaves gaps. A request whose caller gave up is skipped, or its token
/// simply never used. Since one call carries the keys of several requests, all counter keys
/// must live on one server (not a Redis Cluster).
///
/// The connection is made lazily on the first call (inside the caller's Tokio runtime),
/// shared by every call, and re-established after a failure; every request, waiting for
/// its batch and connecting included, is bounded by [`timeout`](Self::timeout). The
/// background task that sends the batches ends when the counter is dropped.
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
/// (e.g. `PostgresCounter`, crate `redfence-postgres`), ideally the same database the work
/// writes to.
///
/// All keys must be on one server: on a Redis Cluster the keys of a batch live in different
/// slots and the script fails with `CROSSSLOT` (the locks then fail closed).
///
/// ```no_run
/// use redfence::{RedisCounter, Redlock};
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
    client: Client,
    timeout: Duration,
    batcher: Batcher<RedisIssuer>,
}

/// What the batch task needs: the connection, the key prefix, and the stripes if striped.
struct RedisIssuer {
    conn: ServerConnection,
    prefix: String,
    striped: Option<StripedKeys>,
}

impl RedisCounter {
    /// A counter on the Redis server `client` points at, with the default prefix and
    /// timeout. Connects on first use.
    pub fn new(client: Client) -> Self {
        Self::build(
            client,
            DEFAULT_REDIS_FENCE_PREFIX.to_owned(),
            DEFAULT_REDIS_FENCE_TIMEOUT,
            None,
        )
    }

    fn build(client: Client, prefix: String, timeout: Duration, stripes: Option<Stripes>) -> Self {
        let issuer = RedisIssuer {
            conn: ServerConnection::new(Source::Direct(client.clone().into()), timeout),
            striped: stripes.map(|stripes| StripedKeys::new(&prefix, stripes)),
            prefix,
        };
        RedisCounter {
            client,
            timeout,
            batcher: Batcher::new(issuer, "Redis fencing counter", timeout),
        }
    }

    /// A counter on the Redis server at `url` (`redis://host:port/db`,
    /// `redis://user:password@host`, or `rediss://…` for TLS with the system's trust store,
    /// which needs the feature `tls-rustls` or `tls-native-tls`). Connects on first use.
    ///
    /// # Errors
    ///
    /// [`ConfigError::BadCounterUrl`]: the URL does not parse, or asks for TLS in a build
    /// without a TLS feature.
    pub fn open(url: &str) -> Result<Self, ConfigError> {
        Self::opened(url, None)
    }

    /// A counter on the `rediss://` server at `url`, with these [`Tls`] settings (a custom
    /// CA, a client certificate). Connects on first use.
    ///
    /// # Errors
    ///
    /// [`ConfigError::BadCounterUrl`]: the URL does not parse or is not `rediss://`, a
    /// certificate or key does not parse, or redfence was built without a TLS feature.
    pub fn open_with_tls(url: &str, tls: &Tls) -> Result<Self, ConfigError> {
        Self::opened(url, Some(tls))
    }

    /// [`open`](Self::open) and [`open_with_tls`](Self::open_with_tls).
    fn opened(url: &str, tls: Option<&Tls>) -> Result<Self, ConfigError> {
        match connect::open(url, tls) {
            Ok(client) => Ok(Self::new(client)),
            Err(unusable) => Err(ConfigError::BadCounterUrl {
                url: address::redact_url(url),
                reason: unusable.to_string(),
            }),
        }
    }

    /// The prefix of every counter key: the key of a resource is `{prefix}{{resource}}`.
    /// Defaults to `"fence:"`.
    #[must_use]
    pub fn prefix(self, prefix: impl Into<String>) -> Self {
        let stripes = self.stripes();
        Self::build(self.client, prefix.into(), self.timeout, stripes)
    }

    /// Issues tokens from `stripes` counter keys instead of one key per resource: a
    /// resource's tokens come from stripe [`Stripes::of`]`(resource)`, and one script call
    /// issues a **range** per stripe, however many locks of the batch share it (a lock over
    /// resources on several stripes gets one token above all of them, and raises each of
    /// them to it). At most `stripes` keys read and written per batch, not one per resource
    /// (measured on the project's 2-core machine, no faster at 64-way: see BENCHMARKS.md). Tokens still increase for each resource; they grow
    /// faster, shared by the resources of a stripe. Off by default (one key per resource).
    ///
    /// Keys: `{prefix}#stripes` holds the count, `{prefix}#stripe:{i}` stripe `i`. On first
    /// use the counter makes them, each starting at the largest per-resource token found under
    /// the prefix (a `SCAN` of `{prefix}{*}`), so that no resource fenced before goes back;
    /// a counter with another count is refused.
    ///
    /// **Switch every client of the prefix at once: stop those of the per-resource mode
    /// first.** A per-resource client does not read the stripes (and cannot be made to
    /// refuse them): beside a striped one, it issues tokens unrelated to the stripes', and a
    /// stale owner's write gets through. If the server loses the marker (a flush, a restart
    /// without persistence), the stripes are made again from what is left, as a
    /// per-resource counter would start again from what is left.
    #[must_use]
    pub fn striped(self, stripes: Stripes) -> Self {
        let prefix = self.batcher.issuer().prefix.clone();
        Self::build(self.client, prefix, self.timeout, Some(stripes))
    }

    /// The stripes, if the counter is [`striped`](Self::striped).
    pub fn stripes(&self) -> Option<Stripes> {
        self.batcher
            .issuer()
            .striped
            .as_ref()
            .map(|keys| keys.stripes)
    }

    /// The longest one request may take, waiting for its batch and connecting included; a
    /// slower one fails (the lock is then released: fail closed). Also bounds each batch: a
    /// slower batch fails every request in it. Defaults to 1 s. The lock manager also bounds
    /// each request with its `fencing_timeout` and the lock's validity.
    #[must_use]
    pub fn timeout(self, timeout: Duration) -> Self {
        let prefix = self.batcher.issuer().prefix.clone();
        let stripes = self.stripes();
        Self::build(self.client, prefix, timeout, stripes)
    }

    /// The per-resource counter key of `resource`: `{prefix}{{resource}}` (a
    /// [`striped`](Self::striped) counter keeps its tokens in its stripes instead).
    pub fn key(&self, resource: &str) -> String {
        self.batcher.issuer().key(resource)
    }

    async fn next(&self, resources: &[String]) -> Result<u64, BoxError> {
        let mut names: Vec<String> = resources.to_vec();
        names.sort_unstable();
        names.dedup();
        if names.is_empty() {
            return Err("the Redis fencing counter was given no resource".into());
        }
        match tokio::time::timeout(self.timeout, self.batcher.request(names)).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "Redis fencing counter at {} timed out after {:?}",
                self.batcher.issuer().conn.addr(),
                self.timeout
            )
            .into()),
        }
    }
}

impl RedisIssuer {
    fn key(&self, resource: &str) -> String {
        format!("{}{{{}}}", self.prefix, resource)
    }

    async fn issue_batch(&self, requests: &[&[String]]) -> Result<Vec<u64>, BoxError> {
        let addr = || self.conn.addr();
        let mut conn = self
            .conn
            .connection()
            .await
            .map_err(|err| format!("Redis fencing counter at {}: {err}", addr()))?;
        let replies: Vec<i64> = match &self.striped {
            Some(keys) => keys
                .issue(&mut conn, requests)
                .await
                .map_err(|err| format!("Redis fencing counter at {}: {err}", addr()))?,
            None => self.per_resource(&mut conn, requests).await?,
        };
        replies
            .into_iter()
            .map(|reply| match u64::try_from(reply) {
                Ok(fence) if fence > 0 => Ok(fence),
                _ => Err(format!(
                    "Redis fencing counter at {} returned {reply}, not a positive token \
                     (a counter key was overwritten)",
                    addr()
                )
                .into()),
            })
            .collect()
    }

    /// One key per resource: `next_fences.lua`.
    async fn per_resource<C: redis::aio::ConnectionLike + Send>(
        &self,
        conn: &mut C,
        requests: &[&[String]],
    ) -> Result<Vec<i64>, BoxError> {
        let mut invocation = NEXT_FENCES.prepare_invoke();
        for names in requests {
            for name in names.iter() {
                invocation.key(self.key(name));
            }
            invocation.arg(names.len());
        }
        // EVALSHA; on NOSCRIPT (a restarted or flushed server) the script is loaded and the
        // call repeated.
        Ok(invocation
            .invoke_async(conn)
            .await
            .map_err(|err| format!("Redis fencing counter at {}: {err}", self.conn.addr()))?)
    }
}

impl IssueBatch for RedisIssuer {
    fn issue<'a>(
        &'a self,
        requests: &'a [&'a [String]],
    ) -> BoxFuture<'a, Result<Vec<u64>, BoxError>> {
        Box::pin(self.issue_batch(requests))
    }

    /// The connection manager reconnects by itself.
    fn reset(&self) {}
}

impl FencingCounter for RedisCounter {
    fn next_fence<'a>(&'a self, resources: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>> {
        Box::pin(self.next(resources))
    }
}

impl fmt::Debug for RedisCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let issuer = self.batcher.issuer();
        f.debug_struct("RedisCounter")
            .field("addr", &issuer.conn.addr())
            .field("prefix", &issuer.prefix)
            .field("stripes", &self.stripes().map(Stripes::count))
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_hash_tagged() -> Result<(), ConfigError> {
        let c = RedisCounter::open("redis://127.0.0.1:1")?;
        assert_eq!(c.key("invoice:4821"), "fence:{invoice:4821}");
        let c = c.prefix("app:fence:");
        assert_eq!(c.key("a"), "app:fence:{a}");
        Ok(())
    }
}
