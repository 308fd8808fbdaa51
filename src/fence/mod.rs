//! Fencing tokens: numbers that only grow, issued once per acquisition by a durable counter,
//! so that the storage the work writes to can reject a stale owner.
//!
//! A lock alone is never enough for correctness: a worker paused past its lease (a GC pause,
//! CPU starvation, a slow network) wakes up and writes after the next owner. With fencing,
//! every acquisition gets a token greater than all earlier ones for its resources, the work
//! sends it with each write, and the storage rejects any write whose token is not greater
//! than the last one it accepted.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use futures::future::BoxFuture;

use crate::error::BoxError;

/// A source of fencing tokens. Implement it for your own durable store.
///
/// # Contract
///
/// [`next_fence`](FencingCounter::next_fence) returns a token strictly greater than every
/// token it returned before for **any** of the given resources, and never returns a token
/// again once it has returned it, even after a restart of the store behind it. Gaps are fine;
/// only the order matters.
///
/// redfence calls it after a quorum granted the lock and before `acquire`/`using` return, bounded
/// by the builder's `fencing_timeout` and the lock's validity. If it fails, the lock is released
/// and the caller gets [`Error::Fencing`](crate::Error::Fencing): never a lock without a token.
///
/// ```
/// use futures::future::BoxFuture;
/// use redfence::{BoxError, FencingCounter};
///
/// /// Tokens from a clock-like service (illustration only).
/// struct MyCounter;
///
/// impl FencingCounter for MyCounter {
///     fn next_fence<'a>(&'a self, resources: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>> {
///         Box::pin(async move {
///             // Ask your durable store for a number greater than the last one of each resource.
///             let _ = resources;
///             Ok(42)
///         })
///     }
/// }
/// ```
pub trait FencingCounter: Send + Sync {
    /// Issues the next token for a lock on `resources` (the resource names, without the key
    /// prefix).
    fn next_fence<'a>(&'a self, resources: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>>;
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
