//! The typed, advisory report of an inspection: per node, then per resource.

use std::fmt;
use std::time::Duration;

use crate::error::NodeFailure;

/// What one node held at one resource's key.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyState {
    /// There is no key: the node would grant the resource.
    Absent,
    /// A string value: a lock's owner token.
    Held {
        /// The first [`TOKEN_PREFIX_LEN`](super::TOKEN_PREFIX_LEN) characters of the token.
        token_prefix: String,
        /// The key's remaining TTL; `None` if it never expires (not a key redfence set).
        ttl: Option<Duration>,
    },
    /// A value of another type (a hash, a list, ...): not a lock, yet it blocks one.
    Foreign {
        /// Its Redis type, as `TYPE` names it.
        kind: String,
        /// Its remaining TTL; `None` if it never expires.
        ttl: Option<Duration>,
    },
}

/// One node's part of an [`Inspection`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NodeReport {
    /// The node's position in the order the builder was given.
    pub index: usize,
    /// The node's address, without credentials.
    pub addr: String,
    /// The state of each key, in the order of [`Inspection::resources`], or why the node
    /// could not be read (e.g. it timed out).
    pub keys: Result<Vec<KeyState>, NodeFailure>,
}

/// What every node held at some resources' keys: the report of [`Redlock::inspect`](crate::Redlock::inspect) and
/// [`Redlock::force_release`](crate::Redlock::force_release). **Advisory**: a snapshot taken outside the lock protocol.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Inspection {
    /// The resources, as given.
    pub resources: Vec<String>,
    /// Their Redis keys (the key prefix, then the name).
    pub keys: Vec<String>,
    /// How many nodes make a majority.
    pub quorum: usize,
    /// Each node's answer, in the builder's order.
    pub nodes: Vec<NodeReport>,
}

impl Inspection {
    /// How many nodes answered.
    pub fn answered(&self) -> usize {
        self.nodes.iter().filter(|node| node.keys.is_ok()).count()
    }

    /// How many keys existed, over every node that answered (for `force_release`, how many
    /// it deleted).
    pub fn present(&self) -> usize {
        self.nodes
            .iter()
            .filter_map(|node| node.keys.as_ref().ok())
            .flatten()
            .filter(|state| **state != KeyState::Absent)
            .count()
    }

    /// The quorum view of every resource, in order.
    pub fn views(&self) -> Vec<ResourceView> {
        (0..self.resources.len()).map(|i| self.view(i)).collect()
    }

    /// The quorum view of resource `index` (its position in [`resources`](Self::resources)).
    ///
    /// # Panics
    ///
    /// If `index` is out of range.
    pub fn view(&self, index: usize) -> ResourceView {
        let mut view = ResourceView {
            resource: self.resources[index].clone(),
            node_count: self.nodes.len(),
            quorum: self.quorum,
            holders: Vec::new(),
            absent: 0,
            foreign: 0,
            failed: 0,
        };
        let mut ttls: Vec<Vec<Duration>> = Vec::new();
        for node in &self.nodes {
            match node.keys.as_ref().map(|keys| keys.get(index)) {
                Err(_) | Ok(None) => view.failed += 1,
                Ok(Some(KeyState::Absent)) => view.absent += 1,
                Ok(Some(KeyState::Foreign { .. })) => view.foreign += 1,
                Ok(Some(KeyState::Held { token_prefix, ttl })) => {
                    let ttl = ttl.unwrap_or(Duration::MAX);
                    match view
                        .holders
                        .iter()
                        .position(|h| h.token_prefix == *token_prefix)
                    {
                        Some(i) => {
                            view.holders[i].nodes.push(node.index);
                            ttls[i].push(ttl);
                        }
                        None => {
                            view.holders.push(Holder {
                                token_prefix: token_prefix.clone(),
                                nodes: vec![node.index],
                                majority_ttl: None,
                            });
                            ttls.push(vec![ttl]);
                        }
                    }
                }
            }
        }
        for (holder, mut ttls) in view.holders.iter_mut().zip(ttls) {
            // A majority holds it until the quorum-th longest TTL runs out.
            ttls.sort_unstable_by(|a, b| b.cmp(a));
            holder.majority_ttl = ttls.get(self.quorum.saturating_sub(1)).copied();
        }
        view.holders
            .sort_by_key(|holder| std::cmp::Reverse(holder.nodes.len()));
        view
    }
}

/// One resource as the nodes that answered see it. **Advisory.**
///
/// Its `Display` is one line, e.g. `held by one owner (1f0c9a2e) on 4/5 nodes, ~12.3 s
/// left`, `free on 5/5 nodes`, or `no majority: ...`.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ResourceView {
    /// The resource.
    pub resource: String,
    /// How many nodes there are.
    pub node_count: usize,
    /// How many make a majority.
    pub quorum: usize,
    /// Each distinct token found, with the nodes holding it, most nodes first.
    pub holders: Vec<Holder>,
    /// On how many nodes the key is absent.
    pub absent: usize,
    /// On how many nodes the key holds a value that is not a lock token.
    pub foreign: usize,
    /// How many nodes could not be read.
    pub failed: usize,
}

/// One token found at a resource's key, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The first [`TOKEN_PREFIX_LEN`](super::TOKEN_PREFIX_LEN) characters of the token.
    pub token_prefix: String,
    /// The nodes holding it (their indexes).
    pub nodes: Vec<usize>,
    /// How long a majority of nodes keeps holding it unless it is extended or released
    /// (the quorum-th longest remaining TTL; `Duration::MAX` for keys that never expire);
    /// `None` when fewer than a majority hold it.
    pub majority_ttl: Option<Duration>,
}

impl ResourceView {
    /// The owner holding the resource on a majority of nodes, if any.
    pub fn owner(&self) -> Option<&Holder> {
        self.holders
            .first()
            .filter(|holder| holder.nodes.len() >= self.quorum)
    }

    /// Whether a majority of nodes has no key: a lock on it could be granted now.
    pub fn is_free(&self) -> bool {
        self.absent >= self.quorum
    }
}

impl fmt::Display for ResourceView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.node_count;
        if let Some(owner) = self.owner() {
            write!(
                f,
                "held by one owner ({}) on {}/{n} nodes",
                owner.token_prefix,
                owner.nodes.len()
            )?;
            match owner.majority_ttl {
                Some(Duration::MAX) => f.write_str(", no expiry")?,
                Some(ttl) => write!(f, ", ~{:.1} s left", ttl.as_secs_f64())?,
                None => {}
            }
        } else if self.is_free() {
            write!(f, "free on {}/{n} nodes", self.absent)?;
        } else {
            f.write_str("no majority")?;
            for holder in &self.holders {
                write!(f, "; {} on {}/{n}", holder.token_prefix, holder.nodes.len())?;
            }
            if self.absent > 0 {
                write!(f, "; free on {}/{n}", self.absent)?;
            }
        }
        if self.foreign > 0 {
            write!(f, "; a non-lock value on {}/{n}", self.foreign)?;
        }
        if self.failed > 0 {
            write!(f, "; {}/{n} nodes failed", self.failed)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::tests::held;

    fn report(states: Vec<Result<KeyState, ()>>) -> Inspection {
        let quorum = states.len() / 2 + 1;
        Inspection {
            resources: vec!["r".into()],
            keys: vec!["r".into()],
            quorum,
            nodes: states
                .into_iter()
                .enumerate()
                .map(|(index, state)| NodeReport {
                    index,
                    addr: format!("127.0.0.1:{index}"),
                    keys: state
                        .map(|s| vec![s])
                        .map_err(|()| NodeFailure::Timeout(Duration::from_millis(50))),
                })
                .collect(),
        }
    }

    #[test]
    fn majority_ttl_is_the_quorum_th_longest() {
        let r = report(vec![
            Ok(held("aaaa", 9_000)),
            Ok(held("aaaa", 12_300)),
            Ok(held("aaaa", 12_000)),
            Ok(held("aaaa", 1_000)),
            Err(()),
        ]);
        let view = r.view(0);
        let owner = view.owner().expect("a majority holder");
        assert_eq!(owner.nodes, vec![0, 1, 2, 3]);
        assert_eq!(owner.majority_ttl, Some(Duration::from_millis(9_000)));
        assert_eq!(
            view.to_string(),
            "held by one owner (aaaa) on 4/5 nodes, ~9.0 s left; 1/5 nodes failed"
        );
    }

    #[test]
    fn split_and_free_views() {
        let r = report(vec![
            Ok(held("aaaa", 5_000)),
            Ok(held("bbbb", 5_000)),
            Ok(KeyState::Absent),
        ]);
        let view = r.view(0);
        assert!(view.owner().is_none());
        assert!(!view.is_free());
        assert_eq!(
            view.to_string(),
            "no majority; aaaa on 1/3; bbbb on 1/3; free on 1/3"
        );
        let r = report(vec![Ok(KeyState::Absent), Ok(KeyState::Absent), Err(())]);
        assert!(r.view(0).is_free());
        assert_eq!(r.view(0).to_string(), "free on 2/3 nodes; 1/3 nodes failed");
        assert_eq!(r.answered(), 2);
        assert_eq!(r.present(), 0);
    }
}
