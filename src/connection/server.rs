//! A server's connection over the one [`Holder`]: redis-rs's multiplexed, auto-reconnecting
//! connection to the server a [`Source`] names, reporting to the server's identity.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{
    Client, Cmd, Pipeline, ProtocolVersion, PushInfo, PushKind, RedisError, RedisFuture, Value,
};
use tokio_util::task::TaskTracker;

use super::{Holder, State, lock, needs_new_connection};
use crate::error::NodeFailure;
use crate::memory::identity::Identity;

/// Where a server's connection comes from.
#[derive(Clone)]
pub(crate) enum Source {
    /// The server a client points at (TCP, TLS, a Unix socket): redis-rs's connection manager
    /// reconnects to it by itself after I/O errors.
    Direct(Arc<Client>),
    /// The master a Sentinel group names: asked again after a failure that may mean it is no
    /// longer the master, or once calls have gone unanswered for the patience window (see
    /// [`renew`](ServerConnection::renew)).
    #[cfg(feature = "sentinel")]
    Sentinels(Arc<super::sentinel::Sentinels>),
    /// A simulated server (feature `testing`): connections that reconnect by themselves, as
    /// a direct source's do.
    #[cfg(any(test, feature = "testing"))]
    Sim(crate::testing::SimEndpoint),
}

impl Source {
    /// How the server is named in messages and in the other voters' rosters: its address and
    /// database, or the Sentinel group's name for the master.
    pub(crate) fn name(&self) -> String {
        match self {
            Source::Direct(client) => {
                let info = client.get_connection_info();
                format!("{}/{}", info.addr(), info.redis_settings().db())
            }
            #[cfg(feature = "sentinel")]
            Source::Sentinels(sentinels) => sentinels.name().to_owned(),
            #[cfg(any(test, feature = "testing"))]
            Source::Sim(endpoint) => endpoint.name(),
        }
    }

    /// Whether its connections reconnect by themselves, to the same server (not a Sentinel
    /// source's, which asks again where the master is).
    fn direct(&self) -> bool {
        match self {
            Source::Direct(_) => true,
            #[cfg(feature = "sentinel")]
            Source::Sentinels(_) => false,
            #[cfg(any(test, feature = "testing"))]
            Source::Sim(_) => true,
        }
    }
}

/// One connection to a server, and the server it goes to.
#[derive(Clone)]
pub(crate) struct Server {
    /// The client it was made from (for a dedicated pub/sub connection to the same server;
    /// none for a simulated server).
    #[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
    pub(crate) client: Option<Arc<Client>>,
    /// The server's address (`host:port`).
    pub(crate) addr: Arc<str>,
    pub(crate) manager: Manager,
}

/// The connection to a server that redis-rs or a simulation keeps.
#[derive(Clone)]
pub(crate) enum Manager {
    /// redis-rs's multiplexed, auto-reconnecting connection.
    Redis(ConnectionManager),
    /// A connection to a simulated server (feature `testing`).
    #[cfg(any(test, feature = "testing"))]
    Sim(crate::testing::Wire),
}

impl Manager {
    /// The connection to call on.
    fn connection(&mut self) -> &mut (dyn ConnectionLike + Send) {
        match self {
            Manager::Redis(manager) => manager,
            #[cfg(any(test, feature = "testing"))]
            Manager::Sim(wire) => wire,
        }
    }
}

/// A server's connection: one [`Holder`] of redis-rs's multiplexed, auto-reconnecting
/// connection, to the server its [`Source`] names.
///
/// Behaviour, beside the holder's:
/// - a direct source's connection is made at once and connects on first use; its first
///   connect is driven in the background (bounded by the connect timeout), since a call gives
///   up at `node_timeout` and a slow handshake would otherwise never finish;
/// - every lost connection, on any call, is told to the server's identity (redis-rs reconnects
///   after it without a word, and the server may have restarted meanwhile), and so is a new
///   connection (a new master may stand behind it);
/// - a Sentinel source's connection is dropped after a failure that may mean the server is no
///   longer the master (a lost connection, `READONLY`, `NOREPLICAS`, ...): the next call asks
///   the sentinels again.
pub(crate) struct ServerConnection {
    source: Source,
    holder: Holder<Server>,
    connect_timeout: Duration,
    /// The server's identity, told of every connection lost (see [`Connection`]).
    identity: Option<Arc<Identity>>,
    /// The last generation whose first connect was driven (direct source).
    driven: AtomicU64,
    /// Where the background connects run, so that `Redlock::close` can wait for them.
    tasks: TaskTracker,
}

impl ServerConnection {
    /// A connection to the server `source` names, made on first use; connecting may take
    /// up to `connect_timeout`. Callers bound each call themselves.
    pub(crate) fn new(source: Source, connect_timeout: Duration) -> Self {
        ServerConnection {
            source,
            holder: Holder::new(connect_timeout),
            connect_timeout,
            identity: None,
            driven: AtomicU64::new(0),
            tasks: TaskTracker::new(),
        }
    }

    /// The same, with its background connects tracked by `tasks`.
    pub(crate) fn tracked_by(self, tasks: TaskTracker) -> Self {
        ServerConnection {
            holder: self.holder.tracked_by(tasks.clone()),
            tasks,
            ..self
        }
    }

    /// The same, telling `identity` of every connection lost and made (a lock server's: see
    /// [`Connection`]).
    pub(crate) fn reporting_to(self, identity: Arc<Identity>) -> Self {
        ServerConnection {
            identity: Some(identity),
            ..self
        }
    }

    /// A client for a dedicated pub/sub connection to the server: for a Sentinel source, the
    /// master connected to now (`None` before the first connection).
    pub(crate) fn client(&self) -> Option<Client> {
        match &self.source {
            Source::Direct(client) => Some(Client::clone(client)),
            #[cfg(feature = "sentinel")]
            Source::Sentinels(_) => self
                .holder
                .current()
                .and_then(|(_, server)| server.client.as_deref().cloned()),
            #[cfg(any(test, feature = "testing"))]
            Source::Sim(_) => None,
        }
    }

    /// The server's address, for messages: a Sentinel source's master connected to now, or
    /// the voter's name before the first connection.
    pub(crate) fn addr(&self) -> String {
        match &self.source {
            Source::Direct(client) => client.get_connection_info().addr().to_string(),
            #[cfg(feature = "sentinel")]
            Source::Sentinels(sentinels) => self.holder.current().map_or_else(
                || sentinels.name().to_owned(),
                |(_, server)| server.addr.to_string(),
            ),
            #[cfg(any(test, feature = "testing"))]
            Source::Sim(endpoint) => endpoint.name(),
        }
    }

    /// The shared connection (a cheap clone). Fails at once with the last connect-time
    /// failure while its backoff lasts.
    pub(crate) async fn connection(&self) -> Result<Connection, NodeFailure> {
        let make = self.maker(None);
        let (generation, server) = self.holder.get_or_make(make).await?;
        let conn = Connection {
            manager: server.manager,
            state: Arc::clone(&self.holder.state),
            generation,
            identity: self.identity.clone(),
            asks_again: !self.source.direct(),
        };
        if matches!(self.source, Source::Direct(_))
            && self.driven.fetch_max(generation, Ordering::AcqRel) < generation
        {
            // The first connection only progresses while a call polls it, and every call
            // gives up after node_timeout: a handshake slower than that would never
            // finish. Drive it in the background instead (reconnects already are).
            let mut driver = conn.clone();
            let limit = self.connect_timeout;
            self.tasks.spawn(async move {
                let ping = async move { redis::cmd("PING").query_async::<()>(&mut driver).await };
                let _ = tokio::time::timeout(limit, ping).await;
            });
        }
        Ok(conn)
    }

    /// What makes a new connection: to the client's server, or to the master the sentinels
    /// name (not at `not_at`, the one connected to, for a renewal).
    fn maker(
        &self,
        not_at: Option<Arc<str>>,
    ) -> impl FnOnce() -> BoxFuture<'static, Result<Server, NodeFailure>> + Send + 'static {
        let settings = Settings {
            identity: self.identity.clone(),
            connect_timeout: self.connect_timeout,
        };
        let source = self.source.clone();
        move || {
            Box::pin(async move {
                let server = match source {
                    Source::Direct(client) => {
                        let addr = client.get_connection_info().addr().to_string().into();
                        let config = settings.config(&client);
                        let manager = ConnectionManager::new_lazy_with_config(
                            Client::clone(&client),
                            config,
                        )?;
                        Server {
                            client: Some(client),
                            addr,
                            manager: Manager::Redis(manager),
                        }
                    }
                    #[cfg(any(test, feature = "testing"))]
                    Source::Sim(endpoint) => Server {
                        client: None,
                        addr: endpoint.name().into(),
                        manager: Manager::Sim(endpoint.connect()),
                    },
                    #[cfg(feature = "sentinel")]
                    Source::Sentinels(sentinels) => {
                        let connect = async |client: Client, addr| {
                            let config = settings.config(&client);
                            let manager =
                                ConnectionManager::new_with_config(client.clone(), config).await?;
                            Ok(Server {
                                client: Some(Arc::new(client)),
                                addr,
                                manager: Manager::Redis(manager),
                            })
                        };
                        sentinels.first_master(connect, not_at).await?
                    }
                };
                #[cfg(not(feature = "sentinel"))]
                let _ = not_at;
                // Another server may stand behind it (a failover): read it before its votes
                // count.
                if let Some(identity) = &settings.identity {
                    identity.suspect();
                }
                Ok(server)
            })
        }
    }

    /// Whether calls that go unanswered make the source be asked again (a Sentinel group,
    /// see [`renew`](Self::renew)); a direct source's connection is kept, and redis-rs
    /// reconnects it by itself.
    pub(crate) fn asks_again(&self) -> bool {
        !self.source.direct() || renews_direct()
    }

    /// The generation of the connection now, if one is made.
    pub(crate) fn generation(&self) -> Option<u64> {
        self.holder.current().map(|(generation, _)| generation)
    }

    /// Asks the source again, in the background, after calls on the connection of
    /// `generation` went unanswered for the patience window (the server link's): the
    /// sentinels may have promoted a replica. The connection is replaced only by one to
    /// another server (a new one to the same server could run a call before those still
    /// waiting in the old one). A direct source keeps its connection.
    pub(crate) fn renew(&self, generation: u64) {
        if self.source.direct() && !renews_direct() {
            return;
        }
        let Some((current, server)) = self.holder.current() else {
            return;
        };
        if current == generation {
            tracing::debug!(
                "the master has not answered for the patience window; asking the sentinels again"
            );
            self.holder.renew(generation, self.maker(Some(server.addr)));
        }
    }
}

/// Whether a direct source's connection is renewed like a Sentinel source's (a planted bug:
/// the connection to the same server is remade under the calls still waiting on it).
fn renews_direct() -> bool {
    crate::plant::on(crate::plant::Plant::ReleaseOvertakesAcquire)
}

/// How a connection manager to a server is configured.
#[derive(Clone)]
pub(super) struct Settings {
    /// The server's identity, told of a disconnection notice (RESP3).
    identity: Option<Arc<Identity>>,
    connect_timeout: Duration,
}

impl Settings {
    /// The configuration of a connection manager to `client`'s server.
    pub(super) fn config(&self, client: &Client) -> ConnectionManagerConfig {
        let mut config = ConnectionManagerConfig::new();
        // Over RESP3 redis-rs reconnects as soon as the server closes the connection, between
        // calls, so no call sees the loss: its disconnection notice makes the server suspect.
        if let Some(identity) = &self.identity
            && client.get_connection_info().redis_settings().protocol() == ProtocolVersion::RESP3
        {
            let identity = Arc::clone(identity);
            config = config.set_push_sender(move |push: PushInfo| {
                if push.kind == PushKind::Disconnection {
                    identity.suspect();
                }
                Ok::<(), std::convert::Infallible>(())
            });
        }
        config
            .set_connection_timeout(Some(self.connect_timeout))
            // Every call is bounded by node_timeout in the quorum logic; a response
            // timeout here would only race with it.
            .set_response_timeout(None)
            // One attempt per connect: a failed one ends at once with its error (refused,
            // untrusted certificate), so that calls report it instead of timing out behind a
            // retry loop; the next call that finds the connection failed starts a new one.
            .set_number_of_retries(0)
            // Reconnect quickly after a node restarts.
            .set_max_delay(Duration::from_secs(1))
    }
}

/// The connection a call uses: the shared manager, reporting connect-time failures back to
/// its [`Holder`], and every lost connection to the server's identity, whatever the call (a
/// lock call, an advisory one): redis-rs reconnects after it without a word, and the server
/// may have restarted meanwhile, so its votes must not count before its identity is read
/// again.
#[derive(Clone)]
pub(crate) struct Connection {
    manager: Manager,
    state: Arc<Mutex<State<Server>>>,
    generation: u64,
    identity: Option<Arc<Identity>>,
    /// Whether a failure that may mean the server is no longer the master drops the
    /// connection, so that the source is asked again (Sentinel).
    asks_again: bool,
}

impl Connection {
    /// Counts the connections made to this server (a new one after a connect-time refusal,
    /// a new master): what a caller learnt of the server on one holds for the same generation.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Notes how a command ended: a lost connection makes the server suspect of a restart
    /// (its identity is read before the next lock call, and its votes do not count until
    /// then); a connect-time failure drops the connection (the next call after the backoff
    /// makes a new one); with a Sentinel source, a failure that may mean the server is no
    /// longer the master drops it too; a success ends a run of failures.
    fn observe<T>(&self, result: &Result<T, RedisError>, replies: &[Value]) {
        if let (Err(err), Some(identity)) = (result, &self.identity)
            && (err.is_io_error() || err.is_connection_dropped())
        {
            identity.suspect();
        }
        let mut state = lock(&self.state);
        match result {
            Err(err) if needs_new_connection(err) => state.refused(self.generation, err),
            Err(err) if self.asks_again && asks_again(err) => state.forget(self.generation),
            Ok(_)
                if self.asks_again
                    && replies.iter().any(|reply| {
                        matches!(reply, Value::ServerError(err) if is_not_master(Some(err.code())))
                    }) =>
            {
                state.forget(self.generation);
            }
            Ok(_) => state.answered(self.generation),
            Err(_) => {}
        }
    }
}

/// Whether `err` may mean that a Sentinel source's server is no longer the master (its
/// connection broke, it was demoted, it refuses writes): the sentinels are asked again.
pub(super) fn asks_again(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_unrecoverable_error()
        || is_not_master(err.code())
}

/// Whether a server error `code` says the server does not take a master's writes now.
pub(super) fn is_not_master(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("READONLY" | "MASTERDOWN" | "LOADING" | "NOAUTH" | "WRONGPASS" | "NOREPLICAS")
    )
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = self.manager.connection().req_packed_command(cmd).await;
            self.observe(&result, &[]);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let result = self
                .manager
                .connection()
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.observe(&result, result.as_deref().unwrap_or_default());
            result
        })
    }

    fn get_db(&self) -> i64 {
        match &self.manager {
            Manager::Redis(manager) => manager.get_db(),
            #[cfg(any(test, feature = "testing"))]
            Manager::Sim(wire) => wire.get_db(),
        }
    }
}
