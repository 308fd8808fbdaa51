//! One lazily made, shared, auto-reconnecting connection to a Redis server, which also
//! recovers from failures that redis-rs's `ConnectionManager` never retries (a wrong password
//! or a user disabled at connect time): the manager is then replaced, with backoff.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{
    Client, Cmd, ErrorKind, Pipeline, ProtocolVersion, PushInfo, PushKind, RedisError, RedisFuture,
    Value,
};
use tokio_util::task::TaskTracker;

use super::identity::Identity;
use crate::clock;

/// The first wait before a new connection after a connect-time failure; it doubles with each
/// failure in a row, up to [`MAX_RECONNECT_DELAY`].
const FIRST_RECONNECT_DELAY: Duration = Duration::from_millis(100);
/// The longest wait before a new connection after a connect-time failure.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(2);

/// One multiplexed, auto-reconnecting connection to a Redis server, made on first use
/// (inside the caller's runtime) and shared by every call.
///
/// redis-rs's `ConnectionManager` reconnects after I/O errors only: a connection whose
/// handshake failed otherwise (`WRONGPASS`, `NOAUTH`, a native-tls handshake error) would
/// fail every call for the life of the process. Such a failure drops the manager; the next call after a backoff (100 ms,
/// doubling up to 2 s) makes a new one, and calls before then fail at once with the same error.
pub(crate) struct LazyConnection {
    client: Client,
    slot: Arc<Mutex<Slot>>,
    connect_timeout: Duration,
    /// Where the background connect runs, so that `Redlock::close` can wait for it.
    tasks: TaskTracker,
    /// The server's identity, told of every connection lost (see [`Connection`]).
    identity: Option<Arc<Identity>>,
}

/// The current manager, or why there is none and when to try again.
#[derive(Default)]
struct Slot {
    manager: Option<ConnectionManager>,
    /// Counts managers made, so that a stale connection's failure drops nothing newer.
    generation: u64,
    refusals: Refusals,
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

/// The connection a call uses: the shared manager, reporting connect-time failures back to
/// its [`LazyConnection`], and every lost connection to the server's identity, whatever the
/// call (a lock call, an advisory one): redis-rs reconnects after it without a word, and the
/// server may have restarted meanwhile, so its votes must not count before its identity is
/// read again.
#[derive(Clone)]
pub(crate) struct Connection {
    manager: ConnectionManager,
    slot: Arc<Mutex<Slot>>,
    generation: u64,
    identity: Option<Arc<Identity>>,
}

impl LazyConnection {
    /// A connection to the server `client` points at, made on first use; connecting may take
    /// up to `connect_timeout`. Callers bound each call themselves.
    pub(crate) fn new(client: Client, connect_timeout: Duration) -> Self {
        LazyConnection {
            client,
            slot: Arc::default(),
            connect_timeout,
            tasks: TaskTracker::new(),
            identity: None,
        }
    }

    /// The same, with its background connect tracked by `tasks`.
    pub(crate) fn tracked_by(self, tasks: TaskTracker) -> Self {
        LazyConnection { tasks, ..self }
    }

    /// The same, telling `identity` of every connection lost (a lock server's: see
    /// [`Connection`]).
    pub(crate) fn reporting_to(self, identity: Arc<Identity>) -> Self {
        LazyConnection {
            identity: Some(identity),
            ..self
        }
    }

    /// The client this connection is made from (for a dedicated pub/sub connection).
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The server's address, for messages.
    pub(crate) fn addr(&self) -> String {
        self.client.get_connection_info().addr().to_string()
    }

    /// The shared connection (a cheap clone). Fails at once with the last connect-time
    /// failure while its backoff lasts.
    pub(crate) async fn connection(&self) -> Result<Connection, RedisError> {
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(manager) = &slot.manager {
            return Ok(Connection {
                manager: manager.clone(),
                slot: Arc::clone(&self.slot),
                generation: slot.generation,
                identity: self.identity.clone(),
            });
        }
        slot.refusals.check()?;
        let mut config = ConnectionManagerConfig::new();
        // Over RESP3 redis-rs reconnects as soon as the server closes the connection, between
        // calls, so no call sees the loss: its disconnection notice makes the server suspect.
        if let Some(identity) = &self.identity
            && self
                .client
                .get_connection_info()
                .redis_settings()
                .protocol()
                == ProtocolVersion::RESP3
        {
            let identity = Arc::clone(identity);
            config = config.set_push_sender(move |push: PushInfo| {
                if push.kind == PushKind::Disconnection {
                    identity.suspect();
                }
                Ok::<(), std::convert::Infallible>(())
            });
        }
        let config = config
            .set_connection_timeout(Some(self.connect_timeout))
            // Every call is bounded by node_timeout in the quorum logic; a response
            // timeout here would only race with it.
            .set_response_timeout(None)
            // One attempt per connect: a failed one ends at once with its error (refused,
            // untrusted certificate), so that calls report it instead of timing out behind a
            // retry loop; the next call that finds the connection failed starts a new one.
            .set_number_of_retries(0)
            // Reconnect quickly after a node restarts.
            .set_max_delay(Duration::from_secs(1));
        let manager = ConnectionManager::new_lazy_with_config(self.client.clone(), config)?;
        slot.generation += 1;
        slot.manager = Some(manager.clone());
        let conn = Connection {
            manager,
            slot: Arc::clone(&self.slot),
            generation: slot.generation,
            identity: self.identity.clone(),
        };
        drop(slot);
        // The first connection only progresses while a call polls it, and every call
        // gives up after node_timeout: a handshake slower than that would never
        // finish. Drive it in the background instead (reconnects already are).
        let mut driver = conn.clone();
        let limit = self.connect_timeout;
        self.tasks.spawn(async move {
            let ping = async move { redis::cmd("PING").query_async::<()>(&mut driver).await };
            let _ = tokio::time::timeout(limit, ping).await;
        });
        Ok(conn)
    }
}

impl Connection {
    /// Counts the connections made to this server (a new one after a connect-time refusal):
    /// what a caller learnt of the server on one holds for the same generation.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Notes how a command ended: a lost connection makes the server suspect of a restart
    /// (its identity is read before the next lock call, and its votes do not count until
    /// then); a connect-time failure drops the manager (the next call after the backoff makes
    /// a new one); a success ends a run of failures.
    fn observe<T>(&self, result: &Result<T, RedisError>) {
        if let (Err(err), Some(identity)) = (result, &self.identity)
            && (err.is_io_error() || err.is_connection_dropped())
        {
            identity.suspect();
        }
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        match result {
            Err(err) if needs_new_connection(err) => {
                if slot.generation != self.generation || slot.manager.is_none() {
                    return; // already replaced
                }
                slot.manager = None;
                slot.refusals.record(err);
            }
            Ok(_) if slot.refusals.any() && slot.generation == self.generation => {
                slot.refusals.clear();
            }
            _ => {}
        }
    }
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
            self.observe(&result);
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
            self.observe(&result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.manager.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reconnect_delay_doubles_up_to_its_cap() {
        assert_eq!(reconnect_delay(1), Duration::from_millis(100));
        assert_eq!(reconnect_delay(2), Duration::from_millis(200));
        assert_eq!(reconnect_delay(5), Duration::from_millis(1600));
        assert_eq!(reconnect_delay(6), MAX_RECONNECT_DELAY);
        assert_eq!(reconnect_delay(u32::MAX), MAX_RECONNECT_DELAY);
    }

    #[test]
    fn only_connect_time_failures_need_a_new_connection() {
        let auth = RedisError::from((ErrorKind::AuthenticationFailed, "WRONGPASS"));
        assert!(needs_new_connection(&auth));
        let tls = RedisError::from((ErrorKind::Client, "handshake failed"));
        assert!(needs_new_connection(&tls));
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(!needs_new_connection(&io));
        let reply = RedisError::from((ErrorKind::UnexpectedReturnType, "not an integer"));
        assert!(!needs_new_connection(&reply));
    }
}
