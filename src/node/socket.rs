//! One connected socket to a Redis server, written and read by one task, with what is in
//! flight on it: the bytes of calls not written yet and the replies still owed.
//!
//! **In order, and safe to give up on.** A call whose caller stopped waiting (the node timeout)
//! keeps its place: its unwritten bytes go out before the next call's, and its reply is read and
//! dropped before the next call's; [`Socket::settle`] goes on with both while nothing else is
//! sent. No reply is ever handed to another call. A reply longer than [`MAX_REPLY`] (a peer that
//! is not the Redis server expected) fails the call.

use std::io;

use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::resp;

/// How much room a read asks for, at least.
const READ_CHUNK: usize = 16 * 1024;

/// One connected socket and what is in flight on it.
pub(super) struct Socket {
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

/// Commands written as RESP ahead of a call, each without a [`Cmd`] of its own (a `Cmd` is two
/// allocations, and a batch under load carries dozens of small commands): sent before the
/// call's other commands.
#[derive(Default)]
pub(super) struct Packed {
    bytes: Vec<u8>,
    count: usize,
}

impl Packed {
    /// Appends the command whose arguments are `args`.
    pub(super) fn push(&mut self, args: &[&[u8]]) {
        self.header(b'*', args.len());
        for arg in args {
            self.header(b'$', arg.len());
            self.bytes.extend_from_slice(arg);
            self.bytes.extend_from_slice(b"\r\n");
        }
        self.count += 1;
    }

    /// Appends `command`.
    pub(super) fn push_command(&mut self, command: &Cmd) {
        command.write_packed_command(&mut self.bytes);
        self.count += 1;
    }

    /// How many commands it holds.
    pub(super) fn len(&self) -> usize {
        self.count
    }

    /// The commands as written.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Empties it, keeping its allocation.
    pub(super) fn clear(&mut self) {
        self.bytes.clear();
        self.count = 0;
    }

    fn header(&mut self, kind: u8, n: usize) {
        self.bytes.push(kind);
        self.bytes
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        self.bytes.extend_from_slice(b"\r\n");
    }
}

impl Socket {
    pub(super) fn new(stream: TcpStream) -> Self {
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
    /// its reply is dropped, by [`settle`](Self::settle) or the next call.
    pub(super) async fn call(&mut self, command: &Cmd) -> RedisResult<Value> {
        only_reply(
            self.call_all(&Packed::default(), std::slice::from_ref(command))
                .await?,
        )
    }

    /// Sends the `packed` commands, then `commands`, in one write (a pipeline) and waits for
    /// their replies, in order; otherwise as [`call`](Self::call).
    pub(super) async fn call_all(
        &mut self,
        packed: &Packed,
        commands: &[Cmd],
    ) -> RedisResult<Vec<Value>> {
        self.out.extend_from_slice(&packed.bytes);
        for command in commands {
            command.write_packed_command(&mut self.out);
        }
        let calls = packed.count + commands.len();
        self.owed += calls;
        self.write_all().await?;
        let mut replies = Vec::with_capacity(calls);
        while self.owed > 0 {
            let reply = self.next_reply().await?;
            self.owed -= 1;
            // Before ours, the replies of calls given up.
            if self.owed < calls {
                replies.push(reply);
            }
        }
        Ok(replies)
    }

    /// Queues `command` as a call given up at once: it is written with the next call (or by
    /// [`settle`](Self::settle)) and its reply is dropped. For best-effort commands whose
    /// answer nobody needs.
    pub(super) fn send_and_forget(&mut self, command: &Cmd) {
        command.write_packed_command(&mut self.out);
        self.owed += 1;
    }

    /// Whether calls given up still have bytes to write or replies to come.
    /// The stream, for tests of its options.
    #[cfg(test)]
    pub(super) fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Bytes of calls made but not written yet.
    pub(super) fn unsent(&self) -> usize {
        self.out.len()
    }

    pub(super) fn unsettled(&self) -> bool {
        self.owed > 0 || !self.out.is_empty()
    }

    /// Writes what calls given up left unwritten and reads (and drops) the replies owed to
    /// them, so that their requests reach the server even when no call follows. Cancel-safe.
    pub(super) async fn settle(&mut self) -> RedisResult<()> {
        self.write_all().await?;
        while self.owed > 0 {
            self.next_reply().await?;
            self.owed -= 1;
        }
        Ok(())
    }

    /// Writes everything in `out`. Cancel-safe: what is written leaves `out` at once.
    async fn write_all(&mut self) -> RedisResult<()> {
        while !self.out.is_empty() {
            let written = self.stream.write(&self.out).await?;
            if written == 0 {
                return Err(closed());
            }
            self.out.drain(..written);
        }
        Ok(())
    }

    /// The next whole reply, read as needed. Cancel-safe: a reply leaves the buffer only
    /// whole.
    async fn next_reply(&mut self) -> RedisResult<Value> {
        loop {
            if let Some((reply, used)) = resp::parse(&self.input[self.read_at..])? {
                self.read_at += used;
                if self.read_at == self.input.len() {
                    self.input.clear();
                    self.read_at = 0;
                }
                return Ok(reply);
            }
            if self.read_at > 0 {
                self.input.drain(..self.read_at);
                self.read_at = 0;
            }
            if self.input.len() > MAX_REPLY {
                return Err(too_long(self.input.len()));
            }
            self.input.reserve(READ_CHUNK);
            if self.stream.read_buf(&mut self.input).await? == 0 {
                return Err(closed());
            }
        }
    }

    /// Closes the socket at once (a reset): bytes not yet read by the server are dropped,
    /// so that nothing written on this socket can run after what a new connection sends.
    pub(super) fn abort(self) {
        let _ = self.stream.set_zero_linger();
    }
}

/// The longest reply a node's own connection reads. Its calls' replies are at most tens of
/// KiB (one short value per operation of a batch); a peer that sends more is not the Redis
/// server expected, and its connection is dropped instead of buffering without bound.
const MAX_REPLY: usize = 1024 * 1024;

/// The one reply of a one-command call.
pub(super) fn only_reply(mut replies: Vec<Value>) -> RedisResult<Value> {
    replies
        .pop()
        .ok_or_else(|| RedisError::from((ErrorKind::Client, "no reply")))
}

fn too_long(buffered: usize) -> RedisError {
    RedisError::from((
        ErrorKind::Parse,
        "reply too long",
        format!("{buffered} bytes without a whole reply; is this a Redis server?"),
    ))
}

fn closed() -> RedisError {
    RedisError::from(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the server closed the connection",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Duration;

    use tokio::net::TcpListener;

    #[test]
    fn packed_commands_are_the_bytes_redis_rs_writes() {
        let mut packed = Packed::default();
        packed.push(&[b"SET", b"k", b"", b"PX", b"30000"]);
        packed.push(&[b"GET", "kéy".as_bytes()]);
        let mut expected = redis::cmd("SET")
            .arg("k")
            .arg("")
            .arg("PX")
            .arg(30_000)
            .get_packed_command();
        expected.extend(redis::cmd("GET").arg("kéy").get_packed_command());
        assert_eq!(packed.bytes, expected);
        assert_eq!(packed.len(), 2);
        packed.clear();
        assert!(packed.bytes.is_empty() && packed.len() == 0);
    }

    /// A socket to a peer on loopback, and the peer's end.
    async fn pair() -> (Socket, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (peer, _) = accepted.expect("accept");
        (Socket::new(client.expect("connect")), peer)
    }

    /// A call cut short while the peer reads nothing keeps its unwritten bytes; `settle`
    /// writes them and drops the late reply, and the next call gets its own reply.
    #[tokio::test]
    async fn a_call_cut_short_mid_write_is_finished_by_settle() {
        let (mut socket, mut peer) = pair().await;
        // Far more than the kernel buffers hold while the peer does not read.
        let mut big = redis::cmd("ECHO");
        big.arg(vec![b'x'; 64 << 20]);
        let size = big.get_packed_command().len();
        let cut = tokio::time::timeout(Duration::from_millis(200), socket.call(&big)).await;
        assert!(
            cut.is_err(),
            "the peer reads nothing: the call cannot finish"
        );
        assert!(!socket.out.is_empty(), "bytes left unwritten");
        assert!(socket.unsettled());

        // The peer reads the whole command, answers it, then answers one more.
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 1 << 20];
            let mut got = 0;
            while got < size {
                let n = peer.read(&mut buf).await.expect("read");
                assert!(n > 0, "closed after {got} of {size} bytes");
                got += n;
            }
            peer.write_all(b"+LATE\r\n").await.expect("write");
            let n = peer.read(&mut buf).await.expect("read the next call");
            assert!(n > 0);
            peer.write_all(b":7\r\n").await.expect("write");
            got
        });
        socket.settle().await.expect("settled");
        assert!(!socket.unsettled(), "written and answered");
        let next = socket.call(&redis::cmd("PING")).await.expect("next call");
        assert_eq!(next, Value::Int(7), "the late reply went to no one");
        assert_eq!(reader.await.expect("peer"), size, "every byte, once");
    }

    /// A peer that is not the Redis server expected (it announces a huge reply and streams
    /// bytes) fails the call once `MAX_REPLY` bytes are buffered, instead of filling memory.
    #[tokio::test]
    async fn a_reply_longer_than_the_cap_fails_the_call() {
        let (mut socket, mut peer) = pair().await;
        let streamer = tokio::spawn(async move {
            let mut request = [0_u8; 64];
            let _ = peer.read(&mut request).await;
            let _ = peer.write_all(b"$999999999999\r\n").await;
            let chunk = vec![b'x'; 64 * 1024];
            // Stops once the client drops the connection.
            while peer.write_all(&chunk).await.is_ok() {}
        });
        let ping = redis::cmd("PING");
        let call = tokio::time::timeout(Duration::from_secs(10), socket.call(&ping));
        let err = call.await.expect("fails, not hangs").expect_err("too long");
        assert_eq!(err.kind(), ErrorKind::Parse, "{err}");
        // One read fills what the buffer reserved, up to its doubled capacity.
        let buffered = socket.input.len();
        assert!(buffered <= 2 * MAX_REPLY + READ_CHUNK, "{buffered}");
        drop(socket);
        streamer.await.expect("streamer");
    }
}
