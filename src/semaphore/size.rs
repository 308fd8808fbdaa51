//! A semaphore's size on the nodes: `<name>:semaphore:size` holds the number of permits, set
//! by the first client (`SET` if absent, per node, in `scripts/claim.lua`) and refreshed by
//! every acquisition. A client whose number a majority of nodes does not store is refused.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, NodeError};
use crate::inner::Shared;
use crate::node::Claim;
use crate::quorum;

/// How long the size key lives after the last acquisition (at least; longer for longer
/// TTLs): long enough that a holder never outlives it in practice, short enough that a
/// semaphore nobody uses leaves nothing behind for good.
pub(crate) const SIZE_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Claims the size `permits` at `key` on every node (each call bounded by the node timeout):
/// `Ok` when a majority stores it, [`Error::SemaphoreSize`] when a majority does not and a
/// node stores another number, [`Error::QuorumUnreachable`] when too few nodes answered.
pub(crate) async fn claim(
    shared: &Shared,
    name: &str,
    key: &Arc<str>,
    permits: u32,
    ttl: Duration,
) -> Result<(), Error> {
    let ours: Arc<str> = Arc::from(permits.to_string());
    // Never past what redfence sends as a TTL (a permit of MAX_TTL would double it).
    let lives = SIZE_TTL.max(ttl.saturating_mul(2)).min(crate::MAX_TTL);
    let ttl_ms = u64::try_from(lives.as_millis()).unwrap_or(u64::MAX);
    let replies = shared
        .ask_every_node(|node| {
            let request = Claim {
                key: Arc::clone(key),
                value: Arc::clone(&ours),
                ttl_ms,
            };
            async move { crate::node::claim(&*node, request).await }
        })
        .await;
    decide(name, permits, &ours, replies, shared.nodes.len())
}

/// The verdict on the nodes' replies (pure, for the unit tests).
fn decide(
    name: &str,
    permits: u32,
    ours: &str,
    replies: Vec<Result<String, NodeError>>,
    nodes: usize,
) -> Result<(), Error> {
    let quorum = quorum::quorum(nodes);
    let mut agreed = 0;
    let mut other: Option<String> = None;
    let mut errors = Vec::new();
    for reply in replies {
        match reply {
            Ok(stored) if stored == ours => agreed += 1,
            Ok(stored) => other = Some(stored),
            Err(error) => errors.push(error),
        }
    }
    if agreed >= quorum {
        return Ok(());
    }
    match other {
        Some(stored) => Err(Error::SemaphoreSize {
            name: name.to_owned(),
            ours: permits,
            stored,
        }),
        None => Err(Error::QuorumUnreachable {
            granted: agreed,
            denied: 0,
            quorum,
            nodes,
            errors,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::NodeFailure;

    fn down(index: usize) -> Result<String, NodeError> {
        Err(NodeError {
            index,
            addr: format!("node{index}"),
            failure: NodeFailure::Timeout(Duration::from_millis(1)),
        })
    }

    #[test]
    fn a_majority_storing_our_size_is_enough() {
        let replies = vec![Ok("3".into()), Ok("5".into()), Ok("3".into())];
        assert!(decide("jobs", 3, "3", replies, 3).is_ok());
        let replies = vec![Ok("3".into()), down(1), Ok("3".into())];
        assert!(decide("jobs", 3, "3", replies, 3).is_ok());
    }

    #[test]
    fn another_size_on_a_majority_is_refused_naming_both() {
        let replies = vec![Ok("3".into()), Ok("5".into()), Ok("5".into())];
        match decide("jobs", 3, "3", replies, 3) {
            Err(Error::SemaphoreSize { name, ours, stored }) => {
                assert_eq!((name.as_str(), ours, stored.as_str()), ("jobs", 3, "5"));
            }
            other => panic!("expected SemaphoreSize, got {other:?}"),
        }
    }

    #[test]
    fn too_few_answers_are_unreachable() {
        let replies = vec![Ok("3".into()), down(1), down(2)];
        assert!(matches!(
            decide("jobs", 3, "3", replies, 3),
            Err(Error::QuorumUnreachable { errors, .. }) if errors.len() == 2
        ));
    }
}
