//! The errors redfence returns: each variant says which step failed.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

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
    /// An argument or an option was invalid. Returned before any network traffic.
    #[error("invalid input: {0}")]
    InvalidInput(#[from] InvalidInput),

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
    #[error("fencing: {0}")]
    Fencing(#[from] FencingError),
}

impl Error {
    /// Whether another attempt could succeed: contention, unreachable nodes, or an attempt
    /// that was too slow. Invalid input, fencing failures and lost locks are final.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Contended { .. } | Error::QuorumUnreachable { .. } | Error::NoValidity { .. }
        )
    }

    /// Whether this error means the caller does not (or may no longer) own the lock.
    pub fn is_lock_lost(&self) -> bool {
        matches!(self, Error::LockLost { .. } | Error::RenewalLimit { .. })
    }
}

/// Why an argument or option was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// The builder was given no node.
    #[error("no Redis nodes were configured; give at least one with `node()` or `nodes()`")]
    NoNodes,
    /// A node's URL could not be parsed.
    #[error("node #{index} URL {url:?} is not a valid Redis URL: {reason}")]
    BadNodeUrl {
        /// The node's position in the order given.
        index: usize,
        /// The URL as given.
        url: String,
        /// What the parser said.
        reason: String,
    },
    /// Two nodes point at the same server, which would count its vote twice.
    #[error(
        "nodes #{first} and #{second} both point at {addr}; every node must be a distinct master"
    )]
    DuplicateNode {
        /// The first node's position.
        first: usize,
        /// The second node's position.
        second: usize,
        /// The address they share.
        addr: String,
    },
    /// No resource was given.
    #[error("no resources were given; a lock needs at least one")]
    NoResources,
    /// A resource name was empty.
    #[error("resource #{index} is an empty string")]
    EmptyResource {
        /// Its position in the slice given.
        index: usize,
    },
    /// The same resource was given twice.
    #[error("resource {resource:?} is given more than once")]
    DuplicateResource {
        /// The repeated name.
        resource: String,
    },
    /// More resources were given than one lock may hold.
    #[error("{given} resources were given; one lock may hold at most {max}")]
    TooManyResources {
        /// How many were given.
        given: usize,
        /// The limit, [`MAX_RESOURCES`](crate::MAX_RESOURCES).
        max: usize,
    },
    /// The configured fencing counter cannot issue a token for this resource name (e.g.
    /// PostgreSQL `text` cannot hold a NUL byte).
    #[error("resource #{index} cannot be fenced by the configured counter: {reason}")]
    ResourceNotFenceable {
        /// Its position in the slice given.
        index: usize,
        /// What the counter said.
        reason: String,
    },
    /// The TTL is shorter than one millisecond, the resolution Redis expires keys at.
    #[error("ttl {ttl:?} is shorter than 1 ms")]
    ZeroTtl {
        /// The TTL given.
        ttl: Duration,
    },
    /// The TTL does not exceed the clock-drift allowance, so no lock could ever be valid.
    #[error(
        "ttl {ttl:?} does not exceed its clock-drift allowance {drift:?} (ttl * drift_factor + 2 ms)"
    )]
    TtlTooShort {
        /// The TTL given.
        ttl: Duration,
        /// The drift allowance it must exceed.
        drift: Duration,
    },
    /// The TTL is larger than Redis accepts for an expiry.
    #[error("ttl {ttl:?} exceeds the largest expiry redfence sends to Redis ({max:?})")]
    TtlTooLong {
        /// The TTL given.
        ttl: Duration,
        /// The largest accepted TTL.
        max: Duration,
    },
    /// The TTL given to `using()` leaves no validity above the automatic-extension threshold
    /// once the drift allowance is subtracted, so the lock could never be kept above it.
    #[error(
        "ttl {ttl:?} must exceed the automatic extension threshold {threshold:?} plus its clock-drift allowance {drift:?}"
    )]
    TtlNotAboveThreshold {
        /// The TTL given.
        ttl: Duration,
        /// The builder's `automatic_extension_threshold`.
        threshold: Duration,
        /// The TTL's drift allowance, `ttl * drift_factor + 2 ms`.
        drift: Duration,
    },
    /// The TTL given to `using()` is longer than the builder's `max_hold`: the first lease
    /// alone would outlive the bound.
    #[error(
        "ttl {ttl:?} is longer than max_hold {max_hold:?}; a using() lock never lives past max_hold"
    )]
    TtlAboveMaxHold {
        /// The TTL given.
        ttl: Duration,
        /// The builder's `max_hold`.
        max_hold: Duration,
    },
    /// The drift factor is NaN, infinite, negative or not below 1.
    #[error("drift factor {0} must be a finite number in [0, 1)")]
    BadDriftFactor(f64),
    /// Another option had a value that cannot work.
    #[error("option `{option}`: {reason}")]
    BadOption {
        /// The builder method's name.
        option: &'static str,
        /// What is wrong with the value.
        reason: String,
    },
}

/// What went wrong on one node.
#[derive(Debug, Clone, thiserror::Error)]
#[error("node #{index} ({addr}): {failure}")]
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
    /// The node could not be reached (refused, reset, not connected yet).
    #[error("unreachable: {0}")]
    Connection(redis::RedisError),
    /// The node answered with an error, e.g. `WRONGTYPE` when a key holds a hash.
    #[error("error reply: {0}")]
    Reply(redis::RedisError),
}

impl From<redis::RedisError> for NodeFailure {
    fn from(err: redis::RedisError) -> Self {
        if err.is_io_error() || err.is_connection_refusal() || err.is_connection_dropped() {
            NodeFailure::Connection(err)
        } else {
            NodeFailure::Reply(err)
        }
    }
}

/// Why ownership of a lock is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// The lock's validity ran out on the local monotonic clock.
    Expired,
    /// A majority of nodes answered that the keys no longer hold our token.
    NotHeld {
        /// How many nodes still confirmed our token.
        confirmed: usize,
        /// The size of a majority.
        quorum: usize,
    },
    /// Extensions kept failing (nodes unreachable) until the remaining validity fell below
    /// the automatic-extension threshold, so ownership can no longer be guaranteed.
    Unconfirmed {
        /// The validity that was left when the signal aborted.
        remaining: Duration,
    },
    /// The `using()` scope ended (the routine returned, panicked or was cancelled) and the
    /// lock was given up. Seen only through a [`Signal`](crate::Signal) kept after its scope.
    Released,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::Expired => f.write_str("its validity ran out"),
            LossReason::NotHeld { confirmed, quorum } => write!(
                f,
                "only {confirmed} node(s) still hold our token, a quorum is {quorum}"
            ),
            LossReason::Unconfirmed { remaining } => write!(
                f,
                "extensions failed and only {remaining:?} of validity is left"
            ),
            LossReason::Released => f.write_str("its using() scope ended and released it"),
        }
    }
}

/// Which renewal bound of `using()` was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RenewalLimit {
    /// `max_extensions` extensions were made.
    Extensions(u32),
    /// The lock has been held for `max_hold`.
    Hold(Duration),
}

impl fmt::Display for RenewalLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RenewalLimit::Extensions(n) => write!(f, "max_extensions ({n}) reached"),
            RenewalLimit::Hold(d) => write!(f, "max_hold ({d:?}) reached"),
        }
    }
}

/// The boxed error a [`FencingCounter`](crate::FencingCounter) returns.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why no fencing token could be issued.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum FencingError {
    /// The counter returned an error.
    #[error("the fencing counter failed: {0}")]
    Counter(Arc<dyn std::error::Error + Send + Sync + 'static>),
    /// The counter did not answer in time.
    #[error("the fencing counter did not answer within {0:?}")]
    Timeout(Duration),
    /// The counter answered after the lock's validity had run out.
    #[error("the fencing counter answered after the lock's validity ran out")]
    LockExpired,
}

impl FencingError {
    /// Wraps a counter's own error.
    pub fn counter(err: impl Into<BoxError>) -> Self {
        FencingError::Counter(Arc::from(err.into()))
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
