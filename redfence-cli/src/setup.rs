//! From the command line's options to a `Redlock`.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use redfence::{Error, InvalidInput, RedisCounter, Redlock, RedlockBuilder, Semaphore};
use redfence_postgres::PostgresCounter;

use crate::args::Common;
use crate::exit::{self, Failure};

/// A builder over the nodes and options every command takes; checks the node list.
pub fn builder(common: &Common) -> Result<RedlockBuilder, Failure> {
    let nodes = node_urls(common)?;
    let builder = Redlock::builder()
        .nodes(nodes.iter().map(|url| url.trim()))
        .key_prefix(common.key_prefix.clone())
        .node_timeout(common.node_timeout)
        .lock_delay(common.lock_delay);
    Ok(match common.restart_quarantine {
        Some(period) => builder.restart_quarantine(period),
        None => builder,
    })
}

/// The node URLs: `--nodes` (or `REDFENCE_NODES`), or the lines of `--nodes-file` (or
/// `REDFENCE_NODES_FILE`); not both, since two runs given different node sets would not
/// exclude each other.
fn node_urls(common: &Common) -> Result<Vec<String>, Failure> {
    match (&common.nodes_file, common.nodes.is_empty()) {
        (Some(_), false) => Err(Failure::usage(
            "both --nodes (or REDFENCE_NODES) and --nodes-file (or REDFENCE_NODES_FILE) are \
             given: give the nodes one way",
        )),
        (Some(path), true) => nodes_file(path),
        (None, false) => Ok(common.nodes.clone()),
        (None, true) => Err(Failure::usage(
            "no Redis nodes: give --nodes redis://host:port,..., set REDFENCE_NODES, or give \
             --nodes-file PATH",
        )),
    }
}

/// The node URLs in the file at `path`: one per line, blank lines and `#` comments skipped.
/// Refused when the file may be read by anyone but its owner (group or others have a
/// permission bit: the mode must be 0600 or stricter), as ssh refuses a private key: its URLs
/// hold passwords. The mode is read from the file opened, not from the path.
fn nodes_file(path: &Path) -> Result<Vec<String>, Failure> {
    let shown = path.display();
    let failed = |err: std::io::Error| Failure::usage(format!("--nodes-file {shown}: {err}"));
    let mut file = File::open(path).map_err(failed)?;
    let mode = file.metadata().map_err(failed)?.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(Failure::usage(format!(
            "--nodes-file {shown}: may be read by others than its owner (mode {:04o}), and it \
             holds the nodes' passwords: make it 0600 or stricter (chmod 600 {shown})",
            mode & 0o7777
        )));
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(failed)?;
    let mut urls = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // A URL has no blank in it: anything after one must be a comment.
        let mut words = line.split_whitespace();
        if let (Some(url), rest) = (words.next(), words.next()) {
            if rest.is_some_and(|word| !word.starts_with('#')) {
                return Err(Failure::usage(format!(
                    "--nodes-file {shown}, line {}: one URL per line (a comment starts with #)",
                    number + 1
                )));
            }
            urls.push(url.to_owned());
        }
    }
    if urls.is_empty() {
        return Err(Failure::usage(format!(
            "--nodes-file {shown}: no Redis nodes in it (one URL per line)"
        )));
    }
    Ok(urls)
}

/// The semaphore `name` of `permits` permits (`run -n`, `status -n`): a name too long for
/// its slots' names is a usage error that says how long it may be.
pub fn semaphore(redlock: &Redlock, name: &str, permits: u32) -> Result<Semaphore, Failure> {
    redlock.semaphore(name, permits).map_err(|error| match &error {
        Error::InvalidInput(InvalidInput::ResourceTooLong { max, .. }) => {
            // The longest slot name, that of the last slot, is the one checked.
            let suffix = format!(":semaphore:slot:{}", permits.saturating_sub(1)).len();
            Failure::usage(format!(
                "the semaphore's name is {} bytes long: its slots' names, <name>{}, may have at \
                 most {max} bytes, so with {permits} permits its name may have at most {}",
                name.len(),
                ":semaphore:slot:<i>",
                max.saturating_sub(suffix)
            ))
        }
        _ => Failure::from_lock_error(&error, exit::BUSY),
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
