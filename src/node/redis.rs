//! One Redis master: its lock calls on the node's queue ([`Queue`], which every kind of voter
//! uses), sent over a lazy, shared `ServerConnection` to the server its source names.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::queue::{Queue, QueuedNode};
use super::server_link::ServerLink;
use crate::connection::{ServerConnection, Source};
use crate::memory::MemoryBook;
use crate::memory::identity::{Identity, QuarantineRule};

/// A Redis master. Every lock's lock calls go through the node's one [`Queue`], which sends
/// them batched over redis-rs's multiplexed connection (whatever the address: TCP, TLS, a Unix
/// socket, the master a Sentinel group names); the advisory calls (`inspect`, guarded writes,
/// `INFO memory`) use the same connection. It is made on first use, inside the caller's
/// runtime, and remade after failures.
pub(crate) struct RedisNode {
    /// The voter: its queue, its address, its identity (run id, quarantine).
    node: QueuedNode,
    shared: Arc<ServerConnection>,
}

impl RedisNode {
    /// A master reached through `source`; `native_commands` as
    /// `RedlockBuilder::native_commands`, `quarantine` as `RedlockBuilder::restart_quarantine`,
    /// its memory judged in `memory` with the other voters', its keys under `key_prefix`.
    pub(crate) fn new(
        source: Source,
        node_timeout: Duration,
        native_commands: bool,
        quarantine: QuarantineRule,
        memory: &Arc<MemoryBook>,
        key_prefix: &str,
        tasks: TaskTracker,
    ) -> Self {
        let addr = source.name();
        let identity = Arc::new(Identity::new(
            quarantine,
            Arc::clone(memory),
            (&addr, key_prefix),
            tasks.clone(),
            connect_timeout(node_timeout),
        ));
        let shared = Arc::new(
            ServerConnection::new(source, connect_timeout(node_timeout))
                .tracked_by(tasks.clone())
                .reporting_to(Arc::clone(&identity)),
        );
        nudge_on_news(memory, &identity, &shared, tasks, node_timeout);
        let connection = Arc::clone(&shared);
        let link_identity = Arc::clone(&identity);
        let queue = Queue::new(&addr, node_timeout, move || {
            ServerLink::new(
                Arc::clone(&connection),
                native_commands,
                Arc::clone(&link_identity),
            )
        });
        RedisNode {
            node: QueuedNode::new(addr, queue, Some(identity)),
            shared,
        }
    }

    /// The voter, as the quorum logic sees it.
    pub(crate) fn into_node(self) -> QueuedNode {
        self.node
    }

    /// A client for a dedicated pub/sub connection to this server, asked for at each connect
    /// of the subscriber. For a Sentinel group's master, the master connected to now: the
    /// subscriber follows a failover when its connection to the old master breaks (a killed
    /// master), and while the old one lives on as a replica, the releases published on the
    /// new master still reach it by replication. `None` before the first connection (waiters
    /// poll until then).
    pub(crate) fn pubsub(&self) -> super::PubSub {
        let shared = Arc::clone(&self.shared);
        super::PubSub::new(move || shared.client())
    }
}

/// Reads the server's memory again in the background, on `connection`, whenever another
/// voter's marker is news to its roster (see [`MemoryBook::on_news`]): bounded like a
/// connect, tracked by `tasks` (which `Redlock::close` waits for), on the runtime of the
/// reading that brought the news.
fn nudge_on_news(
    memory: &Arc<MemoryBook>,
    identity: &Arc<Identity>,
    connection: &Arc<ServerConnection>,
    tasks: TaskTracker,
    node_timeout: Duration,
) {
    let (index, book) = (identity.index(), Arc::downgrade(memory));
    let (identity, connection) = (Arc::downgrade(identity), Arc::downgrade(connection));
    memory.on_news(index, move || {
        let done = {
            let book = book.clone();
            move || {
                if let Some(book) = book.upgrade() {
                    book.nudged(index);
                }
            }
        };
        let (Some(identity), Some(connection), Ok(runtime)) = (
            identity.upgrade(),
            connection.upgrade(),
            tokio::runtime::Handle::try_current(),
        ) else {
            return done();
        };
        // In the node's span, as its queue's lines are: the news may come from any voter.
        let span = tracing::debug_span!(parent: None, "redfence.node", node = %connection.addr());
        let read = async move {
            let conn = connection.connection().await.ok()?;
            identity.check(&conn).await;
            Some(())
        };
        let bound = connect_timeout(node_timeout);
        tasks.spawn_on(
            async move {
                let _ = tokio::time::timeout(bound, read).await;
                done();
            }
            .instrument(span),
            &runtime,
        );
    });
}

/// How long a connect (with its handshake) may take: at least a second, whatever the node
/// timeout, because connecting is not on any lock's critical path.
pub(super) fn connect_timeout(node_timeout: Duration) -> Duration {
    node_timeout.max(Duration::from_secs(1))
}
