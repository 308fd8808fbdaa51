//! The one connection holder ([`Holder`]) of every voter and of the Redis fencing counter, and a
//! server's connection over it ([`ServerConnection`]): redis-rs's multiplexed,
//! auto-reconnecting connection to the server a [`Source`] names (its address, or the master
//! the sentinels name).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{
    Client, Cmd, ErrorKind, Pipeline, ProtocolVersion, PushInfo, PushKind, RedisError, RedisFuture,
    Value,
};
use tokio_util::task::TaskTracker;

use super::batch::{Link, PATIENCE, Replies, Run};
use super::identity::Identity;
use crate::clock;
use crate::error::NodeFailure;

/// The first wait before a new connection after a connect-time failure; it doubles with each
/// failure in a row, up to [`MAX_RECONNECT_DELAY`].
const FIRST_RECONNECT_DELAY: Duration = Duration::from_millis(100);
/// The longest wait before a new connection after a connect-time failure.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(2);

/// A connection made once and shared by every call, counted by generation.
///
/// Behaviour:
/// - **Made lazily, in a task of its own**, bounded by the connect timeout: a call given up at
///   `node_timeout` does not abandon it, so a later call finds it made (finding a server
///   through others, the sentinels or a cluster's seeds, takes several round trips).
/// - **Shared**: callers that come while it is being made wait for that making; those that
///   waited for a making that failed get its error instead of trying again one after the other.
/// - **Generations**: every connection made counts one more, so that what a caller learnt of
///   one (a failure, a server's features) touches nothing newer.
/// - **Refusals remembered**: a refusal at connect time (a wrong password, a disabled user, a
///   failed TLS handshake), which redis-rs never retries, drops the connection; calls then fail
///   at once with it until a backoff (100 ms, doubling up to 2 s) has passed.
/// - **Renewable**: a new connection made in the background takes the place of the current one
///   once made, spaced, never over a newer generation (see [`renew`](Self::renew)).
pub(crate) struct Holder<C> {
    state: Arc<Mutex<State<C>>>,
    /// Held while a connection is being made.
    making: Arc<tokio::sync::Mutex<()>>,
    connect_timeout: Duration,
    /// The least time between the end of one [`renew`](Self::renew) and the start of the next.
    renewal_spacing: Duration,
    /// Where makings run, so that `Redlock::close` can wait for them.
    tasks: TaskTracker,
}

/// What a [`Holder`] holds.
struct State<C> {
    /// The connection and its generation.
    current: Option<(u64, C)>,
    /// How many connections were made: the generation of the last one.
    made: u64,
    refusals: Refusals,
    /// The last failed making: when it ended, and why. Callers that were already waiting
    /// for it get its error.
    failed: Option<(tokio::time::Instant, RedisError)>,
    /// Whether a [`Holder::renew`] is under way.
    renewing: bool,
    /// When the last [`Holder::renew`] ended.
    renewed_at: Option<tokio::time::Instant>,
}

/// Refusals at connect time in a row (a wrong password, a disabled user, a failed TLS
/// handshake): after one, calls fail at once with the same error until a backoff (100 ms,
/// doubling up to 2 s) has passed; then the next call connects again.
#[derive(Default)]
pub(crate) struct Refusals {
    /// Connect-time failures in a row.
    failures: u32,
    /// The last connect-time failure, returned until `retry_at`.
    last_error: Option<RedisError>,
    retry_at: Option<Instant>,
}

impl Refusals {
    /// `Err` with the last refusal while its backoff lasts.
    pub(crate) fn check(&self) -> Result<(), RedisError> {
        match (self.retry_at, &self.last_error) {
            (Some(at), Some(err)) if clock::now() < at => Err(err.clone()),
            _ => Ok(()),
        }
    }

    /// Notes a failed connect: a refusal starts (or lengthens) the backoff. Other failures
    /// (refused TCP connections, time-outs) are retried by the next call at once.
    pub(crate) fn record(&mut self, err: &RedisError) {
        if !needs_new_connection(err) {
            return;
        }
        self.failures = self.failures.saturating_add(1);
        self.retry_at = Some(clock::now() + reconnect_delay(self.failures));
        self.last_error = Some(err.clone());
        tracing::debug!(%err, failures = self.failures, "connection refused at connect time; a new one will be made");
    }

    /// A connection worked: the run of refusals is over.
    pub(crate) fn clear(&mut self) {
        *self = Refusals::default();
    }

    fn any(&self) -> bool {
        self.failures > 0
    }
}

impl<C: Clone + Send + 'static> Holder<C> {
    /// Nothing made yet; `connect_timeout` bounds each making, and spaces renewals until
    /// [`renewals_spaced`](Self::renewals_spaced) says otherwise.
    pub(crate) fn new(connect_timeout: Duration) -> Self {
        Holder {
            state: Arc::new(Mutex::new(State {
                current: None,
                made: 0,
                refusals: Refusals::default(),
                failed: None,
                renewing: false,
                renewed_at: None,
            })),
            making: Arc::default(),
            connect_timeout,
            renewal_spacing: connect_timeout,
            tasks: TaskTracker::new(),
        }
    }

    /// Leaves at least `spacing` between the end of one renewal and the start of the next.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn renewals_spaced(mut self, spacing: Duration) -> Self {
        self.renewal_spacing = spacing;
        self
    }

    /// The same, with its makings tracked by `tasks`.
    pub(crate) fn tracked_by(self, tasks: TaskTracker) -> Self {
        Holder { tasks, ..self }
    }

    fn state(&self) -> MutexGuard<'_, State<C>> {
        lock(&self.state)
    }

    /// The connection now, if one is made, with its generation.
    pub(crate) fn current(&self) -> Option<(u64, C)> {
        self.state().current.clone()
    }

    /// The connection and its generation, made by `make` (in a task of its own, bounded by
    /// the connect timeout) when there is none. Fails at once with the last connect-time
    /// refusal while its backoff lasts.
    pub(crate) async fn get_or_make<Fut>(
        &self,
        make: impl FnOnce() -> Fut + Send + 'static,
    ) -> Result<(u64, C), RedisError>
    where
        Fut: Future<Output = Result<C, RedisError>> + Send,
    {
        {
            let state = self.state();
            if let Some(current) = &state.current {
                return Ok(current.clone());
            }
            state.refusals.check()?;
        }
        let (state, making, timeout) = (
            Arc::clone(&self.state),
            Arc::clone(&self.making),
            self.connect_timeout,
        );
        let asked = tokio::time::Instant::now();
        let task = self.tasks.spawn(async move {
            let _making = making.lock().await;
            {
                let state = lock(&state);
                if let Some(current) = &state.current {
                    return Ok(current.clone());
                }
                if let Some((at, err)) = &state.failed
                    && *at > asked
                {
                    return Err(err.clone());
                }
                state.refusals.check()?;
            }
            let made = match tokio::time::timeout(timeout, make()).await {
                Ok(made) => made,
                Err(_) => Err(RedisError::from((
                    ErrorKind::Io,
                    "no connection within the connect timeout",
                ))),
            };
            let mut state = lock(&state);
            match made {
                Ok(conn) => Ok((state.install(conn.clone()), conn)),
                Err(err) => {
                    state.failed = Some((tokio::time::Instant::now(), err.clone()));
                    state.refusals.record(&err);
                    Err(err)
                }
            }
        });
        task.await
            .map_err(|err| RedisError::from((ErrorKind::Io, "connect task", err.to_string())))?
    }

    /// Drops the connection of `generation` if it is still the current one (a newer one
    /// stands): the next call makes a new one.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn forget(&self, generation: u64) {
        self.state().forget(generation);
    }

    /// Makes a new connection with `make`, in a task of its own, and puts it in place of the
    /// connection of `generation` once made; calls go on with that one meanwhile (the members
    /// of a cluster that answer keep answering), and a failed making leaves it in place. Only
    /// when `generation` is still the current one, no renewal is under way, and the last one
    /// ended at least the renewal spacing ago: a server that stays hung costs one renewal at
    /// a time, not one per call. Does not block; outside a Tokio runtime, does nothing.
    pub(crate) fn renew<Fut>(&self, generation: u64, make: impl FnOnce() -> Fut + Send + 'static)
    where
        Fut: Future<Output = Result<C, RedisError>> + Send + 'static,
    {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let mut state = self.state();
        let now = tokio::time::Instant::now();
        let recent = state
            .renewed_at
            .is_some_and(|at| now.duration_since(at) < self.renewal_spacing);
        if state.renewing || recent || !state.holds(generation) {
            return;
        }
        state.renewing = true;
        drop(state);
        let (state, timeout) = (Arc::clone(&self.state), self.connect_timeout);
        self.tasks.spawn(async move {
            let made = tokio::time::timeout(timeout, make()).await;
            let mut state = lock(&state);
            state.renewing = false;
            state.renewed_at = Some(tokio::time::Instant::now());
            // Not over a newer connection; in place of a forgotten one, as the next call
            // would make.
            if let Ok(Ok(conn)) = made
                && (state.current.is_none() || state.holds(generation))
            {
                state.install(conn);
            }
        });
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<C> State<C> {
    /// Makes `conn` the current connection, of a new generation, which it returns.
    fn install(&mut self, conn: C) -> u64 {
        self.made += 1;
        self.current = Some((self.made, conn));
        self.failed = None;
        self.made
    }

    /// Whether the current connection is that of `generation`.
    fn holds(&self, generation: u64) -> bool {
        self.current
            .as_ref()
            .is_some_and(|(current, _)| *current == generation)
    }

    /// Drops the connection of `generation`, if it is the current one.
    fn forget(&mut self, generation: u64) {
        if self.holds(generation) {
            self.current = None;
        }
    }

    /// Drops the connection of `generation` after `err`, a refusal at connect time (see
    /// [`needs_new_connection`]): the next call after the backoff makes a new one.
    fn refused(&mut self, generation: u64, err: &RedisError) {
        if self.holds(generation) {
            self.current = None;
            self.refusals.record(err);
        }
    }

    /// The connection of `generation` answered: a run of refusals is over.
    fn answered(&mut self, generation: u64) {
        if self.refusals.any() && self.holds(generation) {
            self.refusals.clear();
        }
    }
}

/// Where a server's connection comes from.
#[derive(Clone)]
pub(crate) enum Source {
    /// The server a client points at (TCP, TLS, a Unix socket): redis-rs's connection manager
    /// reconnects to it by itself after I/O errors.
    Direct(Arc<Client>),
    /// The master a Sentinel group names: asked again after a failure that may mean it is no
    /// longer the master, or once calls have gone unanswered for [`PATIENCE`].
    #[cfg(feature = "sentinel")]
    Sentinels(Arc<super::sentinel::Sentinels>),
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
        }
    }
}

/// One connection to a server, and the server it goes to.
#[derive(Clone)]
pub(crate) struct Server {
    /// The client it was made from (for a dedicated pub/sub connection to the same server).
    #[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
    pub(crate) client: Arc<Client>,
    /// The server's address (`host:port`).
    pub(crate) addr: Arc<str>,
    pub(crate) manager: ConnectionManager,
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
                .map(|(_, server)| Client::clone(&server.client)),
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
        }
    }

    /// The shared connection (a cheap clone). Fails at once with the last connect-time
    /// failure while its backoff lasts.
    pub(crate) async fn connection(&self) -> Result<Connection, RedisError> {
        let make = self.maker(None);
        let (generation, server) = self.holder.get_or_make(make).await?;
        let conn = Connection {
            manager: server.manager,
            state: Arc::clone(&self.holder.state),
            generation,
            identity: self.identity.clone(),
            asks_again: !matches!(self.source, Source::Direct(_)),
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
    ) -> impl FnOnce() -> BoxFuture<'static, Result<Server, RedisError>> + Send + 'static {
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
                            client,
                            addr,
                            manager,
                        }
                    }
                    #[cfg(feature = "sentinel")]
                    Source::Sentinels(sentinels) => {
                        sentinels.first_master(&settings, not_at).await?
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

    /// Asks the source again, in the background, after calls on the connection of
    /// `generation` went unanswered for [`PATIENCE`]: the sentinels may have promoted a
    /// replica. The connection is replaced only by one to another server (a new one to the
    /// same server could run a call before those still waiting in the old one). A direct
    /// source keeps its connection.
    fn renew(&self, generation: u64) {
        if matches!(self.source, Source::Direct(_)) {
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
    manager: ConnectionManager,
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
fn asks_again(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_unrecoverable_error()
        || is_not_master(err.code())
}

/// Whether a server error `code` says the server does not take a master's writes now.
fn is_not_master(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("READONLY" | "MASTERDOWN" | "LOADING" | "NOAUTH" | "WRONGPASS" | "NOREPLICAS")
    )
}

/// Whether `err` says that the connection itself is unusable in a way redis-rs does not
/// recover from (it reconnects after I/O errors only): the handshake's authentication
/// failed, the server asks for authentication, or the connection failed on the client's side
/// before any command (a native-tls handshake error).
fn needs_new_connection(err: &RedisError) -> bool {
    !err.is_io_error()
        && (matches!(
            err.kind(),
            ErrorKind::AuthenticationFailed | ErrorKind::Client
        ) || err.code().is_some_and(is_auth_refusal))
}

/// Whether a server error `code` refuses the connection's authentication (a user disabled, a
/// password set or changed after we connected): the connection must be made anew.
pub(super) fn is_auth_refusal(code: &str) -> bool {
    matches!(code, "NOAUTH" | "WRONGPASS")
}

/// The wait before the next connection after `failures` connect-time failures in a row.
fn reconnect_delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_RECONNECT_DELAY
        .saturating_mul(1 << doublings)
        .min(MAX_RECONNECT_DELAY)
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = self.manager.req_packed_command(cmd).await;
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
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.observe(&result, result.as_deref().unwrap_or_default());
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.manager.get_db()
    }
}

/// A server's link that asks its source again once calls have gone unanswered for
/// [`PATIENCE`] (a Sentinel source; a direct one keeps its connection, which redis-rs
/// reconnects by itself).
///
/// A master that hangs is kept: its connection carries the calls made before, and a call
/// sent now goes behind them, so when it resumes a release runs after its acquire. Only once
/// calls have gone unanswered for the window are the sentinels asked again (they may have
/// promoted a replica by then); the connection is replaced only if they name another server.
pub(super) struct Patient<L> {
    link: L,
    connection: Arc<ServerConnection>,
    /// Since when calls on the connection of `generation` have gone unanswered.
    stalled_since: Option<tokio::time::Instant>,
    generation: u64,
}

impl<L> Patient<L> {
    /// `link`, over `connection`.
    pub(super) fn new(link: L, connection: Arc<ServerConnection>) -> Self {
        Patient {
            link,
            connection,
            stalled_since: None,
            generation: 0,
        }
    }
}

impl<L: Link> Link for Patient<L> {
    async fn send<'a>(
        &'a mut self,
        runs: &'a [Run],
        timeout: Duration,
        deadline: std::pin::Pin<&'a mut tokio::time::Sleep>,
    ) -> Result<Replies, NodeFailure> {
        let result = self.link.send(runs, timeout, deadline).await;
        if matches!(self.connection.source, Source::Direct(_)) {
            return result;
        }
        match (&result, self.connection.holder.current()) {
            (Err(NodeFailure::Timeout(_)), Some((generation, _))) => {
                if generation != self.generation {
                    self.generation = generation;
                    self.stalled_since = None;
                }
                let now = tokio::time::Instant::now();
                let since = *self.stalled_since.get_or_insert(now);
                if now.duration_since(since) >= PATIENCE {
                    self.connection.renew(generation);
                }
            }
            _ => self.stalled_since = None,
        }
        result
    }
}

#[cfg(test)]
mod tests;
