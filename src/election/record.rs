//! A [`Leader`], as the nodes record it beside the lock: `"{term} {token} {identity}"` at
//! `election:{NAME}:leader`, written and deleted only while the lock holds the leader's
//! token, and read from every node by [`Election::leader`](super::Election::leader).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::error::Error;
use crate::inner::{Shared, millis};
use crate::node::{GuardedWrite, KeyRow};
use crate::quorum;

/// A leader, as the nodes record it: who leads, and in which term.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Leader {
    /// The candidate's identity, as given to [`Redlock::election`](crate::Redlock::election)
    /// (by default [`default_identity`](crate::default_identity)).
    pub identity: String,
    /// The term: the fencing token the leader's lock was issued. Strictly greater than every
    /// earlier leader's term.
    pub term: u64,
}

impl fmt::Display for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (term {})", self.identity, self.term)
    }
}

/// The record's value.
pub(super) fn encode(leader: &Leader, token: &str) -> String {
    format!("{} {token} {}", leader.term, leader.identity)
}

/// The leader and its lock token from a record's value, if it is one.
pub(super) fn decode(value: &str) -> Option<(Leader, &str)> {
    let mut fields = value.splitn(3, ' ');
    let term = fields.next()?.parse().ok()?;
    let token = fields.next().filter(|t| !t.is_empty())?;
    let identity = fields.next().filter(|i| !i.is_empty())?;
    Some((
        Leader {
            identity: identity.to_owned(),
            term,
        },
        token,
    ))
}

/// Makes `write` on every node in parallel, each bounded by the node timeout; returns how
/// many nodes made it. Advisory: a record missing on some node only hides the leader from
/// [`read`] there.
pub(super) async fn write_everywhere(shared: &Shared, write: GuardedWrite) -> usize {
    let timeout = shared.config.node_timeout;
    let calls = shared.nodes.iter().map(|node| {
        let call = crate::node::write_if_held(&**node, write.clone());
        async move { matches!(tokio::time::timeout(timeout, call).await, Ok(Ok(true))) }
    });
    let written = futures::future::join_all(calls).await;
    written.into_iter().filter(|made| *made).count()
}

/// A write of the record (or, with `value: None`, its deletion) guarded by the lock.
pub(super) fn guarded(
    lock_key: &Arc<str>,
    record_key: &Arc<str>,
    token: &str,
    value: Option<String>,
    ttl: std::time::Duration,
) -> GuardedWrite {
    GuardedWrite {
        lock_key: Arc::clone(lock_key),
        token: Arc::from(token),
        key: Arc::clone(record_key),
        value: value.map(Arc::from),
        ttl_ms: millis(ttl),
    }
}

/// Reads the lock key and the record on every node; the leader is the one whose token and
/// record a majority of nodes hold.
pub(super) async fn read(
    shared: &Shared,
    lock_key: &str,
    record_key: &str,
) -> Result<Option<Leader>, Error> {
    let keys: Arc<[String]> = Arc::from(vec![lock_key.to_owned(), record_key.to_owned()]);
    let replies = shared
        .ask_every_node(|node| {
            let keys = Arc::clone(&keys);
            async move { crate::node::inspect(&*node, keys, false).await }
        })
        .await;
    let nodes = shared.nodes.len();
    let quorum = quorum::quorum(nodes);
    let mut votes: HashMap<(Leader, String), usize> = HashMap::new();
    let mut errors = Vec::new();
    for reply in replies {
        match reply {
            Ok(rows) => {
                if let Some(vote) = vote(&rows) {
                    *votes.entry(vote).or_default() += 1;
                }
            }
            Err(error) => errors.push(error),
        }
    }
    if let Some(((leader, _), _)) = votes.into_iter().find(|(_, n)| *n >= quorum) {
        return Ok(Some(leader));
    }
    let answered = nodes - errors.len();
    if answered < quorum {
        return Err(Error::QuorumUnreachable {
            granted: answered,
            denied: 0,
            quorum,
            nodes,
            errors,
        });
    }
    Ok(None)
}

/// What one node says: the leader whose record matches the token its lock key holds.
fn vote(rows: &[KeyRow]) -> Option<(Leader, String)> {
    let [(_, Some(lock), _), (_, Some(record), _)] = rows else {
        return None;
    };
    let record = std::str::from_utf8(record).ok()?;
    let (leader, token) = decode(record)?;
    (token.as_bytes() == lock.as_slice()).then(|| (leader, token.to_owned()))
}
