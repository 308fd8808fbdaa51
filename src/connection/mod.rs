//! The one connection holder ([`Holder`]) of every voter and of the Redis fencing counter, and a
//! server's connection over it ([`ServerConnection`], in `server.rs`): redis-rs's multiplexed,
//! auto-reconnecting connection to the server a [`Source`] names (its address, or the master
//! the sentinels name: [`Sentinels`], in `sentinel.rs`), made from a URL and its [`Tls`]
//! settings (`connect.rs`). Below the node layer, which sends over these connections, the
//! fencing counter and `NodeAddr`; it imports none of them.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use redis::{ErrorKind, RedisError};
use tokio_util::task::TaskTracker;

use crate::clock;
use crate::error::{Class, NodeFailure};

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
    failed: Option<(tokio::time::Instant, NodeFailure)>,
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
    pub(crate) async fn get_or_make<Fut, E>(
        &self,
        make: impl FnOnce() -> Fut + Send + 'static,
    ) -> Result<(u64, C), NodeFailure>
    where
        Fut: Future<Output = Result<C, E>> + Send,
        E: Into<NodeFailure>,
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
                Ok(made) => made.map_err(Into::into),
                Err(_) => Err(NodeFailure::Timeout(timeout)),
            };
            let mut state = lock(&state);
            match made {
                Ok(conn) => Ok((state.install(conn.clone()), conn)),
                Err(failure) => {
                    state.failed = Some((tokio::time::Instant::now(), failure.clone()));
                    if let Some(err) = failure.redis() {
                        state.refusals.record(err);
                    }
                    Err(failure)
                }
            }
        });
        task.await
            .map_err(|_| NodeFailure::NotRun("the connect task stopped (its runtime shut down)"))?
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
    pub(crate) fn renew<Fut, E>(&self, generation: u64, make: impl FnOnce() -> Fut + Send + 'static)
    where
        Fut: Future<Output = Result<C, E>> + Send + 'static,
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

/// Whether `err` says that the connection itself is unusable in a way redis-rs does not
/// recover from (it reconnects after I/O errors only): the handshake's authentication
/// failed, the server asks for authentication, or the connection failed on the client's side
/// before any command (a native-tls handshake error).
fn needs_new_connection(err: &RedisError) -> bool {
    match Class::of(err) {
        Class::LoginRefused => true,
        // `Client`: failed on the client's side before any command (a native-tls handshake).
        Class::Unreached => err.kind() == ErrorKind::Client,
        _ => false,
    }
}

/// The wait before the next connection after `failures` connect-time failures in a row.
fn reconnect_delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_RECONNECT_DELAY
        .saturating_mul(1 << doublings)
        .min(MAX_RECONNECT_DELAY)
}

pub(crate) mod connect;
#[cfg(feature = "sentinel")]
mod sentinel;
mod server;

pub use connect::Tls;

#[cfg(feature = "sentinel")]
pub(crate) use sentinel::Sentinels;
pub(crate) use server::{Connection, ServerConnection, Source};

#[cfg(test)]
mod tests;
