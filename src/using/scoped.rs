//! What the lease keeper keeps for a `using()` scope: the [`Lock`], extended to the
//! policy's TTL through [`Lock::extend`], its events, and its release at the end of the scope.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::events::{Event, EventHook};
use crate::lease::{Holding, Lease};
use crate::lock::Lock;

/// A `using()` lock, as the keeper holds it.
pub(super) struct Scoped {
    pub(super) lock: Lock,
    /// The TTL every extension renews the lock to.
    pub(super) ttl: Duration,
    pub(super) resources: Arc<[String]>,
    pub(super) events: EventHook,
}

impl Holding for Scoped {
    fn expires_at(&self) -> Instant {
        self.lock.expires_at()
    }

    async fn extend(&mut self) -> Result<(), Error> {
        self.lock.extend(self.ttl).await
    }

    async fn renewed(&mut self, lease: &Lease, _next: Instant) {
        self.events
            .extended(&self.resources, lease.extensions, self.lock.remaining());
    }

    fn failed(&mut self, error: &Error) {
        self.events.emit(Event::ExtensionFailed {
            resources: self.resources.to_vec(),
            error: error.clone(),
            remaining: self.lock.remaining(),
        });
    }

    fn lost(&mut self) {
        self.lock.hold_lost();
    }

    /// Waits for every node (so that no call of this lock outlives the scope).
    async fn release(self, resources: &[String]) {
        if let Err(error) = self.lock.release_all().await {
            self.events.emit(Event::ReleaseFailed {
                resources: resources.to_vec(),
                error,
            });
        }
    }
}
