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
