//! The connection a node's queue task owns, for a plain `redis://` node over TCP: one socket,
//! written and read by that task alone, so a call crosses no task between the queue and the
//! server (redis-rs's multiplexed connection runs one more, and each hop is a thread wake-up
//! on an idle runtime). TLS and Unix-socket nodes use redis-rs's connection instead
//! (`connection.rs`).
//!
//! - **In order, and safe to give up on** ([`Socket`]): a call given up keeps its place; while
//!   the queue is idle, its task goes on writing what calls given up left unwritten and
//!   reading their replies ([`OwnedConnection::settle`]), so a release cut short still reaches
//!   the node when nothing follows it. A release never overtakes its own acquire. A server
//!   that stops reading holds at most [`MAX_UNSENT`] bytes of ours; calls past that fail at
//!   once.
//! - **Connected in the background.** The connect and its handshake (`AUTH`, `SELECT`, then
//!   loading the caller's script, best effort) run in a task of their own under the connect
//!   timeout, so a handshake slower than the node timeout still finishes; calls meanwhile
//!   time out. With the script loaded at connect, the first call after a restart does not
//!   spend a round trip on `NOSCRIPT`.
//! - **Reconnected.** An I/O error or a reply that is not RESP resets the socket (so that
//!   nothing still unread on it runs after what a new connection sends), and the next call
//!   connects anew. A refusal (`WRONGPASS`, or `NOAUTH` on a connection that had
//!   authenticated) fails calls at once for a backoff before the next try ([`Refusals`]), as
//!   for redis-rs's connection.

use std::io;
use std::time::Duration;

use redis::{Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, RedisResult, Value};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

use super::connection::{Refusals, is_auth_refusal};
use super::socket::{Packed, Socket, only_reply};

/// The most bytes of calls given up that may wait unwritten (the server stopped reading):
/// past that, calls fail at once instead of queueing without bound.
const MAX_UNSENT: usize = 16 * 1024 * 1024;

fn stalled(unsent: usize) -> RedisError {
    RedisError::from(io::Error::new(
        io::ErrorKind::TimedOut,
        format!("the server has not read the last {unsent} bytes sent to it; not sending more"),
    ))
}

/// A node's own connection: the socket when connected, the connect in progress, and the
/// backoff after refusals.
pub(crate) struct OwnedConnection {
    info: ConnectionInfo,
    host: String,
    port: u16,
    /// Sent once on every new connection after the handshake, its reply ignored (e.g.
    /// `SCRIPT LOAD`).
    preload: Option<Cmd>,
    connect_timeout: Duration,
    tasks: TaskTracker,
    socket: Option<Socket>,
    connecting: Option<JoinHandle<RedisResult<Socket>>>,
    refusals: Refusals,
    /// Whether a lock's plain acquire may go as a native command (`SET ... NX GET PX`,
    /// Redis 7 and Valkey) on this connection. Asked again on a new connection.
    natives: Natives,
    /// Never natives, whatever the probe says (the connection-stack A/B's scripts-only arm).
    scripts_only: bool,
}

impl OwnedConnection {
    /// A connection to the plain TCP server `info` names, or `None` for any other kind of
    /// address (TLS, Unix socket): those use redis-rs's connection. Nothing connects yet.
    /// `preload` is sent on every new connection after the handshake; its failure (a user
    /// without the permission) is ignored.
    pub(crate) fn for_plain_tcp(
        info: &ConnectionInfo,
        preload: Option<Cmd>,
        connect_timeout: Duration,
        tasks: TaskTracker,
    ) -> Option<Self> {
        let ConnectionAddr::Tcp(host, port) = info.addr() else {
            return None;
        };
        Some(OwnedConnection {
            info: info.clone(),
            host: host.clone(),
            port: *port,
            preload,
            connect_timeout,
            tasks,
            socket: None,
            connecting: None,
            refusals: Refusals::default(),
            natives: Natives::Untried,
            scripts_only: false,
        })
    }

    /// Whether a socket is connected now (a call on it may find it broken).
    pub(crate) fn is_connected(&self) -> bool {
        self.socket.is_some()
    }

    /// Runs `command` and returns its reply (an error reply as `Ok(Value::ServerError)`).
    /// `Err` when the node could not be reached or the socket broke; the socket is then
    /// dropped and the next call connects anew.
    pub(crate) async fn call(&mut self, command: &Cmd) -> RedisResult<Value> {
        only_reply(
            self.call_all(&Packed::default(), std::slice::from_ref(command))
                .await?,
        )
    }

    /// Runs the `packed` commands, then `commands`, as one pipeline and returns their
    /// replies, in order; otherwise as [`call`](Self::call).
    pub(crate) async fn call_all(
        &mut self,
        packed: &Packed,
        commands: &[Cmd],
    ) -> RedisResult<Vec<Value>> {
        let socket = self.socket().await?;
        if socket.unsent() >= MAX_UNSENT {
            // The server has stopped reading: queue nothing more behind what it has not
            // read. Stalled, not broken: the socket (and the order of what it carries) stays.
            return Err(stalled(socket.unsent()));
        }
        let replies = socket.call_all(packed, commands).await;
        match &replies {
            Err(_) => self.drop_socket(),
            Ok(replies) => {
                // The server forgot who we are (a user disabled, a password set after we
                // connected): connect again, after the refusal's backoff.
                let refusal = replies.iter().find_map(|reply| match reply {
                    Value::ServerError(refusal) if is_auth_refusal(refusal.code()) => Some(refusal),
                    _ => None,
                });
                if let Some(refusal) = refusal {
                    self.refusals.record(&RedisError::from(refusal.clone()));
                    self.drop_socket();
                }
            }
        }
        replies
    }

    /// Whether single-key acquires may go as native commands: connected, and the
    /// connection passed the probe (see [`Natives`]).
    pub(crate) fn takes_natives(&self) -> bool {
        !self.scripts_only && self.socket.is_some() && self.natives == Natives::Allowed
    }

    /// Whether the next script call should carry the probe.
    pub(crate) fn wants_probe(&self) -> bool {
        !self.scripts_only && self.natives == Natives::Untried
    }

    /// Scripts only on this connection, for good (the connection-stack A/B).
    pub(crate) fn scripts_only(&mut self) {
        self.scripts_only = true;
    }

    /// A script call with the probe succeeded: natives from now on if the probe says the
    /// server answers them as Redis 7 does, scripts only if not.
    pub(crate) fn probed(&mut self, works: bool) {
        if self.natives == Natives::Untried {
            self.natives = if works {
                Natives::Allowed
            } else {
                Natives::Refused
            };
        }
    }

    /// A script call failed with an error reply (e.g. `EVALSHA` no longer allowed): no
    /// natives until a script call succeeds again, so that no lock is granted that could not
    /// be released.
    pub(crate) fn script_failed(&mut self) {
        if self.natives == Natives::Allowed {
            self.natives = Natives::Untried;
        }
    }

    /// The server refused a native acquire: scripts only on this connection.
    pub(crate) fn refuse_natives(&mut self) {
        self.natives = Natives::Refused;
    }

    /// Sends `command` with the next call and drops its reply (best effort: nothing is sent
    /// without a connection, or while the server has stopped reading).
    pub(crate) fn send_and_forget(&mut self, command: &Cmd) {
        if let Some(socket) = &mut self.socket
            && socket.unsent() < MAX_UNSENT
        {
            socket.send_and_forget(command);
        }
    }

    /// Whether calls given up still have bytes to write or replies to come.
    pub(crate) fn unsettled(&self) -> bool {
        self.socket.as_ref().is_some_and(Socket::unsettled)
    }

    /// Makes progress on what calls given up left behind (see [`Socket::settle`]); returns
    /// when nothing is left, or the socket broke (it is then dropped). Cancel-safe.
    pub(crate) async fn settle(&mut self) {
        if let Some(socket) = &mut self.socket
            && socket.settle().await.is_err()
        {
            self.drop_socket();
        }
    }

    fn drop_socket(&mut self) {
        if let Some(socket) = self.socket.take() {
            socket.abort();
        }
        // A new connection may reach another server (a restart, a name that moved).
        self.natives = Natives::Untried;
    }

    /// The connected socket: connects first when there is none (in a task of its own,
    /// which goes on if this call is given up), or fails at once while a refusal's backoff
    /// lasts.
    async fn socket(&mut self) -> RedisResult<&mut Socket> {
        if self.socket.is_none() {
            let connecting = match &mut self.connecting {
                Some(connecting) => connecting,
                None => {
                    self.refusals.check()?;
                    let connect = connect(
                        self.info.clone(),
                        self.host.clone(),
                        self.port,
                        self.preload.clone(),
                        self.connect_timeout,
                    );
                    self.connecting.insert(self.tasks.spawn(connect))
                }
            };
            let connected = connecting.await.map_err(|err| {
                RedisError::from((
                    ErrorKind::Client,
                    "the connect task ended without a connection",
                    err.to_string(),
                ))
            });
            self.connecting = None;
            match connected.and_then(|connected| connected) {
                Ok(socket) => {
                    self.refusals.clear();
                    self.socket = Some(socket);
                }
                Err(err) => {
                    self.refusals.record(&err);
                    return Err(err);
                }
            }
        }
        self.socket
            .as_mut()
            .ok_or_else(|| RedisError::from((ErrorKind::Client, "not connected")))
    }
}

/// Whether a connection sends a lock's plain acquire as a native command (see
/// `node/native.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Natives {
    /// Not before a script call carrying the probe has succeeded on it: a user who may not
    /// run the scripts (no `EVALSHA`) must not get locks that it cannot release, and a server
    /// that gets `SET ... NX GET` wrong must not grant them.
    Untried,
    /// The probe passed.
    Allowed,
    /// The probe failed, or the server refused a native: scripts only.
    Refused,
}

/// The node's own connection as redis-rs sees a connection, so that the queue runs the same
/// script-call code (`EVALSHA`, and `SCRIPT LOAD` on `NOSCRIPT`) over either connection.
/// The queue sends single commands only: a pipeline is refused.
impl redis::aio::ConnectionLike for OwnedConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
        Box::pin(self.call(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _pipeline: &'a redis::Pipeline,
        _offset: usize,
        _count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        Box::pin(std::future::ready(Err(RedisError::from((
            ErrorKind::Client,
            "a node's own connection sends no pipelines",
        )))))
    }

    fn get_db(&self) -> i64 {
        self.info.redis_settings().db()
    }
}

/// Connects to `host:port`, runs the handshake that `info` asks for (`AUTH`, `SELECT`) and
/// sends `preload` (its reply ignored), all within `limit`.
async fn connect(
    info: ConnectionInfo,
    host: String,
    port: u16,
    preload: Option<Cmd>,
    limit: Duration,
) -> RedisResult<Socket> {
    let handshake = async {
        let stream = TcpStream::connect((host.as_str(), port)).await?;
        stream.set_nodelay(true)?;
        notice_silent_drops(&stream)?;
        let mut socket = Socket::new(stream);
        let settings = info.redis_settings();
        if let Some(password) = settings.password() {
            authenticate(&mut socket, settings.username(), password).await?;
        }
        if settings.db() != 0 {
            let mut select = redis::cmd("SELECT");
            select.arg(settings.db());
            socket.call(&select).await?.extract_error()?;
        }
        if let Some(preload) = &preload
            && let Value::ServerError(err) = socket.call(preload).await?
        {
            tracing::debug!(%err, "preloading on a new connection failed; calls will load it");
        }
        Ok(socket)
    };
    match tokio::time::timeout(limit, handshake).await {
        Ok(connected) => connected,
        Err(_) => Err(RedisError::from(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("connecting took longer than {limit:?}"),
        ))),
    }
}

/// Idle time before the first keep-alive probe on a node's own socket.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Time between keep-alive probes, and how many go unanswered before the socket fails.
#[cfg(target_os = "linux")]
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
#[cfg(target_os = "linux")]
const KEEPALIVE_PROBES: u32 = 3;
/// How long written bytes may stay unacknowledged by the peer's kernel before the socket fails.
#[cfg(target_os = "linux")]
const UNACKNOWLEDGED_LIMIT: Duration = Duration::from_secs(30);

/// Makes the kernel notice a connection the network dropped without a word: a host gone
/// without a reset, a NAT or load balancer that forgot an idle connection. Without this, a
/// given-up call keeps the socket (its late reply is awaited), so every call to the node would
/// time out until the kernel gave up retransmitting, about 15 minutes. With it, the socket
/// fails within about a minute (keep-alive probes after 30 s idle, every 10 s, 3 of them; or
/// 30 s of unacknowledged data, on Linux), and the next call reconnects. The probes also keep
/// an idle connection alive through middleboxes that time idle connections out.
fn notice_silent_drops(stream: &TcpStream) -> io::Result<()> {
    let socket = socket2::SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new().with_time(KEEPALIVE_IDLE);
    #[cfg(target_os = "linux")]
    let keepalive = keepalive
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    socket.set_tcp_keepalive(&keepalive)?;
    #[cfg(target_os = "linux")]
    socket.set_tcp_user_timeout(Some(UNACKNOWLEDGED_LIMIT))?;
    Ok(())
}

/// `AUTH [user] password`. A server older than ACLs (Redis 5) takes no user name: then the
/// password alone, as redis-rs does. A refusal is `AuthenticationFailed` with the server's
/// words.
async fn authenticate(socket: &mut Socket, user: Option<&str>, password: &str) -> RedisResult<()> {
    let mut auth = redis::cmd("AUTH");
    if let Some(user) = user {
        auth.arg(user);
    }
    auth.arg(password);
    let refusal = match socket.call(&auth).await? {
        Value::ServerError(refusal) => refusal,
        _ => return Ok(()),
    };
    let detail = refusal.details().unwrap_or_default().to_owned();
    if user.is_some() && detail.contains("wrong number of arguments for 'auth' command") {
        return Box::pin(authenticate(socket, None, password)).await;
    }
    Err(RedisError::from((
        ErrorKind::AuthenticationFailed,
        "Password authentication failed",
        format!("{} {detail}", refusal.code()),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio::net::TcpListener;

    /// A server that stops reading holds at most `MAX_UNSENT` bytes of ours: past that, a
    /// call fails at once (an I/O time-out, so a `NodeFailure::Connection`), and the socket
    /// stays, with the order of what it carries.
    #[tokio::test]
    async fn a_server_that_stops_reading_holds_at_most_max_unsent() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let info =
            redis::IntoConnectionInfo::into_connection_info(format!("redis://127.0.0.1:{port}"))
                .expect("url");
        let mut conn =
            OwnedConnection::for_plain_tcp(&info, None, Duration::from_secs(5), TaskTracker::new())
                .expect("a plain TCP node");
        // More than the kernel's buffers take on top of MAX_UNSENT.
        let mut big = redis::cmd("ECHO");
        big.arg(vec![b'x'; MAX_UNSENT + (64 << 20)]);
        // Connected (no handshake for db 0 without a password), never read from. The call
        // cannot finish; its time-out only has to outlast the connect (generous, for a busy
        // machine).
        let (call, accepted) = tokio::join!(
            tokio::time::timeout(Duration::from_secs(3), conn.call(&big)),
            listener.accept()
        );
        let _peer = accepted.expect("accept");
        assert!(call.is_err(), "nothing is read: the call is cut short");
        assert!(conn.is_connected());
        let started = std::time::Instant::now();
        let err = tokio::time::timeout(Duration::from_secs(5), conn.call(&redis::cmd("PING")))
            .await
            .expect("fails at once, never waits")
            .expect_err("the node holds too much of ours already");
        assert!(err.is_io_error(), "{err}");
        assert!(err.to_string().contains("not sending more"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(1), "failed at once");
        assert!(conn.is_connected(), "a stalled socket is kept");
        assert!(conn.unsettled());
    }

    /// The socket a node's connection makes notices a silently dropped connection: keep-alive
    /// probes after 30 s idle and, on Linux, a bound on unacknowledged data.
    #[tokio::test]
    async fn a_new_connection_probes_an_idle_peer() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let info: ConnectionInfo = format!("redis://127.0.0.1:{port}").parse().expect("url");
        let (socket, _peer) = tokio::join!(
            connect(info, "127.0.0.1".into(), port, None, Duration::from_secs(5)),
            listener.accept()
        );
        let socket = socket.expect("connect");
        let options = socket2::SockRef::from(socket.stream());
        assert!(options.keepalive().expect("SO_KEEPALIVE"));
        assert_eq!(options.tcp_keepalive_time().expect("idle"), KEEPALIVE_IDLE);
        #[cfg(target_os = "linux")]
        {
            let interval = options.tcp_keepalive_interval().expect("interval");
            assert_eq!(interval, KEEPALIVE_INTERVAL);
            assert_eq!(
                options.tcp_keepalive_retries().expect("probes"),
                KEEPALIVE_PROBES
            );
            let limit = options.tcp_user_timeout().expect("TCP_USER_TIMEOUT");
            assert_eq!(limit, Some(UNACKNOWLEDGED_LIMIT));
        }
    }
}
