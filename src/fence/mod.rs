//! Fencing tokens: numbers that only grow, issued once per acquisition by a durable counter,
//! so that the storage the work writes to can reject a stale owner.
//!
//! A lock alone is never enough for correctness: a worker paused past its lease (a GC pause,
//! CPU starvation, a slow network) wakes up and writes after the next owner. With fencing,
//! every acquisition gets a token greater than all earlier ones for its resources, the work
//! sends it with each write, and the storage rejects any write whose token is smaller than
//! the last one it accepted:
//!
//! ```text
//! A acquires "invoice:4821", fence 41 ... pauses past its TTL ...
//! B acquires "invoice:4821", fence 42, writes: storage records 42
//! B writes again with 42: 42 >= 42, accepted (the owner's own token)
//! A wakes up and writes with 41: 41 < 42, rejected (StaleFence) — A has lost ownership
//! ```
//!
//! Tokens are unique per acquisition, so accepting the owner's own token again is as safe as
//! accepting each token once, and lets the owner write many times with one lock. The
//! PostgreSQL helpers offer the once-per-acquisition check as an option
//! (`fence::postgres::FenceCheck::Strict`).
//!
//! Configure a counter with [`RedlockBuilder::fencing`](crate::RedlockBuilder::fencing);
//! every lock then carries [`Lock::fence`](crate::Lock::fence).
//!
//! # When tokens are issued
//!
//! After a quorum granted the lock and before `acquire` (or `using`) returns, bounded by the
//! builder's `fencing_timeout` and the lock's remaining validity. Fail closed: if the counter errs,
//! does not answer in time, or answers after the lock expired, the lock is released on every
//! node and the caller gets [`Error::Fencing`](crate::Error::Fencing); no lock is ever handed
//! out without a token. Extending a lock keeps its token (ownership did not change).
//!
//! A multi-resource lock gets **one** token, greater than the last token of every resource
//! in it, so each of its resources sees a strictly increasing sequence.
//!
//! # What each counter guarantees (the failure model)
//!
//! | counter | monotonic across | breaks when |
//! | --- | --- | --- |
//! | [`MemoryCounter`] | one process's lifetime | the process restarts, or a second process issues tokens: **not durable** — tests and single-process use only |
//! | [`RedisCounter`] | one Redis primary's history of acknowledged writes | that primary loses a write: restart without `appendfsync always`, **failover** to an asynchronously replicated replica, restore from an older snapshot |
//! | `PostgresCounter` (feature `postgres`) | every committed transaction: survives crashes through the WAL, and failover with synchronous replication | the database itself loses committed transactions (`fsync = off`, asynchronous standby promoted, restore from an old backup) |
//!
//! `RedisCounter` and `PostgresCounter` **group-commit**: one call (a script call, a
//! statement) is in flight at a time, and requests that arrive meanwhile go together in the
//! next one, in arrival order; a request that finds nothing in flight goes out at once. The
//! batches keep the guarantees above, and fail like this:
//!
//! | event | effect |
//! | --- | --- |
//! | a batch commits | every request in it gets its token, after the commit; tokens of one resource increase in arrival order |
//! | a batch fails, or takes longer than the counter's `timeout` | every request in it fails, and each of those locks is released (fail closed) |
//! | a batch may have committed (a timeout, a lost connection) | its tokens are never handed out: gaps, never a repeat |
//! | a request's caller gives up before its batch goes out | the request is skipped |
//! | a request's caller gives up while its batch is in flight | its token is skipped; the other requests of the batch are unaffected |
//!
//! **On Redis failover** replication is asynchronous, so the promoted replica may lack the
//! last increments and issue those tokens again. The danger is an old owner holding a
//! token *greater* than the new owner's: A gets 42 from the old primary, which dies before
//! replicating it; B gets 41 from the new one and writes; A wakes up and writes with 42,
//! and the storage accepts it, overwriting B. A repeated *equal* token is just as bad: A and
//! B would both hold 42, and the storage accepts the owner's own token again, so both write
//! (the strict once-per-acquisition check only narrows that to "whoever writes first").
//! `appendfsync always` protects a single primary's crash, not a failover; `WAIT` narrows
//! the window, it does not close it. When that matters, use `PostgresCounter`, ideally in
//! the database the work writes to.
//!
//! Whatever the counter, the guarantee ends at the storage: it must compare and record the
//! token atomically with the write (see `fence::postgres` for PostgreSQL helpers; the same
//! conditional write works in any store with compare-and-set). Targets that **cannot check
//! a token** — sending an email, calling an external API without conditional writes, a
//! device that executes commands directly — are not protected by fencing at all: give them
//! an **idempotency key** (e.g. the job id), route them through an outbox committed with
//! the fenced write, or serialize them through a single consumer.
//!
//! # Writing your own counter
//!
//! Implement [`FencingCounter`] over a store whose increments are durable and
//! linearizable once acknowledged. One global counter for all resources is valid too (it
//! is monotonic for every resource); one per resource lets unrelated resources proceed
//! without contending on one row or key.

mod batch;
#[cfg(feature = "postgres")]
pub mod postgres;
mod redis;

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use futures::future::BoxFuture;

use crate::error::BoxError;

pub use self::redis::{DEFAULT_REDIS_FENCE_PREFIX, DEFAULT_REDIS_FENCE_TIMEOUT, RedisCounter};
#[cfg(feature = "postgres")]
pub use postgres::PostgresCounter;

/// A source of fencing tokens. Implement it for your own durable store.
///
/// # Contract
///
/// [`next_fence`](FencingCounter::next_fence) returns a token strictly greater than every
/// token it returned before for **any** of the given resources, and never returns a token
/// again once it has returned it, even after a restart of the store behind it. Gaps are fine;
/// only the order matters. A token must be durable before it is returned: a crash right
/// after must not let the store issue it (or a smaller one) again.
///
/// redfence calls it after a quorum granted the lock and before `acquire`/`using` return, bounded
/// by the builder's `fencing_timeout` and the lock's validity. If it fails, the lock is released
/// and the caller gets [`Error::Fencing`](crate::Error::Fencing): never a lock without a token.
///
/// - `resources` are the lock's resource names (without the key prefix): at least one, no
///   duplicates, in the order the caller gave them.
/// - The future may be **dropped** at the timeout, at any await point. A token issued by a
///   dropped call is simply never used; the next call must still return a greater one.
/// - The trait is object-safe and `Send + Sync`: one counter (in an `Arc`) serves every lock
///   of a [`Redlock`](crate::Redlock), concurrently.
///
/// ```
/// use futures::future::BoxFuture;
/// use redfence::{BoxError, FencingCounter};
///
/// /// One global sequence for every resource: monotonic for each of them.
/// /// (Illustration only: a real counter persists the value before returning it.)
/// struct GlobalCounter(tokio::sync::Mutex<u64>);
///
/// impl FencingCounter for GlobalCounter {
///     fn next_fence<'a>(&'a self, resources: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>> {
///         Box::pin(async move {
///             let _ = resources; // a per-resource counter keys on them
///             let mut last = self.0.lock().await;
///             *last = last.checked_add(1).ok_or("the counter is exhausted")?;
///             // ... write `*last` to durable storage and wait for the commit here ...
///             Ok(*last)
///         })
///     }
/// }
///
/// let counter = GlobalCounter(tokio::sync::Mutex::new(0));
/// let redlock = redfence::Redlock::builder()
///     .node("redis://127.0.0.1:7001")
///     .fencing(counter)
///     .build();
/// assert!(redlock.is_ok());
/// ```
pub trait FencingCounter: Send + Sync {
    /// Issues the next token for a lock on `resources` (the resource names, without the key
    /// prefix): greater than every token issued before for any of them.
    fn next_fence<'a>(&'a self, resources: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>>;

    /// Checks, before any traffic, that this counter can issue tokens for a resource named
    /// `resource`; `Err` says why not (the request then fails with
    /// [`InvalidInput::ResourceNotFenceable`](crate::InvalidInput::ResourceNotFenceable) and
    /// nothing is locked). Called once per resource of every request. The default accepts
    /// every name.
    fn check_resource(&self, resource: &str) -> Result<(), String> {
        let _ = resource;
        Ok(())
    }
}

/// An in-process counter, for tests and single-process use.
///
/// **Not durable**: tokens start again from 1 when the process restarts, so two processes, or
/// one restarted process, can issue the same token. Use a durable counter in production.
#[derive(Default)]
pub struct MemoryCounter {
    last: Mutex<HashMap<String, u64>>,
}

impl MemoryCounter {
    /// A counter with no token issued yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn next(&self, resources: &[String]) -> Result<u64, BoxError> {
        let mut last = self
            .last
            .lock()
            .map_err(|_| "the memory counter's mutex is poisoned")?;
        let current = resources
            .iter()
            .filter_map(|r| last.get(r).copied())
            .max()
            .unwrap_or(0);
        let next = current
            .checked_add(1)
            .ok_or("the memory counter reached u64::MAX")?;
        for r in resources {
            last.insert(r.clone(), next);
        }
        Ok(next)
    }
}

impl FencingCounter for MemoryCounter {
    fn next_fence<'a>(&'a self, resources: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>> {
        Box::pin(async move { self.next(resources) })
    }
}

impl fmt::Debug for MemoryCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryCounter").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(r: &[&str]) -> Vec<String> {
        r.iter().map(|s| s.to_string()).collect()
    }

    #[tokio::test]
    async fn memory_counter_is_monotonic_per_resource_and_across_sets() {
        let c = MemoryCounter::new();
        assert_eq!(c.next_fence(&names(&["a"])).await.ok(), Some(1));
        assert_eq!(c.next_fence(&names(&["a"])).await.ok(), Some(2));
        assert_eq!(c.next_fence(&names(&["b"])).await.ok(), Some(1));
        // A multi-resource token exceeds the last token of every resource in it.
        assert_eq!(c.next_fence(&names(&["a", "b"])).await.ok(), Some(3));
        assert_eq!(c.next_fence(&names(&["b"])).await.ok(), Some(4));
    }
}
