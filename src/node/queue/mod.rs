//! One queue per node (every kind of voter: a server, a Cluster, a Sentinel group): the
//! requests of every lock for that node, served by one task that sends everything waiting as
//! **one batched script call** (`scripts/batch.lua`; a Cluster's, one per hash slot) over the
//! node's [`Link`] and hands each request its own reply.
//!
//! - With nothing in flight a request goes out at once; requests that arrive while a call is
//!   in flight wait and go together in the next one ([`Batch`], capped so that no script runs
//!   long on the server and no call is huge).
//! - Requests run on the node in the order they were queued, each one to its end even when
//!   its caller stopped waiting: a lock's release never overtakes its own acquire.
//! - `node_timeout` bounds the node's answer to a call in flight, not the time a request
//!   spends queued behind others while the node answers (that is load, not failure). When a
//!   call times out, the node is hung: the call's requests and every request queued behind
//!   it are answered with the timeout at once, so a hung node costs each request at most about
//!   one `node_timeout`. The releases and fair queue leaves among those queued behind it are
//!   still sent, in order, when their turn comes (a release must follow an acquire that may
//!   land yet), up to a cap, so a node that stays hung holds a bounded backlog; the acquires
//!   and extends, never sent, are dropped. (On a Cluster voter a call that timed out says only
//!   that one member hangs: the calls behind it go in the next call, each costing at most about
//!   two `node_timeout`s, and the healthy members' are answered.)
//! - A release or leave whose call timed out or lost its connection is sent again, alone or
//!   with the next batch, until a call carrying it is answered or its lock's TTL has passed
//!   (its keys are gone then anyway): a connection that resets, a node paused for longer than
//!   the node timeout, never leave a lock key behind a release. A [`flush`](StartedQueue::flush)
//!   (what `Redlock::close` waits for) waits for these too.
//! - Advisory calls (`inspect`, a guarded write, a claim, the eviction policy) go through the
//!   same queue, alone, in their place in line: an election's record written after its lock's
//!   acquire runs after it on the server, whatever the timing.
//! - The queue is bounded ([`QUEUE_CAPACITY`]): a request that finds it full fails with
//!   [`NodeFailure::Overloaded`] instead of queueing without bound.

mod resend;
mod serve;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::runtime;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use self::serve::serve;
use super::batch::{Job, Link, Run};
use super::{Advice, Advisory, Node, NodeCall, Op, Request, stopped};
use crate::clock;
use crate::error::NodeFailure;
use crate::memory::Standing;
use crate::memory::identity::Identity;

/// Starts a node's serving task on a runtime (see [`Queue`]).
type Starter = dyn Fn(&tokio::runtime::Handle) -> StartedQueue + Send + Sync;

/// A node's request queue, for every kind of voter: started on the runtime of the node's
/// first call, and started again on a caller's runtime once that one shut down. Requests the
/// old queue had not sent were answered with its failure; nothing they held is lost, since an
/// unsent acquire never landed.
#[derive(Clone)]
pub(crate) struct Queue {
    /// The node's request queue, started inside the runtime of the first call.
    started: Arc<OnceLock<Arc<StartedQueue>>>,
    /// The queue started again on a caller's runtime, once the first one's runtime shut down.
    restarted: Arc<Mutex<Option<Arc<StartedQueue>>>>,
    start: Arc<Starter>,
}

impl Queue {
    /// A queue (not started yet) whose serving task sends over a link made by `link`; calls
    /// in flight are bounded by `node_timeout`, log lines carry `addr`.
    pub(crate) fn new<L: Link>(
        addr: &str,
        node_timeout: Duration,
        link: impl Fn() -> L + Send + Sync + 'static,
    ) -> Self {
        let addr = addr.to_owned();
        let start = move |runtime: &tokio::runtime::Handle| {
            StartedQueue::start(link(), node_timeout, &addr, runtime.runtime_flavor())
        };
        Queue {
            started: Arc::default(),
            restarted: Arc::default(),
            start: Arc::new(start),
        }
    }

    /// Runs `submit` on the node's request queue: the first one, started on first use (inside
    /// a Tokio runtime), while its runtime runs; after that runtime shut down, one started
    /// again on the caller's.
    fn with_started<R>(
        &self,
        submit: impl FnOnce(&Arc<StartedQueue>) -> R,
    ) -> Result<R, NodeFailure> {
        // The usual path, lock-free: the first queue, still served.
        if let Some(first) = self.started.get()
            && !first.is_closed()
        {
            return Ok(submit(first));
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(NodeFailure::NotRun(
                "redfence needs a Tokio runtime to talk to a node",
            ));
        };
        if self.started.get().is_none() {
            // First use.
            return Ok(submit(
                self.started
                    .get_or_init(|| Arc::new((self.start)(&runtime))),
            ));
        }
        let mut restarted = self
            .restarted
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match restarted.as_ref() {
            Some(started) if !started.is_closed() => Ok(submit(started)),
            _ => Ok(submit(restarted.insert(Arc::new((self.start)(&runtime))))),
        }
    }

    /// The queue requests go to now, if one was started.
    fn current(&self) -> Option<Arc<StartedQueue>> {
        match self.started.get() {
            Some(first) if !first.is_closed() => Some(Arc::clone(first)),
            _ => self
                .restarted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }

    /// Queues `req` ([`Node::call`]).
    pub(crate) fn call(&self, req: &Request) -> NodeCall {
        let queued = self.with_started(|started| match started.submit(req.clone()) {
            // A release or leave is never refused for a full queue: it waits for room.
            Err(NodeFailure::Overloaded { .. }) if matches!(req.op, Op::Release | Op::Leave) => {
                Err(Arc::clone(started))
            }
            Err(failure) => Ok(Err(failure)),
            Ok(answer) => Ok(Ok((answer, started.watched().then(|| Arc::clone(started))))),
        });
        let queued = match queued {
            Ok(Err(started)) => return NodeCall::Queued(started.submit_when_room(req.clone())),
            Ok(Ok(queued)) => Ok(queued),
            Err(failure) => Err(failure),
        };
        match queued {
            Ok(Ok((answer, None))) => NodeCall::Queued(answer),
            Ok(Ok((answer, Some(started)))) => {
                NodeCall::boxed(async move { started.watched_answer(answer).await })
            }
            Ok(Err(failure)) | Err(failure) => NodeCall::boxed(std::future::ready(Err(failure))),
        }
    }

    /// Queues `advisory`, a call outside the lock protocol ([`Node::advise`]), in line with
    /// the lock calls: it runs after every call made before it.
    pub(crate) fn advise(
        &self,
        advisory: Advisory,
    ) -> BoxFuture<'static, Result<Advice, NodeFailure>> {
        let queued = self.with_started(|started| {
            let answer = started.submit_advice(advisory)?;
            Ok::<_, NodeFailure>((answer, started.watched().then(|| Arc::clone(started))))
        });
        Box::pin(async move {
            match queued?? {
                (answer, Some(started)) => started.watched_answer(answer).await,
                (answer, None) => answer.await.unwrap_or_else(|_| Err(stopped())),
            }
        })
    }

    /// Resolves once every request queued before it has run ([`Node::flush`]).
    pub(crate) fn flush(&self) -> BoxFuture<'static, ()> {
        let started = self.current();
        Box::pin(async move {
            if let Some(started) = started {
                started.flush().await;
            }
        })
    }
}

/// The most requests waiting for one node.
pub(crate) const QUEUE_CAPACITY: usize = 65_536;

/// A voter as the quorum logic sees it ([`Node`]): its queue, its address, and what says
/// whether its votes count now (a server's identity; a Cluster's always count).
pub(crate) struct QueuedNode {
    addr: String,
    queue: Queue,
    identity: Option<Arc<Identity>>,
}

impl QueuedNode {
    /// The voter at `addr` whose calls go on `queue`, its standing read from `identity`.
    pub(crate) fn new(addr: String, queue: Queue, identity: Option<Arc<Identity>>) -> Self {
        QueuedNode {
            addr,
            queue,
            identity,
        }
    }
}

impl Node for QueuedNode {
    fn call(&self, req: &Request) -> NodeCall {
        self.queue.call(req)
    }

    fn flush(&self) -> BoxFuture<'static, ()> {
        self.queue.flush()
    }

    fn advise(&self, advisory: Advisory) -> BoxFuture<'static, Result<Advice, NodeFailure>> {
        self.queue.advise(advisory)
    }

    fn addr(&self) -> &str {
        &self.addr
    }

    fn standing(&self) -> Standing {
        self.identity
            .as_ref()
            .map_or(Standing::Counts, |identity| identity.standing())
    }
}

/// The sending side of one node's queue. The serving task ends when the last `StartedQueue`
/// (the node) is dropped.
pub(crate) struct StartedQueue {
    jobs: mpsc::Sender<Job>,
    /// Whether the serving task runs on a current-thread runtime, which runs its tasks only
    /// inside `block_on`: its callers then wait with a watchdog.
    watched: bool,
    /// When the serving task last took a request or finished a call.
    progress: Arc<Progress>,
    node_timeout: Duration,
}

/// An instant, stored as microseconds since [`clock::origin`].
#[derive(Default)]
struct Progress(AtomicU64);

impl Progress {
    fn mark(&self) {
        let micros = clock::since(clock::origin()).as_micros();
        self.0
            .store(u64::try_from(micros).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// How long ago the last mark was.
    fn age(&self) -> Duration {
        let at = Duration::from_micros(self.0.load(Ordering::Relaxed));
        clock::since(clock::origin()).saturating_sub(at)
    }
}

impl StartedQueue {
    /// Starts the serving task, sending over `link`, on the current runtime. Its log lines
    /// carry the node's address `addr` (in a `redfence.node` span).
    pub(super) fn start<L: Link>(
        link: L,
        node_timeout: Duration,
        addr: &str,
        flavor: runtime::RuntimeFlavor,
    ) -> Self {
        let (jobs, queue) = mpsc::channel(QUEUE_CAPACITY);
        let progress = Arc::new(Progress::default());
        progress.mark();
        let span = tracing::debug_span!(parent: None, "redfence.node", node = %addr);
        let watched = flavor == runtime::RuntimeFlavor::CurrentThread;
        // Only a watched queue's progress is read: the others' task need not stamp it.
        let stamps = watched.then(|| Arc::clone(&progress));
        let serving = serve(queue, link, node_timeout, stamps);
        tokio::spawn(serving.instrument(span));
        StartedQueue {
            jobs,
            watched,
            progress,
            node_timeout,
        }
    }

    /// Whether the serving task is gone (its runtime shut down).
    pub(crate) fn is_closed(&self) -> bool {
        self.jobs.is_closed()
    }

    /// Whether callers wait for their answers with a watchdog ([`served`](StartedQueue::served)):
    /// the serving task runs on a current-thread runtime. (A multi-thread runtime runs its tasks for as
    /// long as it lives, and a queue whose runtime is gone is closed.)
    pub(crate) fn watched(&self) -> bool {
        self.watched
    }

    /// Waits for `answer` with the watchdog of [`served`](StartedQueue::served), for callers of
    /// a [`watched`](StartedQueue::watched) queue (the others simply await `answer`).
    pub(crate) async fn watched_answer<T>(
        &self,
        answer: oneshot::Receiver<Result<T, NodeFailure>>,
    ) -> Result<T, NodeFailure> {
        match self.served(answer).await {
            Some(Ok(reply)) => reply,
            Some(Err(_)) => Err(stopped()),
            None => Err(NodeFailure::NotRun(
                "the node's request queue runs on another Tokio runtime, which is not \
                 running (a current-thread runtime outside block_on?)",
            )),
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
        self.try_send(Job::Run(Run::new(req, reply)))?;
        Ok(answer)
    }

    /// Queues `advisory`; the answer arrives once it has run (or failed).
    fn submit_advice(
        &self,
        advisory: Advisory,
    ) -> Result<oneshot::Receiver<Result<Advice, NodeFailure>>, NodeFailure> {
        let (reply, answer) = oneshot::channel();
        self.try_send(Job::Advise { advisory, reply })?;
        Ok(answer)
    }

    /// Queues `job`, or fails at once: the queue is full, or its serving task is gone.
    fn try_send(&self, job: Job) -> Result<(), NodeFailure> {
        match self.jobs.try_send(job) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => Err(NodeFailure::Overloaded {
                queued: QUEUE_CAPACITY,
            }),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(stopped()),
        }
    }

    /// Queues a release or a leave that found the queue full as soon as there is room, behind
    /// everything queued before it (its acquire among them; the channel's waiting senders are
    /// served in order): never refused, as its keys or its place would outlive it, and sent
    /// even if its caller stops waiting for the reply (which arrives as
    /// [`submit`](Self::submit)'s).
    pub(crate) fn submit_when_room(
        &self,
        req: Request,
    ) -> oneshot::Receiver<Result<i64, NodeFailure>> {
        let (reply, answer) = oneshot::channel();
        let job = Job::Run(Run::new(req, reply));
        let jobs = self.jobs.clone();
        tokio::spawn(async move {
            // A queue that stopped answers the reply's sender with its drop: `stopped`.
            let _ = jobs.send(job).await;
        });
        answer
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::node::{GuardedWrite, Node, Op, Request, write_if_held};
    use crate::testing::fake::{FAKE_TIMEOUT, Fake, FakeNode};

    fn acquire(key: &str, token: &str) -> Request {
        Request {
            op: Op::Acquire,
            keys: vec![key.to_owned()].into(),
            token: token.into(),
            ttl_ms: 10_000,
            queue: None,
            rw: None,
        }
    }

    fn write(lock_key: &str, token: &str) -> GuardedWrite {
        GuardedWrite {
            lock_key: lock_key.into(),
            token: token.into(),
            key: "record".into(),
            value: Some("leader".into()),
            ttl_ms: 10_000,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_advisory_call_runs_in_line_after_the_lock_calls_made_before_it() {
        let node = FakeNode::new(Fake::Real);
        // Not awaited: queued, as a lock's acquire is before its holder's guarded write.
        let granted = node.call(&acquire("lock", "t1"));
        let written = write_if_held(&node, write("lock", "t1")).await;
        assert!(
            written.expect("answered"),
            "the write ran after the acquire"
        );
        assert_eq!(granted.await.expect("granted"), 1);
        assert_eq!(node.holder("record").as_deref(), Some("leader"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_advisory_call_behind_a_hung_call_is_answered_within_one_timeout() {
        let node = Arc::new(FakeNode::new(Fake::Never));
        let hung = node.call(&acquire("lock", "t1"));
        let start = tokio::time::Instant::now();
        let written = write_if_held(&*node, write("lock", "t1")).await;
        assert!(written.is_err(), "{written:?}");
        assert!(start.elapsed() <= FAKE_TIMEOUT, "{:?}", start.elapsed());
        assert!(hung.await.is_err());
        // The node answers again: the next call runs.
        node.set(Op::Acquire, Fake::Real);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            node.call(&acquire("other", "t2")).await.expect("granted"),
            1
        );
    }
}
