//! What went wrong on one node.

use std::error::Error as _;
use std::fmt;
use std::time::Duration;

/// What went wrong on one node.
///
/// Its message carries the whole story ("node #2 (10.0.0.3:6379/0): unreachable: connection
/// refused"), because several of them are listed in one
/// [`QuorumUnreachable`](crate::Error::QuorumUnreachable); so it reports no `source()`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeError {
    /// The node's position in the order the builder was given.
    pub index: usize,
    /// The node's address, without credentials.
    pub addr: String,
    /// What happened.
    pub failure: NodeFailure,
}

/// The kind of failure a single node had.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NodeFailure {
    /// The node did not answer within `node_timeout`.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The node could not be reached (refused, reset, not connected yet, a TLS handshake
    /// failed: e.g. its certificate is not trusted).
    #[error("unreachable")]
    Connection(#[source] redis::RedisError),
    /// This client could not keep up: the node's request queue was full, so the request was
    /// never sent. A sign of overload on the client's side, not of a failed node.
    #[error("overloaded: {queued} requests were already waiting for this node")]
    Overloaded {
        /// How many requests were waiting.
        queued: usize,
    },
    /// The node answered with an error, e.g. `WRONGTYPE` when a key holds a hash, or
    /// `WRONGPASS` when the password is wrong.
    #[error("error reply")]
    Reply(#[source] redis::RedisError),
    /// The node's ACL refused a command or key (`NOPERM`): the user lacks a permission
    /// redfence needs. The server's message names it (e.g. `'evalsha' command`); the repository's
    /// docs/production.md gives the ACL line that grants what redfence needs.
    #[error("permission denied by the node's ACL")]
    Permission(#[source] redis::RedisError),
    /// The node lost some of its memory recently (a restart, a flush, a failover, evicted keys,
    /// a step of its clock: see
    /// [`restart_quarantine`](crate::RedlockBuilder::restart_quarantine)): it may have
    /// forgotten locks it granted, so its grant (or its confirmation of an extension) does not
    /// count toward a majority until `remaining` has passed. Its key was still written (and
    /// released if the round failed).
    #[error(
        "may have forgotten locks it granted (restarted, flushed or evicted recently): quarantined for another {remaining:?}"
    )]
    Quarantined {
        /// How long the quarantine still lasts.
        remaining: Duration,
    },
}

impl From<redis::RedisError> for NodeFailure {
    fn from(err: redis::RedisError) -> Self {
        // `Client`: failed before any command, e.g. a native-tls handshake (untrusted server).
        if err.is_io_error()
            || err.is_connection_refusal()
            || err.is_connection_dropped()
            || err.kind() == redis::ErrorKind::Client
        {
            NodeFailure::Connection(err)
        } else if err.code() == Some("NOPERM") {
            NodeFailure::Permission(err)
        } else {
            NodeFailure::Reply(err)
        }
    }
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node #{} ({}): {}", self.index, self.addr, self.failure)?;
        let mut cause = self.failure.source();
        while let Some(err) = cause {
            write!(f, ": {err}")?;
            cause = err.source();
        }
        Ok(())
    }
}

impl std::error::Error for NodeError {}
