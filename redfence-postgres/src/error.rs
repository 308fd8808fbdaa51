//! Why a fenced write was refused: [`StaleFence`] and [`FencedWriteError`].

use crate::chain;

/// A write refused because its fence is smaller than the last one the storage accepted (or,
/// with [`FenceCheck::Strict`](crate::FenceCheck::Strict), equal to it): a newer owner has
/// written since (or, strict, this fence was already used). Treat it as **ownership lost**:
/// stop the work, never retry the same write with the same fence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "stale fence for {resource}: offered {offered}, but {last_accepted} was already accepted (ownership of the lock was lost)"
)]
#[non_exhaustive]
pub struct StaleFence {
    /// What was guarded: the guard's resource name ([`FenceGuards`](crate::FenceGuards)), or
    /// `table(key_column = key)` for a [`FencedUpdate`](crate::FencedUpdate).
    pub resource: String,
    /// The fence the write carried.
    pub offered: u64,
    /// The last fence the storage accepted: greater than `offered` (or equal, with
    /// [`FenceCheck::Strict`](crate::FenceCheck::Strict)).
    pub last_accepted: u64,
}

/// Why a fenced write was not applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FencedWriteError {
    /// The fence is stale: ownership was lost. Roll back and stop; do not retry.
    #[error(transparent)]
    Stale(#[from] StaleFence),

    /// A [`FencedUpdate`](crate::FencedUpdate) matched no row: there is no row with that key (at the time of
    /// the update). It may be that a newer owner deleted it: do not insert it again on this
    /// error without a fence check of your own (keep a tombstone row with its last fence
    /// instead of deleting, or claim a [`FenceGuards`](crate::FenceGuards) guard first).
    #[error("fenced update of {table}: no row with {key_column} = {key}")]
    NotFound {
        /// The table, as given.
        table: String,
        /// The key column, as given.
        key_column: String,
        /// The key, as `Debug` text.
        key: String,
    },

    /// The fence does not fit PostgreSQL's `bigint` (it is above `i64::MAX`): it cannot
    /// have come from a counter that stores `bigint`s.
    #[error("fence {0} does not fit a bigint column (the largest is {max})", max = i64::MAX)]
    FenceOutOfRange(u64),

    /// The fence is 0, which no counter issues (they start at 1): most likely
    /// `lock.fence().unwrap_or(0)` on a lock without a counter, which every check would
    /// accept for ever.
    #[error("fence 0 is not a fence (counters start at 1): is a fencing counter configured?")]
    ZeroFence,

    /// [`FenceGuards::claim_lock`](crate::FenceGuards::claim_lock) was given a lock that carries no fence: the lock
    /// manager has no fencing counter configured.
    #[error("the lock on {0:?} carries no fence: configure a counter with RedlockBuilder::fencing")]
    NoFence(Vec<String>),

    /// [`FenceGuards::claim_all`](crate::FenceGuards::claim_all) was given no resource, which would protect nothing.
    #[error("no resource to claim a guard for")]
    NoResource,

    /// A statement failed: a database error, to handle like any other (e.g. retry the
    /// transaction on a serialization failure).
    #[error("fenced write on {table}: {step}: {detail}")]
    Database {
        /// The table the statement ran on.
        table: String,
        /// Which statement failed.
        step: &'static str,
        /// The error text, with PostgreSQL's message.
        detail: String,
        /// The error.
        #[source]
        source: tokio_postgres::Error,
    },
}

impl FencedWriteError {
    /// Whether the write was refused because a newer owner has written: stop the work.
    pub fn is_ownership_lost(&self) -> bool {
        matches!(self, FencedWriteError::Stale(_))
    }

    /// The stale fence, if that is why the write was refused.
    pub fn stale(&self) -> Option<&StaleFence> {
        match self {
            FencedWriteError::Stale(stale) => Some(stale),
            _ => None,
        }
    }

    pub(crate) fn db(table: &str, step: &'static str, source: tokio_postgres::Error) -> Self {
        FencedWriteError::Database {
            table: table.to_owned(),
            step,
            detail: chain(&source),
            source,
        }
    }
}

/// `fence` as the `bigint` parameter of a fenced statement: refused when it is 0 or does not
/// fit.
pub(crate) fn fence_param(fence: u64) -> Result<i64, FencedWriteError> {
    if fence == 0 {
        return Err(FencedWriteError::ZeroFence);
    }
    i64::try_from(fence).map_err(|_| FencedWriteError::FenceOutOfRange(fence))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_fence_names_the_resource_and_both_fences() {
        let stale = StaleFence {
            resource: "invoice:1".into(),
            offered: 41,
            last_accepted: 42,
        };
        let text = stale.to_string();
        assert!(text.contains("invoice:1") && text.contains("41") && text.contains("42"));
        assert!(FencedWriteError::from(stale).is_ownership_lost());
    }
}
