//! The connection a node's queue task owns, for a plain `redis://` node over TCP: one socket,
//! written and read by that task alone, so a call crosses no task between the queue and the
//! server (redis-rs's multiplexed connection runs one more, and each hop is a thread wake-up
//! on an idle runtime). TLS and Unix-socket nodes use redis-rs's connection instead
//! (`connection.rs`).
//!
//! - **In order, and safe to give up on.** A call whose caller stopped waiting (the node
//!   timeout) keeps its place: its unwritten bytes go out before the next call's, and its
//!   reply is read and dropped before the next call's. A release never overtakes its own
//!   acquire, and no reply is ever handed to another call.
//! - **Connected in the background.** The connect and its handshake (`AUTH`, `SELECT`, then
//!   loading the caller's script, best effort) run in a task of their own under the connect
//!   timeout, so a handshake slower than the node timeout still finishes; calls meanwhile
//!   time out. With the script loaded at connect, the first call after a restart does not
//!   spend a round trip on `NOSCRIPT`.
//! - **Reconnected.** An I/O error or a reply that is not RESP drops the socket, and the next
//!   call connects anew. A refusal at connect time (`WRONGPASS`, `NOAUTH`) fails calls at once
//!   for a backoff before the next try ([`Refusals`]), as for redis-rs's connection.

use std::io;
use std::time::Duration;

use redis::{Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, RedisResult, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

use super::connection::Refusals;
use super::resp;

/// How much room a read asks for, at least.
const READ_CHUNK: usize = 16 * 1024;

/// One connected socket and what is in flight on it.
pub(crate) struct Socket {
    stream: TcpStream,
    /// Bytes of calls made but not written yet (a write cut short by a timeout).
    out: Vec<u8>,
    /// Bytes read but not parsed yet start at `input[read_at]`.
    input: Vec<u8>,
    read_at: usize,
    /// Replies the server still owes on this socket: those of calls given up, then the
    /// current call's (the last one).
    owed: usize,
}

impl Socket {
    fn new(stream: TcpStream) -> Self {
        Socket {
            stream,
            out: Vec::with_capacity(READ_CHUNK),
            input: Vec::with_capacity(READ_CHUNK),
            read_at: 0,
            owed: 0,
        }
    }

    /// Sends `command` and waits for its reply. An error reply is `Ok(Value::ServerError)`;
    /// `Err` means the socket is unusable (I/O error, closed, out of step). Cancel-safe in the
    /// sense that matters here: dropped after its first poll, the call is still written, and
    /// its reply is dropped by the next call.
    async fn call(&mut self, command: &Cmd) -> RedisResult<Value> {
        command.write_packed_command(&mut self.out);
        self.owed += 1;
        while !self.out.is_empty() {
            let written = self.stream.write(&self.out).await?;
            if written == 0 {
                return Err(closed());
            }
            self.out.drain(..written);
        }
        loop {
            if let Some((reply, used)) = resp::parse(&self.input[self.read_at..])? {
                self.read_at += used;
                if self.read_at == self.input.len() {
                    self.input.clear();
                    self.read_at = 0;
                }
                self.owed -= 1;
                if self.owed == 0 {
                    return Ok(reply);
                }
                continue; // the reply of a call given up
            }
            if self.read_at > 0 {
                self.input.drain(..self.read_at);
                self.read_at = 0;
            }
            self.input.reserve(READ_CHUNK);
            if self.stream.read_buf(&mut self.input).await? == 0 {
                return Err(closed());
            }
        }
    }
}

fn closed() -> RedisError {
    RedisError::from(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the server closed the connection",
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
        let socket = self.socket().await?;
        let reply = socket.call(command).await;
        if reply.is_err() {
            self.socket = None;
        }
        reply
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
