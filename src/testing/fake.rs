//! Fake nodes for unit tests: the real node queue ([`Queue`]: batching, order, resends, what a
//! hung call does to the calls behind it) over a [`FakeLink`] to a simulated server
//! ([`SimServer`], `src/testing/`) that runs redfence's real scripts in an embedded Lua, with
//! expiry on Tokio's clock (so a paused clock drives it). Each kind of request is answered as
//! its [`Fake`] behaviour says: by the script, or with a canned reply (granted, refused, an
//! error, late, never). There is no second implementation of the scripts here.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use redis::aio::ConnectionLike;
use redis::{Cmd, RedisFuture, Value};
use tokio::time::{Instant, Sleep};

use super::SimServer;
use crate::error::NodeFailure;
use crate::node::batch::{BATCH, Link, Replies, Run, Touch, evalsha, write_call};
use crate::node::queue::Queue;
use crate::node::{Advice, Advisory, Node, NodeCall, Op, Request, advisory};

/// How a fake node answers one kind of request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Fake {
    /// Runs the script on the simulated server, as Redis would.
    Real,
    /// Answers 1 whatever the keys (the server is not asked).
    Grant,
    /// Answers 0 (refused; the server is not asked).
    Deny,
    /// Answers an error reply.
    Fail,
    /// Runs the script when its batch is sent, and answers granted after a delay.
    Slow(Duration),
    /// Never answers.
    Never,
}

/// A fake node: a behaviour per kind of request (by default its acquire behaviour, and
/// [`Fake::Real`] for extend and release), a log of the calls it was asked to run, and its
/// simulated server.
pub(crate) struct FakeNode {
    shared: Arc<Shared>,
    queue: Queue,
}

/// What a fake node and its link share.
struct Shared {
    behaviour: Mutex<HashMap<Op, Fake>>,
    /// The requests it was asked to run, in order.
    seen: Mutex<Vec<Op>>,
    server: SimConnection,
    /// Guarded writes (the election's record) never answer.
    writes_hang: AtomicBool,
    /// How long a call may take before it fails with a time-out, as a node's queue bounds the
    /// call in flight.
    timeout: Mutex<Duration>,
}

/// A fake's node timeout until [`FakeNode::set_timeout`] says otherwise.
pub(crate) const FAKE_TIMEOUT: Duration = Duration::from_millis(50);

/// The queue's own bound, past any fake's: the link bounds each call with the fake's timeout
/// (which a test may change), and the watchdog of a queue on a current-thread runtime never
/// gives up on a fake that is only slow.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(3600);

impl FakeNode {
    /// A node that answers acquires as `acquire` says and runs extends and releases for real.
    pub(crate) fn new(acquire: Fake) -> Self {
        let shared = Arc::new(Shared {
            behaviour: Mutex::default(),
            seen: Mutex::default(),
            server: SimConnection::new(),
            writes_hang: AtomicBool::new(false),
            timeout: Mutex::new(FAKE_TIMEOUT),
        });
        let link_shared = Arc::clone(&shared);
        let queue = Queue::new("fake", QUEUE_TIMEOUT, move || FakeLink {
            shared: Arc::clone(&link_shared),
            script: Cmd::new(),
        });
        let node = FakeNode { shared, queue };
        node.set(Op::Acquire, acquire);
        node.set(Op::Extend, Fake::Real);
        node.set(Op::Release, Fake::Real);
        node
    }

    /// From now on, answers `op` as `behaviour` says.
    pub(crate) fn set(&self, op: Op, behaviour: Fake) {
        lock(&self.shared.behaviour).insert(op, behaviour);
    }

    /// From now on, fails a call with a time-out once it has taken `timeout`.
    pub(crate) fn set_timeout(&self, timeout: Duration) {
        *lock(&self.shared.timeout) = timeout;
    }

    /// Answers every kind of request as `behaviour` says.
    pub(crate) fn set_all(&self, behaviour: Fake) {
        for op in [Op::Acquire, Op::Extend, Op::Release] {
            self.set(op, behaviour);
        }
    }

    /// The requests it was asked to run, in order.
    pub(crate) fn calls(&self) -> Vec<Op> {
        lock(&self.shared.seen).clone()
    }

    /// The token at `key`, if it holds one that has not expired.
    pub(crate) fn holder(&self, key: &str) -> Option<String> {
        let value = self
            .shared
            .server
            .run(&[b"GET".to_vec(), key.as_bytes().to_vec()]);
        match value {
            Value::BulkString(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
            _ => None,
        }
    }

    /// Makes guarded writes (the election's record) never answer.
    pub(crate) fn hang_writes(&self) {
        self.shared.writes_hang.store(true, Ordering::SeqCst);
    }

    /// Puts `token` at `key` for `ttl`, as another client would.
    pub(crate) fn put(&self, key: &str, token: &str, ttl: Duration) {
        let ms = ttl.as_millis().max(1).to_string();
        self.shared.server.run(&[
            b"SET".to_vec(),
            key.as_bytes().to_vec(),
            token.as_bytes().to_vec(),
            b"PX".to_vec(),
            ms.into_bytes(),
        ]);
    }
}

/// `mutex`'s guard, poisoned or not (a test that panicked holding it has failed already).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A fake node's link: each batch as its behaviours say, the [`Fake::Real`] and
/// [`Fake::Slow`] requests as one `EVALSHA` of the real batch script on the simulated server.
struct FakeLink {
    shared: Arc<Shared>,
    /// The call being sent, kept for the next batch's.
    script: Cmd,
}

impl Link for FakeLink {
    async fn advise<'a>(&'a mut self, advisory: &'a Advisory) -> Result<Advice, NodeFailure> {
        let timeout = *lock(&self.shared.timeout);
        let hangs = matches!(advisory, Advisory::WriteIfHeld(_))
            && self.shared.writes_hang.load(Ordering::SeqCst);
        let mut conn = self.shared.server.clone();
        let advised = async {
            if hangs {
                std::future::pending::<()>().await;
            }
            match advisory {
                // One server: its run id is the simulated one's, which no test asks for.
                Advisory::RunId => Ok(Advice::RunId(None)),
                other => advisory::run(&mut conn, other).await,
            }
        };
        match tokio::time::timeout(timeout, advised).await {
            Ok(advised) => Ok(advised?),
            Err(_) => Err(NodeFailure::Timeout(timeout)),
        }
    }

    async fn send<'a>(
        &'a mut self,
        runs: &'a [Run],
        _timeout: Duration,
        _deadline: Pin<&'a mut Sleep>,
    ) -> Result<Replies, NodeFailure> {
        let timeout = *lock(&self.shared.timeout);
        let behaviours: Vec<Fake> = {
            let behaviour = lock(&self.shared.behaviour);
            runs.iter()
                .map(|run| behaviour.get(&run.req.op).copied().unwrap_or(Fake::Real))
                .collect()
        };
        let scripted = |b: &Fake| matches!(b, Fake::Real | Fake::Slow(_));
        let mut ran = Vec::new().into_iter();
        if behaviours.iter().any(scripted) {
            let to_run = runs
                .iter()
                .zip(&behaviours)
                .filter(|(_, b)| scripted(b))
                .map(|(run, _)| run);
            let evalsha_batch = ("EVALSHA", BATCH.get_hash());
            let script = &mut self.script;
            write_call(
                to_run,
                Touch::WithHelpers,
                script,
                evalsha_batch,
                false,
                None,
            );
            let mut conn = self.shared.server.clone();
            ran = evalsha(&self.script, &mut conn).await?.into_iter();
        }
        let mut late = Duration::ZERO;
        let mut never = false;
        let mut replies = Vec::with_capacity(runs.len());
        for behaviour in behaviours {
            replies.push(match behaviour {
                Fake::Real => ran.next().unwrap_or(Value::Nil),
                Fake::Slow(delay) => {
                    late = late.max(delay);
                    match ran.next() {
                        Some(Value::Int(n)) => Value::Int(n.max(1)),
                        _ => Value::Int(1),
                    }
                }
                Fake::Grant => Value::Int(1),
                Fake::Deny => Value::Int(0),
                Fake::Fail => Value::BulkString(b"E:injected".to_vec()),
                Fake::Never => {
                    never = true;
                    Value::Nil
                }
            });
        }
        let answer = async {
            if never {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(late).await;
        };
        match tokio::time::timeout(timeout, answer).await {
            Ok(()) => Ok(Replies::All(replies)),
            Err(_) => Err(NodeFailure::Timeout(timeout)),
        }
    }
}

impl Node for FakeNode {
    fn call(&self, req: &Request) -> NodeCall {
        lock(&self.shared.seen).push(req.op);
        self.queue.call(req)
    }

    fn flush(&self) -> BoxFuture<'static, ()> {
        self.queue.flush()
    }

    fn advise(&self, advisory: Advisory) -> BoxFuture<'static, Result<Advice, NodeFailure>> {
        self.queue.advise(advisory)
    }

    fn addr(&self) -> &str {
        "fake"
    }
}

/// A connection to a simulated server: each command runs on it at once, atomically, its
/// clock read from Tokio's (paused in most unit tests).
#[derive(Clone)]
struct SimConnection {
    /// Made on first use: a fake that only gives canned replies never starts a Lua state.
    server: Arc<OnceLock<Mutex<SimServer>>>,
    /// Tokio's instant at which the server's clock read [`EPOCH_MS`].
    started: Instant,
}

/// What a simulated server's clock reads when it starts (some day in 2023, in ms since the
/// Unix epoch), so that `TIME` looks like a real clock.
const EPOCH_MS: u64 = 1_700_000_000_000;

impl SimConnection {
    fn new() -> Self {
        SimConnection {
            server: Arc::default(),
            started: Instant::now(),
        }
    }

    /// Runs one command (its arguments) on the server, at Tokio's time.
    fn run(&self, args: &[Vec<u8>]) -> Value {
        let elapsed = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let now = EPOCH_MS.saturating_add(elapsed);
        let mut server = lock(self.server.get_or_init(|| Mutex::new(SimServer::new(now))));
        server.set_time(now);
        server.command(args)
    }

    /// Runs `cmd` on the server.
    fn run_cmd(&self, cmd: &Cmd) -> Value {
        self.run(&super::server::args_of(cmd))
    }
}

impl ConnectionLike for SimConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let reply = match self.run_cmd(cmd) {
            Value::ServerError(err) => Err(err.into()),
            value => Ok(value),
        };
        Box::pin(std::future::ready(reply))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let replies: Vec<Value> = pipeline.cmd_iter().map(|cmd| self.run_cmd(cmd)).collect();
        let replies = replies.into_iter().skip(offset).take(count).collect();
        Box::pin(std::future::ready(Ok(replies)))
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// Fake nodes with these acquire behaviours, both as fakes (to steer and inspect) and as the
/// `Node`s a `Redlock` or a round runs over.
pub(crate) fn fakes(behaviours: &[Fake]) -> (Vec<Arc<FakeNode>>, Vec<Arc<dyn Node>>) {
    let fakes: Vec<Arc<FakeNode>> = behaviours
        .iter()
        .map(|b| Arc::new(FakeNode::new(*b)))
        .collect();
    let nodes = fakes
        .iter()
        .map(|f| Arc::clone(f) as Arc<dyn Node>)
        .collect();
    (fakes, nodes)
}
