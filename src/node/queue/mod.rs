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

mod beside;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::runtime;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use self::beside::Resend;
use super::batch::{Batch, Job, Link, Run};
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

    /// Queues `req`; the reply arrives once its batch has run (or failed).
    pub(crate) fn submit(
        &self,
        req: Request,
    ) -> Result<oneshot::Receiver<Result<i64, NodeFailure>>, NodeFailure> {
        let (reply, answer) = oneshot::channel();
        self.try_send(Job::Run(Run::new(req, reply)))?;
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
}

/// Serves the queue until every sender is gone and nothing is left to resend.
async fn serve<L: Link>(
    mut queue: mpsc::Receiver<Job>,
    mut link: L,
    timeout: Duration,
    progress: Option<Arc<Progress>>,
) {
    // Requests taken off the queue but not sent yet, in order: the one that did not fit the
    // last batch, and those that waited behind a hung call (their callers already answered).
    let mut backlog: VecDeque<Job> = VecDeque::new();
    // Releases and leaves given up, to send again (see `Batch::fail`), and the flush markers
    // that wait for them.
    let mut resend = Resend::new(timeout, QUEUE_CAPACITY);
    // One timer for every call: moving its deadline later is an atomic store, where a new
    // timer per call is an insert into the timer wheel (and a wake-up of the thread that
    // sleeps on it, when the runtime is idle).
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut batch = Batch::default();
    let mut open = true;
    loop {
        let first = match backlog.pop_front() {
            Some(job) => job,
            None => match resend.next_job(&mut queue, &mut open).await {
                Some(job) => job,
                None => return,
            },
        };
        if let Some(progress) = &progress {
            progress.mark();
        }
        let first = match resend.hold_flush(first) {
            Job::Advise { advisory, reply } => {
                reset(deadline.as_mut(), timeout);
                let advised = tokio::select! {
                    biased;
                    advised = link.advise(&advisory) => advised,
                    () = deadline.as_mut() => Err(NodeFailure::Timeout(timeout)),
                };
                if let Some(progress) = &progress {
                    progress.mark();
                }
                let timed_out = match &advised {
                    Err(failure @ NodeFailure::Timeout(_)) => Some(failure.clone()),
                    _ => None,
                };
                let _ = reply.send(advised);
                if let Some(failure) = timed_out.filter(|_| link.hangs_whole()) {
                    // As behind a hung batch.
                    hung(&mut queue, &mut backlog, &failure);
                }
                continue;
            }
            first => first,
        };
        batch.start(first);
        // Coalesce what is already waiting, up to the caps, in order; then what is to be
        // sent again.
        while !batch.full() {
            let next = match backlog.pop_front() {
                Some(job) => resend.hold_flush(job),
                None => match queue.try_recv() {
                    Ok(job) => resend.hold_flush(job),
                    Err(_) => match resend.jobs.pop() {
                        Some(job) => job,
                        None => break,
                    },
                },
            };
            if let Err(next) = batch.try_push(next) {
                // A resend stays counted as one (what holds the flushes); anything else
                // keeps its place in line.
                if matches!(
                    next,
                    Job::Run(Run {
                        resend_until: Some(_),
                        ..
                    })
                ) {
                    resend.jobs.push(next);
                } else {
                    backlog.push_front(next);
                }
                break;
            }
        }
        reset(deadline.as_mut(), timeout);
        let ran = batch
            .run(
                &mut link,
                timeout,
                deadline.as_mut(),
                &mut resend.jobs,
                &mut resend.flushes,
            )
            .await;
        if let Some(progress) = &progress {
            progress.mark();
        }
        match ran {
            Ok(true) => resend.answered(),
            // Some requests failed alone (a hung member of a Cluster): what they leave to
            // send again waits for the pause.
            Ok(false) => resend.failed(),
            Err(failure) => {
                batch.fail(&failure, &mut resend.jobs, &mut resend.flushes);
                resend.failed();
                if matches!(failure, NodeFailure::Timeout(_)) && link.hangs_whole() {
                    // Every request queued behind a hung call has waited long enough: answer
                    // it now. (A flush among them keeps its place: it is held, if need be,
                    // when its turn comes, so that it never passes what was queued before it.)
                    hung(&mut queue, &mut backlog, &failure);
                }
            }
        }
        resend.settle();
    }
}

/// Sets `deadline` `timeout` from now. (A timeout too long for an Instant leaves the first,
/// far-future deadline.)
fn reset(deadline: std::pin::Pin<&mut tokio::time::Sleep>, timeout: Duration) {
    if let Some(at) = tokio::time::Instant::from_std(clock::now()).checked_add(timeout) {
        deadline.reset(at);
    }
}

/// After a call that timed out: takes everything queued behind it into `backlog` and answers
/// it ([`answer_behind_hung_call`]).
fn hung(queue: &mut mpsc::Receiver<Job>, backlog: &mut VecDeque<Job>, failure: &NodeFailure) {
    while let Ok(job) = queue.try_recv() {
        backlog.push_back(job);
    }
    answer_behind_hung_call(backlog, failure);
}

/// Answers every request of `backlog` (those queued behind a call that timed out, never
/// sent) with `failure`. Acquires and extends are dropped: their callers counted this node as
/// failed, and sent once it answers again they could only leave keys behind (an acquire) or
/// keep alive what the lock no longer counts on here (an extend). Releases and fair queue
/// leaves are kept, to be sent in order when their turn comes (a release must follow an
/// acquire in the call that timed out, which may land yet), at most [`QUEUE_CAPACITY`] of
/// them, plus the flush markers: so a node that stays hung while traffic goes on holds a
/// bounded backlog. A release dropped beyond the cap leaves its key to expire at its TTL, on
/// that node only.
fn answer_behind_hung_call(backlog: &mut VecDeque<Job>, failure: &NodeFailure) {
    let mut cleanups = 0;
    for job in std::mem::take(backlog) {
        match job {
            Job::Run(mut run) => {
                if let Some(reply) = run.reply.take() {
                    let _ = reply.send(Err(failure.clone()));
                }
                if matches!(run.req.op, Op::Release | Op::Leave) && cleanups < QUEUE_CAPACITY {
                    cleanups += 1;
                    backlog.push_back(Job::Run(run));
                }
            }
            Job::Flush(done) => backlog.push_back(Job::Flush(done)),
            Job::Advise { reply, .. } => {
                let _ = reply.send(Err(failure.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests;
