//! Helpers of the restart tests (`tests/restarts.rs`, `tests/restart_signs.rs`).

use std::time::Duration;

use redfence::{Error, Lock, NodeFailure};

use super::{Servers, TestRedlock, eventually};

/// The nodes of `err` that were quarantined.
pub fn quarantined(err: &Error) -> Vec<usize> {
    match err {
        Error::QuorumUnreachable { errors, .. } => errors
            .iter()
            .filter(|e| {
                matches!(e.failure, NodeFailure::Quarantined { remaining } if !remaining.is_zero())
            })
            .map(|e| e.index)
            .collect(),
        _ => Vec::new(),
    }
}

/// A client A (quarantine off, so that its own view plays no part) takes `resource` for
/// `ttl` on nodes 0–2 of five only: nodes 3 and 4 are held by another owner for a second at
/// the time, then free. Once node 2 restarts without persistence, a majority of free nodes
/// (2, 3, 4) is there for the taking.
pub async fn hold_on_0_to_2(servers: &Servers, resource: &str, ttl: Duration) -> Lock {
    for i in [3, 4] {
        let _: () = servers.cmd(i, &["SET", resource, "other", "PX", "1000"]);
    }
    let a = servers.unquarantined();
    let lock = a.try_acquire(&[resource], ttl).await.expect("A: nodes 0-2");
    assert_eq!(servers.holders(resource, lock.token(), 0..5), vec![0, 1, 2]);
    assert!(
        eventually(|| servers.get(3, resource).is_none() && servers.get(4, resource).is_none())
            .await,
        "the other owner's keys expire"
    );
    lock
}
