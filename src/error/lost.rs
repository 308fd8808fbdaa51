//! Why ownership of a lock is gone, or renewal stopped.

use std::fmt;
use std::time::Duration;

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
    /// The leader resigned its term ([`Leadership::resign`](crate::Leadership::resign)
    /// or [`Election::resign`](crate::Election::resign)).
    Resigned,
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
            LossReason::Resigned => f.write_str("the leader resigned"),
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
