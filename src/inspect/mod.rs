//! What the nodes hold for some resources ([`Redlock::inspect`](crate::Redlock::inspect)), and the operator's
//! break-glass that deletes those keys whoever holds them ([`Redlock::force_release`](crate::Redlock::force_release)).
//!
//! Both read every node once, in parallel, each call bounded by `node_timeout`, outside the
//! lock protocol: a report is **advisory**, a snapshot that may be stale by the time it is
//! read. Never decide to write from it; take the lock.

mod health;
mod report;

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, NodeFailure};
use crate::events::Event;
use crate::inner::{Shared, resource_names};
use crate::node::KeyRow;

pub use health::NodeCheck;
pub use report::{Holder, Inspection, KeyState, NodeReport, ResourceView};

/// How many leading characters of a holder's token a report shows: enough to tell owners
/// apart, too few to extend or release their lock.
pub const TOKEN_PREFIX_LEN: usize = 8;

/// Reads (with `delete`, then deletes) the keys of `resources` on every node in parallel,
/// each call bounded by the node timeout, and reports what each node held.
pub(crate) async fn read(
    shared: &Shared,
    resources: &[impl AsRef<str>],
    delete: bool,
) -> Result<Inspection, Error> {
    let resources = resource_names(resources)?;
    let keys = shared.keys(&resources);
    crate::inner::no_helper_keys(&resources, &keys)?;
    shared.one_call_each(&keys)?;
    let timeout = shared.config.node_timeout;
    let calls = shared.nodes.iter().enumerate().map(|(index, node)| {
        let keys = Arc::clone(&keys);
        let expected = keys.len();
        async move {
            let call = crate::node::inspect(&**node, keys, delete);
            let reply = match tokio::time::timeout(timeout, call).await {
                Ok(reply) => reply,
                Err(_) => Err(NodeFailure::Timeout(timeout)),
            };
            NodeReport {
                index,
                addr: node.addr().to_owned(),
                keys: reply.and_then(|rows| parse(rows, expected)),
            }
        }
    });
    let nodes = futures::future::join_all(calls).await;
    Ok(Inspection {
        resources,
        keys: keys.to_vec(),
        quorum: crate::quorum::quorum(shared.nodes.len()),
        nodes,
    })
}

/// Reads every node's `maxmemory-policy`, each call bounded by the node timeout, and warns
/// (through `tracing` and the event hook) about each node that may evict lock keys.
pub(crate) async fn check(shared: &Shared) -> Vec<NodeCheck> {
    let timeout = shared.config.node_timeout;
    let calls = shared
        .nodes
        .iter()
        .enumerate()
        .map(|(index, node)| async move {
            let (policy, run_id) = (
                crate::node::eviction_policy(&**node),
                crate::node::run_id(&**node),
            );
            let (policy, run_id) = futures::future::join(
                tokio::time::timeout(timeout, policy),
                tokio::time::timeout(timeout, run_id),
            )
            .await;
            NodeCheck {
                index,
                addr: node.addr().to_owned(),
                maxmemory_policy: policy.unwrap_or(Err(NodeFailure::Timeout(timeout))),
                run_id: run_id.ok().and_then(Result::ok).flatten(),
                same_server_as: None,
            }
        });
    let mut checks = futures::future::join_all(calls).await;
    for i in 0..checks.len() {
        let same = checks[..i]
            .iter()
            .find(|earlier| earlier.run_id.is_some() && earlier.run_id == checks[i].run_id)
            .map(|earlier| earlier.index);
        checks[i].same_server_as = same;
    }
    for check in &checks {
        if check.may_evict_locks()
            && let Ok(policy) = &check.maxmemory_policy
        {
            shared.config.events.emit(Event::EvictionPolicy {
                index: check.index,
                addr: check.addr.clone(),
                policy: policy.clone(),
            });
        }
        if let Some(first) = check.same_server_as {
            shared.config.events.emit(Event::SameServer {
                first,
                second: check.index,
                addr: check.addr.clone(),
            });
        }
    }
    checks
}

/// One node's script reply: one `(type, value, pttl)` row per key.
fn parse(rows: Vec<KeyRow>, expected: usize) -> Result<Vec<KeyState>, NodeFailure> {
    if rows.len() != expected {
        return Err(NodeFailure::UnexpectedReply(format!(
            "the inspection script returned {} rows for {expected} keys",
            rows.len()
        )));
    }
    Ok(rows
        .into_iter()
        .map(|(kind, value, pttl)| {
            // PTTL: -2 no key, -1 no expiry, else milliseconds left.
            let ttl = u64::try_from(pttl).ok().map(Duration::from_millis);
            match (kind.as_str(), value) {
                ("none", _) => KeyState::Absent,
                ("string", Some(value)) => KeyState::Held {
                    token_prefix: String::from_utf8_lossy(&value)
                        .chars()
                        .take(TOKEN_PREFIX_LEN)
                        .collect(),
                    ttl,
                },
                _ => KeyState::Foreign { kind, ttl },
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key held by a token starting with `prefix`, for `ms` more.
    pub(super) fn held(prefix: &str, ms: u64) -> KeyState {
        KeyState::Held {
            token_prefix: prefix.into(),
            ttl: Some(Duration::from_millis(ms)),
        }
    }

    #[test]
    fn rows_are_parsed_by_type() {
        let rows = vec![
            ("none".to_string(), None, -2),
            (
                "string".to_string(),
                Some(b"0123456789abcdef".to_vec()),
                1500,
            ),
            ("hash".to_string(), None, -1),
        ];
        assert_eq!(
            parse(rows, 3).expect("three rows"),
            vec![
                KeyState::Absent,
                held("01234567", 1500),
                KeyState::Foreign {
                    kind: "hash".into(),
                    ttl: None
                },
            ]
        );
        assert!(parse(Vec::new(), 1).is_err());
    }
}
