//! Distributed locks over several independent Redis masters (the Redlock algorithm), made
//! safe for work where a double run corrupts data: locks are granted only by a majority,
//! kept alive while the work runs, and carry **fencing tokens** that storage can check.
//!
//! ```
//! use std::time::Duration;
//! use redfence::{Error, InvalidInput, Redlock};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! // Connections are lazy: building needs no server, and a down minority is fine later.
//! let redlock = Redlock::builder()
//!     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
//!     .build()?;
//! assert_eq!(redlock.quorum(), 2);
//!
//! // Bad input is a typed error, returned before any network traffic.
//! let err = redlock.acquire(&["invoice:4821", "invoice:4821"], Duration::from_secs(5)).await;
//! assert!(matches!(err, Err(Error::InvalidInput(InvalidInput::DuplicateResource { .. }))));
//! # Ok(())
//! # }
//! ```
//!
//! With servers up (see the README's docker harness), the whole flow:
//!
//! ```no_run
//! use std::time::Duration;
//! use redfence::{MemoryCounter, Redlock};
//!
//! # async fn load_invoice(_: u32) -> Result<String, redfence::Error> { Ok(String::new()) }
//! # async fn post_to_ledger(_: &str, _: Option<u64>) -> Result<(), redfence::Error> { Ok(()) }
//! # async fn run() -> Result<(), redfence::Error> {
//! let redlock = Redlock::builder()
//!     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
//!     .fencing(MemoryCounter::new()) // use a durable counter in production
//!     .build()?;
//!
//! // Manual: a handle to extend and release yourself.
//! let mut lock = redlock.acquire(&["invoice:4821"], Duration::from_secs(5)).await?;
//! let fence = lock.fence(); // send it with every write
//! lock.extend(Duration::from_secs(5)).await?;
//! lock.release().await?;
//! # let _ = (fence, load_invoice, post_to_ledger);
//! # Ok(())
//! # }
//! ```
//!
//! # Guarantees
//!
//! - A lock is granted only when `floor(N/2) + 1` nodes accepted it within one attempt, sent
//!   to all nodes in parallel, each call bounded by `node_timeout`.
//! - Its validity is `ttl - elapsed - (ttl * drift_factor + 2 ms)`, measured on the monotonic
//!   clock from the start of that attempt; a lock with no validity left is never handed out.
//! - A failed attempt releases on every node, also those that failed or timed out.
//! - Release and extend only touch keys that still hold this lock's 128-bit owner token.
//! - With the default empty key prefix, keys and values are those of node-redlock and
//!   redsync, so services in Node.js, Go and Rust exclude each other.
//!
//! A lock alone never makes a write safe: a process can pause past its lease. Use fencing
//! ([`FencingCounter`]) and have the storage reject stale tokens.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(missing_debug_implementations, rust_2018_idioms, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

mod acquisition;
mod address;
mod builder;
mod clock;
mod config;
mod connection;
mod election;
mod error;
mod events;
pub mod fence;
mod guard;
mod hand_off;
mod helper_keys;
mod inner;
mod inspect;
mod lease;
mod lock;
mod memory;
mod metrics;
mod node;
mod node_addr;
mod plant;
mod quorum;
mod random;
mod redlock;
mod resource_type;
mod retry;
mod rwlock;
mod semaphore;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(all(test, not(feature = "testing")))]
pub(crate) mod testing;
mod trace;
mod using;

pub use builder::RedlockBuilder;
pub use connection::Tls;
pub use election::{Election, ElectionBuilder, Leader, Leadership, default_identity};
pub use error::{
    BoxError, ConfigError, Error, FencingError, InvalidInput, LossReason, NodeError, NodeFailure,
    RenewalLimit,
};
pub use events::Event;
pub use fence::counter::{FencingCounter, MemoryCounter};
pub use fence::redis::RedisCounter;
pub use inner::{MAX_RESOURCE_BYTES, MAX_RESOURCE_LEN, MAX_RESOURCES, MAX_TTL};
pub use inspect::{
    Holder, Inspection, KeyState, NodeCheck, NodeReport, ResourceView, TOKEN_PREFIX_LEN,
};
pub use lock::Lock;
pub use node_addr::NodeAddr;
pub use redlock::Redlock;
pub use resource_type::ResourceType;
pub use retry::Backoff;
pub use rwlock::{ReadGuard, RwHolder, RwInspection, RwLock, RwNodeState, WriteGuard};
pub use semaphore::{MAX_PERMITS, Permit, Semaphore};
pub use using::Signal;

/// The redis-rs crate redfence uses, so that callers name the same types (e.g. to pass a
/// [`redis::Client`] to [`RedlockBuilder::node`]).
pub use redis;

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/production.md")]
struct ProductionDoctests;
