//! The [`FencingCounter`] trait and the in-process [`MemoryCounter`].

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use futures::future::BoxFuture;

use crate::error::BoxError;

/// A source of fencing tokens. Implement it for your own durable store.
///
/// # Contract
///
/// [`next_fence`](FencingCounter::next_fence) returns a token of at least 1 (a 0 fails the
/// acquisition: fenced writes treat 0 as "no fence"), strictly greater than every
/// token it returned before for **any** of the given resources, and never returns a token
/// again once it has returned it, even after a restart of the store behind it. Gaps are fine;
/// only the order matters. A token must be durable before it is returned: a crash right
/// after must not let the store issue it (or a smaller one) again.
///
/// "Every token it returned before" means every token whose call **returned** before this
/// call began; two calls in flight at once may be answered in either order (the lock makes
/// that harmless: the next holder of a resource asks only after the previous holder's token
/// arrived). A counter need not keep one value per resource: a striped one
/// ([`Stripes`](crate::fence::Stripes)) keeps S values, each shared by the resources that map
/// to it, and issues a token above every value its resources map to, raising each of them to
/// it; that is greater than every earlier token of each of those resources.
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

/// A counter shared with other code: `builder.fencing(Arc::clone(&counter))`.
impl<T: FencingCounter + ?Sized> FencingCounter for std::sync::Arc<T> {
    fn next_fence<'a>(&'a self, resources: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>> {
        (**self).next_fence(resources)
    }

    fn check_resource(&self, resource: &str) -> Result<(), String> {
        (**self).check_resource(resource)
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
