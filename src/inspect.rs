//! What the nodes hold for some resources ([`Redlock::inspect`]), and the operator's
//! break-glass that deletes those keys whoever holds them ([`Redlock::force_release`]).
//!
//! Both read every node once, in parallel, each call bounded by `node_timeout`, outside the
//! lock protocol: a report is **advisory**, a snapshot that may be stale by the time it is
//! read. Never decide to write from it; take the lock.

use std::collections::HashSet;
use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use crate::error::{Error, InvalidInput, NodeFailure};
use crate::node::Node;
use crate::redlock::{MAX_RESOURCES, Redlock};

/// How many leading characters of a holder's token a report shows: enough to tell owners
/// apart, too few to extend or release their lock.
pub const TOKEN_PREFIX_LEN: usize = 8;

/// For each key: its type, its value if it is a string, and its PTTL, read atomically.
static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local out = {}
for i, key in ipairs(KEYS) do
  local kind = redis.call('TYPE', key)['ok']
  local value = false
  if kind == 'string' then value = redis.call('GET', key) end
  out[i] = {kind, value, redis.call('PTTL', key)}
end
return out
",
    )
});

/// The same as `INSPECT`, then deletes every key that exists, whoever holds it.
static FORCE_DELETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local out = {}
for i, key in ipairs(KEYS) do
  local kind = redis.call('TYPE', key)['ok']
  local value = false
  if kind == 'string' then value = redis.call('GET', key) end
  out[i] = {kind, value, redis.call('PTTL', key)}
  if kind ~= 'none' then redis.call('DEL', key) end
end
return out
",
    )
});

impl Redlock {
    /// Reads what every node holds at the keys of `resources`: per node, whether each key
    /// exists, a short prefix of the holder's token and its remaining TTL (or the node's
    /// error); [`Inspection::views`] then gives the quorum view of each resource, e.g. "held
    /// by one owner on 4/5 nodes, ~12.3 s left".
    ///
    /// The report is **advisory**: a snapshot taken outside the lock protocol, stale as soon
    /// as it returns. Use it to look, never to decide whether to write.
    ///
    /// ```no_run
    /// # async fn run(redlock: redfence::Redlock) -> Result<(), redfence::Error> {
    /// let report = redlock.inspect(&["invoice:4821"]).await?;
    /// for view in report.views() {
    ///     println!("{}: {view}", view.resource); // e.g. "held by one owner (1f0c9a2e) on 3/3 nodes, ~4.2 s left"
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for no, empty or duplicate resources or more than
    /// [`MAX_RESOURCES`], before any traffic. A node that fails is reported in the
    /// [`Inspection`], not as an error.
    pub async fn inspect(&self, resources: &[impl AsRef<str>]) -> Result<Inspection, Error> {
        self.read_keys(resources, &INSPECT).await
    }

    /// Deletes the keys of `resources` on every node **whoever holds them**, and reports what
    /// each node held just before (the same report as [`inspect`](Self::inspect)): the
    /// operator's break-glass for a lock whose owner is gone for good.
    ///
    /// **Dangerous.** If the owner is still running, another process can now take the lock
    /// while it works: two owners at once. Only fencing ([`crate::FencingCounter`]), with
    /// storage that rejects stale tokens, keeps that safe. A node that failed still holds its
    /// key until it expires; the lock is free once a majority has deleted it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`], as for [`inspect`](Self::inspect), before any traffic.
    pub async fn force_release(&self, resources: &[impl AsRef<str>]) -> Result<Inspection, Error> {
        let report = self.read_keys(resources, &FORCE_DELETE).await?;
        tracing::warn!(resources = ?report.resources, deleted = report.present(), "forced release");
        Ok(report)
    }

    async fn read_keys(
        &self,
        resources: &[impl AsRef<str>],
        script: &Script,
    ) -> Result<Inspection, Error> {
        let resources = validate(resources)?;
        let config = &self.shared.config;
        let keys: Vec<String> = resources
            .iter()
            .map(|resource| format!("{}{resource}", config.key_prefix))
            .collect();
        let calls = self.shared.nodes.iter().map(|node| {
            let keys = &keys;
            async move {
                let reply = node
                    .run_script::<Vec<(String, Option<Vec<u8>>, i64)>>(
                        script,
                        keys,
                        config.node_timeout,
                    )
                    .await;
                NodeReport {
                    index: node.index(),
                    addr: node.addr().to_owned(),
                    keys: reply.and_then(|rows| parse(rows, keys.len())),
                }
            }
        });
        let nodes = futures::future::join_all(calls).await;
        Ok(Inspection {
            resources,
            keys,
            quorum: self.quorum(),
            nodes,
        })
    }
}

/// The same checks as a lock's (no, empty or duplicate resources, at most
/// [`MAX_RESOURCES`]), without the TTL and fencing ones.
fn validate(resources: &[impl AsRef<str>]) -> Result<Vec<String>, InvalidInput> {
    if resources.is_empty() {
        return Err(InvalidInput::NoResources);
    }
    if resources.len() > MAX_RESOURCES {
        return Err(InvalidInput::TooManyResources {
            given: resources.len(),
            max: MAX_RESOURCES,
        });
    }
    let mut seen = HashSet::with_capacity(resources.len());
    let mut names = Vec::with_capacity(resources.len());
    for (index, resource) in resources.iter().enumerate() {
        let name = resource.as_ref();
        if name.is_empty() {
            return Err(InvalidInput::EmptyResource { index });
        }
        if !seen.insert(name) {
            return Err(InvalidInput::DuplicateResource {
                resource: name.to_owned(),
            });
        }
        names.push(name.to_owned());
    }
    Ok(names)
}

/// One node's script reply: one `(type, value, pttl)` row per key.
fn parse(
    rows: Vec<(String, Option<Vec<u8>>, i64)>,
    expected: usize,
) -> Result<Vec<KeyState>, NodeFailure> {
    if rows.len() != expected {
        return Err(NodeFailure::Reply(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "the inspection script returned a row count other than the key count",
        ))));
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

/// What one node held at one resource's key.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyState {
    /// There is no key: the node would grant the resource.
    Absent,
    /// A string value: a lock's owner token.
    Held {
        /// The first [`TOKEN_PREFIX_LEN`] characters of the token.
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

/// What every node held at some resources' keys: the report of [`Redlock::inspect`] and
/// [`Redlock::force_release`]. **Advisory**: a snapshot taken outside the lock protocol.
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
    /// The first [`TOKEN_PREFIX_LEN`] characters of the token.
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

    fn held(prefix: &str, ms: u64) -> KeyState {
        KeyState::Held {
            token_prefix: prefix.into(),
            ttl: Some(Duration::from_millis(ms)),
        }
    }

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

    #[test]
    fn bad_resources_are_rejected() {
        assert_eq!(validate(&[] as &[&str]), Err(InvalidInput::NoResources));
        assert_eq!(
            validate(&["a", ""]),
            Err(InvalidInput::EmptyResource { index: 1 })
        );
        assert!(matches!(
            validate(&["a", "a"]),
            Err(InvalidInput::DuplicateResource { .. })
        ));
    }
}
