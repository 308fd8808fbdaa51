//! From the command line's options to a `Redlock`.

use std::time::Duration;

use redfence::{RedisCounter, Redlock, RedlockBuilder};
use redfence_postgres::PostgresCounter;

use crate::args::Common;
use crate::exit::Failure;

/// A builder over the nodes and options every command takes; checks the node list.
pub fn builder(common: &Common) -> Result<RedlockBuilder, Failure> {
    if common.nodes.is_empty() {
        return Err(Failure::usage(
            "no Redis nodes: give --nodes redis://host:port,... or set REDFENCE_NODES",
        ));
    }
    let builder = Redlock::builder()
        .nodes(common.nodes.iter().map(|url| url.trim()))
        .key_prefix(common.key_prefix.clone())
        .node_timeout(common.node_timeout)
        .lock_delay(common.lock_delay);
    Ok(match common.restart_quarantine {
        Some(period) => builder.restart_quarantine(period),
        None => builder,
    })
}

/// The least time a command gives [`Redlock::close`] before it exits.
const CLOSE_WITHIN: Duration = Duration::from_secs(1);

/// Shuts `redlock` down before the process exits, on every path (done, busy, failed,
/// signalled): what redfence wrote and has not confirmed undone yet (the releases of a
/// failed attempt on nodes that timed out, of a lock dropped on an error path, calls still
/// queued for a node) goes out now, on this current-thread runtime, which runs its tasks only
/// while it is in `block_on`. Waits for it at most a second, or twice `node_timeout` when
/// that is longer: a node that stays unreachable keeps what it was sent until its TTL.
pub async fn close(redlock: &Redlock, node_timeout: Duration) {
    let within = CLOSE_WITHIN.max(node_timeout.saturating_mul(2));
    if tokio::time::timeout(within, redlock.close()).await.is_err() {
        tracing::warn!(
            "some nodes did not confirm redfence's releases within {}: a key left there \
             expires at the end of its TTL",
            humantime::format_duration(within)
        );
    }
}

/// Builds the `Redlock`: a bad URL or option is a usage error.
pub fn build(builder: RedlockBuilder) -> Result<Redlock, Failure> {
    builder
        .build()
        .map_err(|err| Failure::usage(err.to_string()))
}

/// Adds the fencing counter named by `url`: `redis://` (a `RedisCounter`) or
/// `postgres://`/`postgresql://` (a `PostgresCounter`). Nothing is connected yet.
pub fn with_fencing(
    builder: RedlockBuilder,
    url: &str,
    timeout: Duration,
) -> Result<RedlockBuilder, Failure> {
    let bad = |reason: String| Failure::usage(format!("--fencing {url:?}: {reason}"));
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    match scheme {
        Some("redis" | "rediss" | "redis+unix" | "unix") => {
            let counter = RedisCounter::open(url).map_err(|err| bad(err.to_string()))?;
            Ok(builder.fencing(counter.timeout(timeout)))
        }
        Some("postgres" | "postgresql") => {
            let counter = PostgresCounter::connect(url).map_err(|err| bad(err.to_string()))?;
            Ok(builder.fencing(counter.timeout(timeout)))
        }
        _ => Err(bad(
            "not a fencing counter URL: use redis://host:port or postgres://user@host/db".into(),
        )),
    }
}
