//! [`ReadGuard`] and [`WriteGuard`]: one side of a read-write lock, held. Each is a [`Lock`]
//! inside (the same validity, extension and release, and the same release in the background
//! when dropped) whose calls are the read-write lock's operations.

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::lock::Lock;

/// What both guards do, over their [`Lock`].
macro_rules! held_side {
    ($guard:ident, $side:literal) => {
        impl $guard {
            pub(super) fn new(lock: Lock) -> Self {
                $guard { lock }
            }

            /// The owner token of this hold: 128 random bits as 32 hex digits, as the nodes
            #[doc = concat!("store it for the ", $side, ".")]
            pub fn token(&self) -> &str {
                self.lock.token()
            }

            /// When the validity ends, on this process's monotonic clock: the start of the
            /// winning round plus the TTL minus the drift allowance, as [`Lock::expires_at`].
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

            /// The TTL it was acquired or last extended with.
            pub fn ttl(&self) -> Duration {
                self.lock.ttl()
            }

            #[doc = concat!("Extends the ", $side, " to `ttl` from now on a majority of nodes, and")]
            /// recomputes the validity, as [`Lock::extend`].
            ///
            /// # Errors
            ///
            /// As [`Lock::extend`]: [`Error::LockLost`] when it expired or a majority no longer
            /// holds it, [`Error::QuorumUnreachable`], [`Error::NoValidity`],
            /// [`Error::InvalidInput`].
            pub async fn extend(&mut self, ttl: Duration) -> Result<(), Error> {
                self.lock.extend(ttl).await
            }

            #[doc = concat!("Releases the ", $side, " on every node (only if still ours), returning once a")]
            /// majority answered, as [`Lock::release`]. Releasing after expiry is not an error.
            ///
            /// # Errors
            ///
            /// [`Error::QuorumUnreachable`] when a majority could not be reached; it then
            /// expires at the end of its TTL there.
            pub async fn release(self) -> Result<(), Error> {
                self.lock.release().await
            }
        }

        impl fmt::Debug for $guard {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($guard))
                    .field("token", &self.lock.token())
                    .field("fence", &self.lock.fence())
                    .field("remaining", &self.lock.remaining())
                    .finish()
            }
        }
    };
}

/// A read of a [`RwLock`](crate::RwLock), held until [`expires_at`](ReadGuard::expires_at):
/// no writer holds the lock meanwhile. Other readers may.
///
/// Dropped without [`release`](ReadGuard::release), it releases itself in the background, as
/// a [`Lock`] does. A reader has no fencing token: it must not write.
///
/// ```no_run
/// use std::time::Duration;
///
/// # async fn run(redlock: redfence::Redlock) -> Result<(), redfence::Error> {
/// let config = redlock.rwlock("config")?;
/// let mut read = config.acquire_read(Duration::from_secs(10)).await?;
/// read.extend(Duration::from_secs(10)).await?;
/// println!("{:?} left", read.remaining());
/// read.release().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "a read is released as soon as it is dropped"]
pub struct ReadGuard {
    lock: Lock,
}

held_side!(ReadGuard, "read");

/// The write of a [`RwLock`](crate::RwLock), held until
/// [`expires_at`](WriteGuard::expires_at): no other writer and no reader holds the lock
/// meanwhile.
///
/// Dropped without [`release`](WriteGuard::release), it releases itself in the background, as
/// a [`Lock`] does. Send [`fence`](WriteGuard::fence) with every write to storage that checks
/// it.
///
/// ```no_run
/// use std::time::Duration;
///
/// # async fn run(redlock: redfence::Redlock) -> Result<(), redfence::Error> {
/// let config = redlock.rwlock("config")?;
/// let write = config.acquire_write(Duration::from_secs(10)).await?;
/// println!("fence {:?}", write.fence());
/// write.release().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "a write is released as soon as it is dropped"]
pub struct WriteGuard {
    lock: Lock,
}

held_side!(WriteGuard, "write");

impl WriteGuard {
    /// The fencing token of this write, if a counter is configured: issued on the resource
    /// `<name>:rwlock:writer`, greater than every earlier writer's of this lock (and than any
    /// token of a mutex on that name).
    pub fn fence(&self) -> Option<u64> {
        self.lock.fence()
    }
}
