//! [`RwInspection`]: who holds a read-write lock on each node (advisory, read-only).

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, NodeError};
use crate::inner::Shared;
use crate::inspect::TOKEN_PREFIX_LEN;
use crate::node::RwRow;
use crate::quorum;

/// One holder as a node sees it: the start of its token (its first
/// [`TOKEN_PREFIX_LEN`](crate::TOKEN_PREFIX_LEN) characters, enough to tell holders apart
/// without handing out what could release them) and how long it has left there.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwHolder {
    /// The first characters of the holder's token (a waiting writer's id for
    /// [`RwNodeState::writer_waiting`]).
    pub token_prefix: String,
    /// How long the node keeps it, from the moment it was read.
    pub ttl: Duration,
}

/// A read-write lock on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwNodeState {
    /// The writer, if one holds the lock there.
    pub writer: Option<RwHolder>,
    /// The live readers there.
    pub readers: Vec<RwHolder>,
    /// The waiting writer's mark, if one is waiting there (new readers are refused, but not
    /// those the last writer's release admitted).
    pub writer_waiting: Option<RwHolder>,
}

/// What [`RwLock::inspect`](crate::RwLock::inspect) found: each node's view (or its
/// failure), in the order the builder was given the nodes, and what a majority agrees on.
///
/// Advisory: the nodes are read one by one, not at one instant, and a holder seen on a
/// majority may have expired by the time you look.
#[derive(Clone, Debug)]
pub struct RwInspection {
    name: String,
    nodes: Vec<Result<RwNodeState, NodeError>>,
}

impl RwInspection {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Each node's view, or why it could not be read, in the builder's order.
    pub fn nodes(&self) -> &[Result<RwNodeState, NodeError>] {
        &self.nodes
    }

    /// The token prefix of the writer seen on a majority of nodes, if any.
    pub fn writer(&self) -> Option<&str> {
        let seen = self.views().filter_map(|v| v.writer.as_ref());
        on_majority(seen, self.nodes.len()).into_iter().next()
    }

    /// The token prefixes of the readers seen on a majority of nodes.
    pub fn readers(&self) -> Vec<&str> {
        let seen = self.views().flat_map(|v| v.readers.iter());
        on_majority(seen, self.nodes.len())
    }

    /// Whether a writer waits, as a majority of nodes sees it (new readers are refused, but not
    /// those the last writer's release admitted).
    pub fn writer_waiting(&self) -> bool {
        let waiting = self.views().filter(|v| v.writer_waiting.is_some()).count();
        waiting >= quorum::quorum(self.nodes.len())
    }

    fn views(&self) -> impl Iterator<Item = &RwNodeState> {
        self.nodes.iter().filter_map(|n| n.as_ref().ok())
    }
}

/// The token prefixes among `seen` that a majority of `nodes` holds, in the order first seen.
fn on_majority<'a>(seen: impl Iterator<Item = &'a RwHolder>, nodes: usize) -> Vec<&'a str> {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for holder in seen {
        match counts.iter_mut().find(|(t, _)| *t == holder.token_prefix) {
            Some((_, n)) => *n += 1,
            None => counts.push((&holder.token_prefix, 1)),
        }
    }
    let q = quorum::quorum(nodes);
    counts
        .into_iter()
        .filter(|&(_, n)| n >= q)
        .map(|(t, _)| t)
        .collect()
}

/// Reads `keys` (writer, readers, waiting) on every node at once, each bounded by the node
/// timeout.
pub(super) async fn inspect(
    shared: &Shared,
    name: &str,
    keys: &Arc<[String]>,
) -> Result<RwInspection, Error> {
    shared.check_open()?;
    let nodes = shared
        .ask_every_node(|node| {
            let keys = Arc::clone(keys);
            async move { crate::node::rw_inspect(&*node, keys).await.map(state) }
        })
        .await;
    Ok(RwInspection {
        name: name.to_owned(),
        nodes,
    })
}

/// A node's row as a report.
fn state((writer, writer_ttl, readers, waiting, waiting_ttl): RwRow) -> RwNodeState {
    let holder = |token: &str, ms: i64| RwHolder {
        token_prefix: token.chars().take(TOKEN_PREFIX_LEN).collect(),
        ttl: Duration::from_millis(u64::try_from(ms).unwrap_or(0)),
    };
    RwNodeState {
        writer: writer.map(|w| holder(&w, writer_ttl)),
        readers: readers.iter().map(|(t, ms)| holder(t, *ms)).collect(),
        writer_waiting: waiting.map(|w| holder(&w, waiting_ttl)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_majority_decides_who_holds() {
        let row = |writer: Option<&str>, readers: &[&str]| {
            Ok(state((
                writer.map(str::to_owned),
                1_000,
                readers.iter().map(|r| ((*r).to_owned(), 500)).collect(),
                None,
                -2,
            )))
        };
        let report = RwInspection {
            name: "cfg".into(),
            nodes: vec![
                row(None, &["aaaaaaaa11", "bbbbbbbb22"]),
                row(Some("wwwwwwww33"), &["aaaaaaaa11"]),
                row(None, &["aaaaaaaa11", "bbbbbbbb22"]),
            ],
        };
        assert_eq!(report.writer(), None);
        assert_eq!(report.readers(), ["aaaaaaaa", "bbbbbbbb"]);
        assert!(!report.writer_waiting());
        let Ok(view) = &report.nodes()[1] else {
            panic!("node 1 read")
        };
        assert_eq!(view.readers[0].ttl, Duration::from_millis(500));
        assert_eq!(
            view.writer.as_ref().map(|w| w.ttl),
            Some(Duration::from_secs(1))
        );
    }
}
