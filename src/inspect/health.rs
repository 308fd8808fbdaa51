//! [`Redlock::check`](crate::Redlock::check): the node settings that can break a lock's
//! promises, read from every node.

use crate::error::NodeFailure;

/// What [`Redlock::check`](crate::Redlock::check) found on one node.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NodeCheck {
    /// The node's position in the order the builder was given.
    pub index: usize,
    /// The node's address, without credentials.
    pub addr: String,
    /// Its `maxmemory-policy`, or why it could not be read (e.g. `CONFIG` is not allowed for
    /// this user, or renamed by the provider).
    pub maxmemory_policy: Result<String, NodeFailure>,
    /// The server's `run_id` (`INFO server`): `None` when it could not be read (e.g. `INFO`
    /// is not allowed for this user) or the voter is a cluster.
    pub run_id: Option<String>,
    /// The index of an earlier node that is the **same server** (the same `run_id`), reached
    /// at another address: a Sentinel group and its master's own URL, two proxies in front of
    /// one server. Its vote counts twice, so a lock can be granted without a true majority.
    pub same_server_as: Option<usize>,
}

impl NodeCheck {
    /// Whether the node may evict a lock key before its TTL ends: any `maxmemory-policy` but
    /// `noeviction` (the `volatile-*` policies too: every lock key has a TTL). An eviction
    /// can let a second owner in; on a `RedisCounter` primary it makes tokens go backwards.
    /// `false` when the policy could not be read.
    pub fn may_evict_locks(&self) -> bool {
        self.maxmemory_policy
            .as_deref()
            .is_ok_and(|policy| policy != "noeviction")
    }
}
