//! `Permit`: one of a semaphore's permits, held: a [`Lock`] on one slot.

use std::time::{Duration, Instant};

use crate::error::Error;
use crate::lock::Lock;

/// One permit of a [`Semaphore`](crate::Semaphore), held until
/// [`expires_at`](Permit::expires_at): a lock on slot [`slot`](Permit::slot) of the
/// semaphore, granted by a majority of nodes.
///
/// Extend it with [`extend`](Permit::extend) and release it with [`release`](Permit::release).
/// A `Permit` dropped without `release` releases itself in the background, as a [`Lock`]
/// does.
///
/// ```no_run
/// use std::time::Duration;
///
/// # async fn run(redlock: redfence::Redlock) -> Result<(), redfence::Error> {
/// let jobs = redlock.semaphore("jobs", 3)?;
/// let mut permit = jobs.acquire(Duration::from_secs(10)).await?;
/// println!("running in slot {} of 3", permit.slot());
/// permit.extend(Duration::from_secs(10)).await?;
/// permit.release().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "a permit is released as soon as it is dropped"]
#[derive(Debug)]
pub struct Permit {
    slot: u32,
    lock: Lock,
}

impl Permit {
    pub(crate) fn new(lock: Lock, slot: u32) -> Self {
        Permit { lock, slot }
    }

    /// The slot this permit holds, from 0 to the number of permits minus one. Two holders
    /// at one instant never share a slot.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The slot's lock, whose one resource is the slot's name
    /// (`<name>:semaphore:slot:<slot>`).
    pub fn lock(&self) -> &Lock {
        &self.lock
    }

    /// The slot's lock, to keep as a plain [`Lock`].
    pub fn into_lock(self) -> Lock {
        self.lock
    }

    /// The owner token of the slot's lock.
    pub fn token(&self) -> &str {
        self.lock.token()
    }

    /// The fencing token of this acquisition of the slot, if a counter is configured. Tokens
    /// increase per slot (the counter's resource is the slot's name), not across the
    /// semaphore: up to K holders legitimately run at once, so only a slot has one owner at a
    /// time for storage to check. Fence what belongs to the slot.
    pub fn fence(&self) -> Option<u64> {
        self.lock.fence()
    }

    /// When the permit's validity ends, as [`Lock::expires_at`].
    pub fn expires_at(&self) -> Instant {
        self.lock.expires_at()
    }

    /// How much validity is left (zero once expired).
    pub fn remaining(&self) -> Duration {
        self.lock.remaining()
    }

    /// Whether the validity has run out.
    pub fn is_expired(&self) -> bool {
        self.lock.is_expired()
    }

    /// Extends the permit to `ttl` from now, as [`Lock::extend`].
    ///
    /// # Errors
    ///
    /// As [`Lock::extend`].
    pub async fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
        self.lock.extend(ttl).await
    }

    /// Releases the permit, freeing its slot, as [`Lock::release`].
    ///
    /// # Errors
    ///
    /// As [`Lock::release`].
    pub async fn release(self) -> Result<(), Error> {
        self.lock.release().await
    }
}
