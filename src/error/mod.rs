//! The errors redfence returns: each variant says which step failed.
//!
//! One rule for causes: a wrapper variant is `#[error(transparent)]`, and a leaf cause is a
//! `source()`, never also part of the message, so that a report that walks the chain (`{:#}`
//! with anyhow, `tracing`'s error values) prints every cause exactly once.

mod fencing;
mod input;
mod lost;
mod node;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use fencing::{BoxError, FencingError};
pub use input::{ConfigError, InvalidInput};
pub use lost::{LossReason, RenewalLimit};
pub(crate) use node::Class;
pub use node::{NodeError, NodeFailure};

/// Everything that can go wrong when locking.
///
/// The variants tell the caller *what happened*, so that it can react:
/// [`Contended`](Error::Contended) means another owner holds the resource (try later),
/// [`QuorumUnreachable`](Error::QuorumUnreachable) means too many Redis nodes failed
/// (an infrastructure problem), [`LockLost`](Error::LockLost) means ownership is gone
/// (stop writing). The two are never confused.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A call's argument was invalid. Returned before any network traffic.
    #[error(transparent)]
    InvalidInput(#[from] InvalidInput),

    /// The builder's configuration was invalid (from [`RedlockBuilder::build`](crate::RedlockBuilder::build)).
    #[error(transparent)]
    Config(#[from] ConfigError),

    /// [`Redlock::close`](crate::Redlock::close) was called: no new lock is acquired.
    #[error("the lock manager is closed; no new locks are acquired")]
    Closed,

    /// Other owners hold enough nodes that a majority could not be reached.
    #[error(
        "resources {resources:?} are held by another owner: {denied} of {nodes} nodes refused (after {attempts} attempt(s))"
    )]
    Contended {
        /// The resources that were asked for.
        resources: Vec<String>,
        /// How many nodes answered that the resource is taken in the last attempt.
        denied: usize,
        /// How many nodes there are.
        nodes: usize,
        /// How many attempts were made in all.
        attempts: u32,
    },

    /// Too many nodes failed or timed out for a majority to be reached or ruled out.
    #[error(
        "quorum unreachable: {granted} of {nodes} nodes granted, {denied} refused, {} failed (a quorum is {quorum}){}",
        errors.len(),
        NodeErrors(errors)
    )]
    QuorumUnreachable {
        /// How many nodes granted the request.
        granted: usize,
        /// How many nodes refused it (the resource held by another owner).
        denied: usize,
        /// The size of a majority, `nodes / 2 + 1`.
        quorum: usize,
        /// How many nodes there are.
        nodes: usize,
        /// What went wrong on each node that failed.
        errors: Vec<NodeError>,
    },

    /// This client could not keep up: requests for a majority would have had to wait in
    /// queues that were full, so they were not sent. The nodes are not at fault; retry later
    /// or spread the load.
    #[error(
        "this client is overloaded: the request queues of {overloaded} of {nodes} nodes were full"
    )]
    Overloaded {
        /// On how many nodes the queue was full.
        overloaded: usize,
        /// How many nodes there are.
        nodes: usize,
    },

    /// A majority granted the lock, but so late that no validity was left once the elapsed
    /// time and the clock drift were subtracted from the TTL. Nothing was handed out.
    #[error(
        "a majority was reached after {elapsed:?}, which with a drift allowance of {drift:?} leaves no validity of the {ttl:?} TTL"
    )]
    NoValidity {
        /// The TTL asked for.
        ttl: Duration,
        /// How long the attempt took.
        elapsed: Duration,
        /// The clock-drift allowance, `ttl * drift_factor + 2 ms`.
        drift: Duration,
    },

    /// The overall `acquire_timeout` ran out before the lock could be acquired.
    #[error(
        "acquire timed out after {waited:?} and {attempts} attempt(s){}",
        Last(last)
    )]
    AcquireTimeout {
        /// How long the caller waited.
        waited: Duration,
        /// How many attempts were made.
        attempts: u32,
        /// The error of the last attempt, if any attempt finished.
        last: Option<Box<Error>>,
    },

    /// Ownership of the lock is gone (or can no longer be guaranteed): stop writing.
    #[error("lock on {resources:?} lost: {reason}")]
    LockLost {
        /// The resources of the lock.
        resources: Vec<String>,
        /// Why ownership is gone.
        reason: LossReason,
    },

    /// `using()` stopped extending the lock because a configured bound was reached.
    #[error("lock on {resources:?} reached its renewal limit: {limit}")]
    RenewalLimit {
        /// The resources of the lock.
        resources: Vec<String>,
        /// Which bound was reached.
        limit: RenewalLimit,
    },

    /// The fencing counter could not issue a token; the lock was released (fail closed).
    #[error(transparent)]
    Fencing(#[from] FencingError),

    /// A semaphore's size differs between clients: a majority of nodes store another number
    /// of permits for this name than this client was built with. Nothing was acquired. Every
    /// client of one semaphore must use the same number of permits (see
    /// [`Semaphore`](crate::Semaphore)).
    #[error(
        "semaphore {name:?} has {stored} permits on the nodes, but this client asked for {ours}; every client of a semaphore must use the same number"
    )]
    SemaphoreSize {
        /// The semaphore's name.
        name: String,
        /// The number of permits this client asked for.
        ours: u32,
        /// The number the nodes store (from the first client that set it).
        stored: String,
    },

    /// The operating system's random generator failed, so no owner token could be made (a
    /// sandbox that denies `getrandom(2)` and `/dev/urandom`). Nothing was sent.
    #[error("the operating system's random generator failed: no owner token could be made")]
    Entropy(#[source] Arc<std::io::Error>),
}

impl Error {
    /// Whether another attempt could succeed: contention, unreachable nodes, or an attempt
    /// that was too slow. Invalid input, fencing failures and lost locks are final.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Contended { .. }
                | Error::QuorumUnreachable { .. }
                | Error::NoValidity { .. }
                | Error::Overloaded { .. }
        )
    }

    /// Whether this error means the caller does not (or may no longer) own the lock.
    pub fn is_lock_lost(&self) -> bool {
        matches!(self, Error::LockLost { .. } | Error::RenewalLimit { .. })
    }

    /// A short, stable label for this kind of failure, for metrics and trace fields:
    /// `contended`, `unreachable`, `no_validity`, `timeout`, `lost`, `renewal_limit`,
    /// `fencing`, `invalid`, `config`, `closed`, `semaphore_size`, `entropy`.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Error::InvalidInput(_) => "invalid",
            Error::Config(_) => "config",
            Error::Closed => "closed",
            Error::Contended { .. } => "contended",
            Error::QuorumUnreachable { .. } => "unreachable",
            Error::Overloaded { .. } => "overloaded",
            Error::NoValidity { .. } => "no_validity",
            Error::AcquireTimeout { .. } => "timeout",
            Error::LockLost { .. } => "lost",
            Error::RenewalLimit { .. } => "renewal_limit",
            Error::Fencing(_) => "fencing",
            Error::SemaphoreSize { .. } => "semaphore_size",
            Error::Entropy(_) => "entropy",
        }
    }
}

struct NodeErrors<'a>(&'a [NodeError]);

impl fmt::Display for NodeErrors<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, err) in self.0.iter().enumerate() {
            f.write_str(if i == 0 { ": " } else { "; " })?;
            write!(f, "{err}")?;
        }
        Ok(())
    }
}

struct Last<'a>(&'a Option<Box<Error>>);

impl fmt::Display for Last<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(err) => write!(f, "; last attempt: {err}"),
            None => Ok(()),
        }
    }
}
