//! Bad arguments: [`ConfigError`] from `build()`, [`InvalidInput`] from a call.

use std::time::Duration;

/// Why `RedlockBuilder::build` rejected the configuration, or `RedisCounter::open` its URL.
/// Nothing was connected.
///
/// Converts into [`Error::Config`](crate::Error::Config), so `?` works in a function that
/// returns `redfence::Error`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The builder was given no node.
    #[error("no Redis nodes were configured; give at least one with `node()` or `nodes()`")]
    NoNodes,
    /// A node's URL could not be parsed.
    #[error("node #{index} URL {url:?} is not a valid Redis URL: {reason}")]
    BadNodeUrl {
        /// The node's position in the order given.
        index: usize,
        /// The URL as given, its password redacted.
        url: String,
        /// What the parser said.
        reason: String,
    },
    /// A node's TLS settings cannot work: TLS settings on a `redis://` URL, a certificate or
    /// key that does not parse, or no TLS feature enabled.
    #[error("node #{index} ({addr}): bad TLS settings: {reason}")]
    BadTls {
        /// The node's position in the order given.
        index: usize,
        /// The node's address, without credentials.
        addr: String,
        /// What is wrong.
        reason: String,
    },
    /// A [`RedisCounter`](crate::RedisCounter)'s URL or TLS settings cannot work: the URL does
    /// not parse, TLS settings on a `redis://` URL, a certificate or key that does not parse,
    /// or `rediss://` without a TLS feature.
    #[error("fencing counter URL {url:?} cannot be used: {reason}")]
    BadCounterUrl {
        /// The URL as given, its password redacted.
        url: String,
        /// What is wrong.
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
    /// Fair mode was asked for over a voter that cannot run the fair queue (a Redis Cluster:
    /// a key's queue lies in another hash slot).
    #[error(
        "node #{index} ({addr}) cannot run the fair queue: fair mode needs single-server nodes (not Redis Cluster voters)"
    )]
    FairQueueUnsupported {
        /// The node's position in the order given.
        index: usize,
        /// The node's address, without credentials.
        addr: String,
    },
    /// The drift factor is NaN, infinite, negative or not below 1.
    #[error("drift factor {0} must be a finite number in [0, 1)")]
    BadDriftFactor(f64),
    /// An election's timing breaks client-go's rule `lease > renew_deadline > 1.2 ×
    /// retry_period > 0`, or leaves the renew deadline beyond the lease's validity (the lease
    /// minus its clock-drift allowance), so that leadership could end before the leader knew.
    #[error(
        "election timing must satisfy lease > renew_deadline > 1.2 x retry_period > 0, with renew_deadline within the lease's validity: lease {lease:?}, renew_deadline {renew_deadline:?}, retry_period {retry_period:?}"
    )]
    ElectionTiming {
        /// The lease given.
        lease: Duration,
        /// The renew deadline given.
        renew_deadline: Duration,
        /// The retry period given.
        retry_period: Duration,
    },
    /// An election was built on a `Redlock` without a fencing counter: its terms are the
    /// counter's tokens.
    #[error(
        "an election needs a fencing counter (its terms are fencing tokens); configure one with `RedlockBuilder::fencing`"
    )]
    ElectionWithoutFencing,
    /// Another option had a value that cannot work.
    #[error("option `{option}`: {reason}")]
    BadOption {
        /// The builder method's name.
        option: &'static str,
        /// What is wrong with the value.
        reason: String,
    },
}

/// Why a call's arguments were rejected. Returned before any network traffic; nothing is
/// locked.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// No resource was given.
    #[error("no resources were given; a lock needs at least one")]
    NoResources,
    /// A resource name was empty.
    #[error("resource #{index} is an empty string")]
    EmptyResource {
        /// Its position in the slice given.
        index: usize,
    },
    /// A resource name is longer than [`MAX_RESOURCE_LEN`](crate::MAX_RESOURCE_LEN) bytes.
    #[error("resource #{index} is {len} bytes long; a resource name may have at most {max}")]
    ResourceTooLong {
        /// Its position in the slice given.
        index: usize,
        /// Its length in bytes.
        len: usize,
        /// The limit, [`MAX_RESOURCE_LEN`](crate::MAX_RESOURCE_LEN).
        max: usize,
    },
    /// The resource names of one lock are longer than
    /// [`MAX_RESOURCE_BYTES`](crate::MAX_RESOURCE_BYTES) bytes together.
    #[error(
        "the resource names up to #{index} are over {max} bytes together; one lock's names may have at most {max}"
    )]
    ResourcesTooLarge {
        /// The position of the name that went past the limit.
        index: usize,
        /// The limit, [`MAX_RESOURCE_BYTES`](crate::MAX_RESOURCE_BYTES).
        max: usize,
    },
    /// A resource's key ends the way redfence's own keys beside every lock do
    /// (`:redfence:waiting`, `:redfence:queue`, `:redfence:alive`), or its name is a voter's
    /// memory marker (`redfence:memory`) or roster key (`redfence:roster:…`): such a lock
    /// could be overwritten or deleted by the waiters and releases of the lock it sits
    /// beside, or break the restart quarantine.
    #[error(
        "resource #{index} ({resource:?}) has a key marked {suffix:?}, which redfence keeps for its own keys (beside every lock, and the restart quarantine's memory)"
    )]
    ReservedName {
        /// Its position in the slice given.
        index: usize,
        /// The name as given.
        resource: String,
        /// The reserved part its key has.
        suffix: &'static str,
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
    /// A voter that is a whole Redis Cluster must keep all of a lock's keys in one hash slot
    /// (one script runs them atomically), and two of these resources hash to different slots.
    /// Give the resources a common `{hash tag}`: `{order:42}:payment` and
    /// `{order:42}:invoice` share the slot of `order:42`.
    #[error(
        "node #{node} ({addr}) is a Redis Cluster and resources #{first} and #{second} are in different hash slots; give them a common {{hash tag}}, e.g. \"{{order:42}}:payment\" and \"{{order:42}}:invoice\""
    )]
    KeysAcrossSlots {
        /// The cluster voter's position in the order given.
        node: usize,
        /// Its address (a seed), without credentials.
        addr: String,
        /// The position of the first resource.
        first: usize,
        /// The position of a resource in another slot.
        second: usize,
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
    /// A semaphore was asked for with zero permits: nobody could ever hold it.
    #[error("a semaphore needs at least one permit; 0 were asked for")]
    ZeroPermits,
    /// A semaphore was asked for with more permits than
    /// [`MAX_PERMITS`](crate::MAX_PERMITS): each permit is a slot that an acquisition may
    /// try in turn, one round per slot.
    #[error("a semaphore may have at most {max} permits; {permits} were asked for")]
    TooManyPermits {
        /// How many were asked for.
        permits: u32,
        /// The limit, [`MAX_PERMITS`](crate::MAX_PERMITS).
        max: u32,
    },
}
