//! One queue per node: the requests of every lock for that node, served by one task that sends
//! everything waiting as **one batched script call** (`scripts/batch.lua`) and hands each
//! request its own reply.
//!
//! - With nothing in flight a request goes out at once; requests that arrive while a call is
//!   in flight wait and go together in the next one, up to [`MAX_OPS`] operations,
//!   [`MAX_KEYS`] keys and [`MAX_BYTES`] of names and tokens (so that no script runs long on
//!   the server and no call is huge; one operation larger than that goes alone).
//! - Requests run on the node in the order they were queued, each one to its end even when
//!   its caller stopped waiting: a lock's release never overtakes its own acquire.
//! - `node_timeout` bounds the node's answer to a call in flight, not the time a request
//!   spends queued behind others while the node answers (that is load, not failure). When a
//!   call times out, the node is hung: the call's requests and every request queued behind
//!   it are answered with the timeout at once, so a hung node costs each request at most about
//!   one `node_timeout`. They are still sent, in order, when their turn comes: a release must
//!   follow an acquire that may land yet.
//! - The queue is bounded ([`QUEUE_CAPACITY`]): a request that finds it full fails with
//!   [`NodeFailure::Overloaded`] instead of queueing without bound.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Script, ServerErrorKind, Value};
use tokio::runtime;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Sleep;
use tracing::Instrument;

use super::connection::LazyConnection;
use super::socket::OwnedConnection;
use super::{Op, Request};
use crate::clock;
use crate::error::NodeFailure;

const BATCH_SOURCE: &str = include_str!("../scripts/batch.lua");
static BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(BATCH_SOURCE));

/// The most operations one batched call carries.
pub(crate) const MAX_OPS: usize = 512;
/// The most keys one batched call carries (an operation with more keys goes alone).
pub(crate) const MAX_KEYS: usize = 4_096;
/// The most bytes of key names, tokens and waiter ids one batched call carries (an operation
/// with more goes alone).
pub(crate) const MAX_BYTES: usize = 1 << 20;
/// The most requests waiting for one node.
pub(crate) const QUEUE_CAPACITY: usize = 65_536;

/// Where one request's reply goes.
type Reply = oneshot::Sender<Result<i64, NodeFailure>>;

/// What the queue carries: a request and where its reply goes, or a marker that answers once
/// everything queued before it has run.
enum Job {
    Run {
        req: Request,
        /// `None` once the caller has been answered (it waited behind a hung call).
        reply: Option<Reply>,
    },
    Flush(oneshot::Sender<()>),
}

/// The sending side of one node's queue. The serving task ends when the last `Pipeline`
/// (the node) is dropped.
pub(crate) struct Pipeline {
    jobs: mpsc::Sender<Job>,
    /// Whether the serving task runs on a current-thread runtime, which runs its tasks only
    /// inside `block_on`: its callers then wait with a watchdog.
    watched: bool,
    /// When the serving task last took a request or finished a call.
    progress: Arc<Progress>,
    node_timeout: Duration,
}

/// An instant, stored as microseconds since a process-wide origin (on [`clock::now`]).
#[derive(Default)]
struct Progress(AtomicU64);

static ORIGIN: LazyLock<Instant> = LazyLock::new(clock::now);

impl Progress {
    fn mark(&self) {
        let micros = clock::since(*ORIGIN).as_micros();
        self.0
            .store(u64::try_from(micros).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// How long ago the last mark was.
    fn age(&self) -> Duration {
        let at = Duration::from_micros(self.0.load(Ordering::Relaxed));
        clock::since(*ORIGIN).saturating_sub(at)
    }
}

impl Pipeline {
    /// Starts the serving task, sending over `transport`, on the current runtime. Its log
    /// lines carry the node's address `addr` (in a `redfence.node` span).
    pub(crate) fn start(
        transport: Transport,
        node_timeout: Duration,
        addr: &str,
        flavor: runtime::RuntimeFlavor,
    ) -> Self {
        let (jobs, queue) = mpsc::channel(QUEUE_CAPACITY);
        let progress = Arc::new(Progress::default());
        progress.mark();
        let span = tracing::debug_span!(parent: None, "redfence.node", node = %addr);
        let serving = serve(queue, transport, node_timeout, Arc::clone(&progress));
        tokio::spawn(serving.instrument(span));
        Pipeline {
            jobs,
            watched: flavor == runtime::RuntimeFlavor::CurrentThread,
            progress,
            node_timeout,
        }
    }

    /// Whether the serving task is gone (its runtime shut down).
    pub(crate) fn is_closed(&self) -> bool {
        self.jobs.is_closed()
    }

    /// Whether callers wait for their answers with a watchdog ([`served`](Pipeline::served)):
    /// the serving task runs on a current-thread runtime. (A multi-thread runtime runs its tasks for as
    /// long as it lives, and a queue whose runtime is gone is closed.)
    pub(crate) fn watched(&self) -> bool {
        self.watched
    }

    /// Waits for `answer`, with the watchdog of [`served`](Pipeline::served) when the queue
    /// is [`watched`](Pipeline::watched).
    pub(crate) async fn answer(
        &self,
        answer: oneshot::Receiver<Result<i64, NodeFailure>>,
    ) -> Result<i64, NodeFailure> {
        let answer = if self.watched {
            self.served(answer).await
        } else {
            Some(answer.await)
        };
        match answer {
            Some(Ok(reply)) => reply,
            Some(Err(_)) => Err(stopped()),
            None => Err(NodeFailure::Reply(redis::RedisError::from((
                ErrorKind::Client,
                "the node's request queue runs on another Tokio runtime, which is not \
                 running (a current-thread runtime outside block_on?)",
            )))),
        }
    }

    /// `wait`, given up (`None`) once twice `node_timeout` has passed without the serving
    /// task taking a request or finishing a call: the serving task's current-thread runtime
    /// may be idle, outside `block_on`, while the caller runs on another runtime, and then
    /// nothing serves the queue. A queue that keeps serving others is waited for, however
    /// long. (Twice: a call the node does not answer is the queue's to time out, after
    /// `node_timeout`, and to answer with the timeout together with every request queued
    /// behind it; a watchdog that fired first would let the caller's next request slip in
    /// behind the hung call.)
    async fn served<F: Future>(&self, wait: F) -> Option<F::Output> {
        tokio::pin!(wait);
        loop {
            match tokio::time::timeout(self.node_timeout, &mut wait).await {
                Ok(out) => return Some(out),
                Err(_) if self.progress.age() >= self.node_timeout.saturating_mul(2) => {
                    return None;
                }
                Err(_) => {}
            }
        }
    }

    /// Queues `req`; the reply arrives once its batch has run (or failed).
    pub(crate) fn submit(
        &self,
        req: Request,
    ) -> Result<oneshot::Receiver<Result<i64, NodeFailure>>, NodeFailure> {
        let (reply, answer) = oneshot::channel();
        match self.jobs.try_send(Job::Run {
            req,
            reply: Some(reply),
        }) {
            Ok(()) => Ok(answer),
            Err(mpsc::error::TrySendError::Full(_)) => Err(NodeFailure::Overloaded {
                queued: QUEUE_CAPACITY,
            }),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(closed()),
        }
    }

    /// Resolves once every request queued before it has run (or failed); on a watched queue
    /// that nothing serves, once the watchdog gives up.
    pub(crate) async fn flush(&self) {
        let flush = async {
            let (done, flushed) = oneshot::channel();
            if self.jobs.send(Job::Flush(done)).await.is_ok() {
                let _ = flushed.await;
            }
        };
        if self.watched {
            self.served(flush).await;
        } else {
            flush.await;
        }
    }
}

/// The serving task is gone: its runtime shut down.
pub(crate) fn stopped() -> NodeFailure {
    NodeFailure::Reply(redis::RedisError::from((
        ErrorKind::Client,
        "the node's request queue stopped (its runtime shut down)",
    )))
}

fn closed() -> NodeFailure {
    NodeFailure::Reply(redis::RedisError::from((
        redis::ErrorKind::Client,
        "the node's request queue is closed (its runtime shut down)",
    )))
}

/// Serves the queue until every sender is gone.
async fn serve(
    mut queue: mpsc::Receiver<Job>,
    mut transport: Transport,
    timeout: Duration,
    progress: Arc<Progress>,
) {
    // Requests taken off the queue but not sent yet, in order: the one that did not fit the
    // last batch, and those that waited behind a hung call (their callers already answered).
    let mut backlog: VecDeque<Job> = VecDeque::new();
    // One timer for every call: moving its deadline later is an atomic store, where a new
    // timer per call is an insert into the timer wheel (and a wake-up of the thread that
    // sleeps on it, when the runtime is idle).
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        let first = match backlog.pop_front() {
            Some(job) => job,
            None => match transport.next_job(&mut queue).await {
                Some(job) => job,
                None => return,
            },
        };
        progress.mark();
        let mut batch = Batch::default();
        batch.push(first);
        // Coalesce what is already waiting, up to the caps, in order.
        while !batch.full() {
            let next = match backlog.pop_front() {
                Some(job) => job,
                None => match queue.try_recv() {
                    Ok(job) => job,
                    Err(_) => break,
                },
            };
            if batch.fits(&next) {
                batch.push(next);
            } else {
                backlog.push_front(next);
                break;
            }
        }
        // (A timeout too long for an Instant leaves the first, far-future deadline.)
        if let Some(at) = tokio::time::Instant::from_std(clock::now()).checked_add(timeout) {
            deadline.as_mut().reset(at);
        }
        let ran = batch.run(&mut transport, timeout, deadline.as_mut()).await;
        progress.mark();
        if let Err(failure) = ran {
            batch.fail(&failure);
            if matches!(failure, NodeFailure::Timeout(_)) {
                // Every request queued behind a hung call has waited long enough: answer it
                // now. It is still sent, in order, when its turn comes (a release must follow
                // an acquire that may land yet); beyond the queue's capacity, the acquires and
                // extends nobody waits for are dropped unsent (nothing to undo).
                while let Ok(job) = queue.try_recv() {
                    backlog.push_back(job);
                }
                let mut kept = 0;
                backlog.retain_mut(|job| {
                    let keep = match job {
                        Job::Run { req, reply } => {
                            if let Some(reply) = reply.take() {
                                let _ = reply.send(Err(failure.clone()));
                            }
                            req.op == Op::Release || kept < QUEUE_CAPACITY
                        }
                        Job::Flush(_) => true,
                    };
                    kept += usize::from(keep);
                    keep
                });
            }
        }
    }
}

/// The requests of one call, and the markers that wait for it.
#[derive(Default)]
struct Batch {
    runs: Vec<(Request, Option<Reply>)>,
    flushes: Vec<oneshot::Sender<()>>,
    keys: usize,
    bytes: usize,
}

/// The bytes of names and ids a request adds to a call.
fn size(req: &Request) -> usize {
    req.keys.iter().map(String::len).sum::<usize>()
        + req.token.len()
        + req.queue.as_deref().map_or(0, |q| q.waiter.len())
}

impl Batch {
    fn push(&mut self, job: Job) {
        match job {
            Job::Run { req, reply } => {
                self.keys += req.keys.len();
                self.bytes += size(&req);
                self.runs.push((req, reply));
            }
            Job::Flush(done) => self.flushes.push(done),
        }
    }

    fn full(&self) -> bool {
        self.runs.len() >= MAX_OPS || self.keys >= MAX_KEYS || self.bytes >= MAX_BYTES
    }

    fn fits(&self, job: &Job) -> bool {
        match job {
            Job::Run { req, .. } => {
                self.keys + req.keys.len() <= MAX_KEYS && self.bytes + size(req) <= MAX_BYTES
            }
            Job::Flush(_) => true,
        }
    }

    /// Sends the batch as one script call and answers each request; `Err` when the call as a
    /// whole failed or `deadline` (set `timeout` after the call starts) passed first (the
    /// requests are then still to be answered, by `fail`).
    async fn run(
        &mut self,
        transport: &mut Transport,
        timeout: Duration,
        deadline: Pin<&mut Sleep>,
    ) -> Result<(), NodeFailure> {
        if self.runs.is_empty() {
            self.answer_flushes();
            return Ok(());
        }
        let command = self.command();
        let replies = tokio::select! {
            biased;
            replies = transport.evalsha(&command) => replies?,
            () = deadline => return Err(NodeFailure::Timeout(timeout)),
        };
        if replies.len() != self.runs.len() {
            return Err(NodeFailure::Reply(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "the batch script returned a reply count other than the request count",
            ))));
        }
        for ((_, reply), value) in self.runs.drain(..).zip(replies) {
            if let Some(reply) = reply {
                let _ = reply.send(parse(value));
            }
        }
        self.answer_flushes();
        Ok(())
    }

    /// The batch as one `EVALSHA` of `scripts/batch.lua`: every operation's keys, then every
    /// operation's arguments (kind, token, TTL, key count, and the fair queue's three for
    /// `f`, `l` and `R`), written straight into one command buffer (no allocation per
    /// argument).
    fn command(&self) -> Cmd {
        let keys = self.keys;
        let args = 3 + keys + self.runs.len() * 7;
        let mut command = Cmd::with_capacity(args, 64 + self.bytes + self.runs.len() * 48);
        command.arg("EVALSHA").arg(BATCH.get_hash()).arg(keys);
        for (req, _) in &self.runs {
            for key in req.keys.iter() {
                command.arg(key.as_str());
            }
        }
        for (req, _) in &self.runs {
            let kind = match (req.op, &req.queue) {
                (Op::Acquire, None) => "a",
                (Op::Acquire, Some(_)) => "f",
                (Op::Extend, _) => "e",
                (Op::Release, None) => "r",
                (Op::Release, Some(_)) => "R",
                (Op::Leave, _) => "l",
            };
            command
                .arg(kind)
                .arg(&*req.token)
                .arg(req.ttl_ms)
                .arg(req.keys.len());
            if matches!(kind, "f" | "l" | "R") {
                let (waiter, ticket, lease) = req
                    .queue
                    .as_deref()
                    .map_or(("", 0, 0), |q| (&*q.waiter, q.ticket, q.lease_ms));
                command.arg(waiter).arg(ticket).arg(lease);
            }
        }
        command
    }

    fn fail(&mut self, failure: &NodeFailure) {
        for (_, reply) in self.runs.drain(..) {
            if let Some(reply) = reply {
                let _ = reply.send(Err(failure.clone()));
            }
        }
        self.answer_flushes();
    }

    fn answer_flushes(&mut self) {
        for done in self.flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

/// `SCRIPT LOAD` of the batch script.
pub(crate) fn load_batch_script() -> Cmd {
    let mut load = redis::cmd("SCRIPT");
    load.arg("LOAD").arg(BATCH_SOURCE);
    load
}

/// How a node's queue reaches the server.
pub(crate) enum Transport {
    /// A socket the queue's task owns (a plain `redis://` node): no task in between.
    Owned(Box<OwnedConnection>),
    /// redis-rs's multiplexed, auto-reconnecting connection (TLS and Unix-socket nodes).
    Shared(Arc<LazyConnection>),
}

impl Transport {
    /// The next job; meanwhile, the calls given up on our own socket make progress (their
    /// bytes are written, their replies read), so that a release cut short by a timeout
    /// reaches the node even when nothing follows it.
    async fn next_job(&mut self, queue: &mut mpsc::Receiver<Job>) -> Option<Job> {
        if let Transport::Owned(conn) = self
            && conn.unsettled()
        {
            tokio::select! {
                biased;
                job = queue.recv() => return job,
                () = conn.settle() => {}
            }
        }
        queue.recv().await
    }

    /// Runs `command` (an `EVALSHA` of the batch script) and returns the script's replies.
    /// The first call on a connection the server dropped (a restart, a reset) fails and
    /// reconnects: it is repeated once (every operation is idempotent for its token); on our
    /// own socket, a connect that failed is not.
    async fn evalsha(&mut self, command: &Cmd) -> Result<Vec<Value>, NodeFailure> {
        match self {
            Transport::Owned(conn) => {
                let retry = conn.is_connected();
                evalsha_once_more(command, &mut **conn, retry).await
            }
            Transport::Shared(conn) => {
                let mut connection = conn.connection().await?;
                evalsha_once_more(command, &mut connection, true).await
            }
        }
    }
}

/// [`evalsha`], repeated once (with `retry`) after the connection was lost.
async fn evalsha_once_more(
    command: &Cmd,
    connection: &mut impl ConnectionLike,
    retry: bool,
) -> Result<Vec<Value>, NodeFailure> {
    match evalsha(command, connection).await {
        Err(err) if retry && (err.is_io_error() || err.is_connection_dropped()) => {
            tracing::debug!(%err, "connection lost; retrying the batch once");
            Ok(evalsha(command, connection).await?)
        }
        other => Ok(other?),
    }
}

/// Runs `command` (an `EVALSHA` of the batch script), loading the script first when the
/// server does not have it (`NOSCRIPT`: first use, a restart, a `SCRIPT FLUSH`).
async fn evalsha(
    command: &Cmd,
    connection: &mut impl ConnectionLike,
) -> redis::RedisResult<Vec<Value>> {
    match command.query_async(connection).await {
        Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            BATCH.load_async(connection).await?;
            command.query_async(connection).await
        }
        other => other,
    }
}

/// One operation's reply: its integer, or the error of that operation alone.
fn parse(value: Value) -> Result<i64, NodeFailure> {
    let error = |detail: String| {
        NodeFailure::Reply(redis::RedisError::from((
            redis::ErrorKind::Extension,
            "error reply",
            detail,
        )))
    };
    match value {
        Value::Int(n) => Ok(n),
        Value::BulkString(bytes) => Err(error(
            String::from_utf8_lossy(&bytes)
                .trim_start_matches("E:")
                .to_owned(),
        )),
        Value::SimpleString(text) => Err(error(text.trim_start_matches("E:").to_owned())),
        other => Err(error(format!("unexpected reply {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(key: String) -> Job {
        Job::Run {
            req: Request {
                op: Op::Acquire,
                keys: vec![key].into(),
                token: "token".into(),
                ttl_ms: 1_000,
                queue: None,
            },
            reply: None,
        }
    }

    #[test]
    fn a_batch_stops_at_max_bytes_and_a_larger_request_goes_alone() {
        let mut batch = Batch::default();
        let big = || run("k".repeat(MAX_BYTES / 4));
        for _ in 0..3 {
            assert!(batch.fits(&big()));
            batch.push(big());
        }
        assert!(!batch.fits(&big()), "a fourth would pass MAX_BYTES");
        assert!(batch.fits(&run("small".into())));
        assert!(!batch.full());
        // The serving loop pushes the first request whatever its size: it goes alone.
        let mut alone = Batch::default();
        alone.push(run("k".repeat(MAX_BYTES + 1)));
        assert!(alone.full());
        assert!(!alone.fits(&run("small".into())));
    }

    #[test]
    fn replies_are_integers_or_the_operations_own_error() {
        assert_eq!(parse(Value::Int(2)).ok(), Some(2));
        let err = parse(Value::BulkString(
            b"E:WRONGTYPE Operation against a key holding the wrong kind of value".to_vec(),
        ))
        .expect_err("an error");
        assert!(err.to_string().contains("error reply"), "{err}");
        assert!(format!("{err:?}").contains("WRONGTYPE"), "{err:?}");
    }
}
