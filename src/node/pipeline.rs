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
//!   and extends, never sent, are dropped.
//! - A release or leave whose call timed out or lost its connection is sent again, alone or
//!   with the next batch, until a call carrying it is answered or its lock's TTL has passed
//!   (its keys are gone then anyway): a connection that resets, a node paused for longer than
//!   the node timeout, never leave a lock key behind a release. A [`flush`](Pipeline::flush)
//!   (what `Redlock::close` waits for) waits for these too.
//! - The queue is bounded ([`QUEUE_CAPACITY`]): a request that finds it full fails with
//!   [`NodeFailure::Overloaded`] instead of queueing without bound.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::ErrorKind;
use tokio::runtime;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use super::batch::{Batch, Job, Link};
use super::resend::Resend;
use super::{Op, Request, stopped};
use crate::clock;
use crate::error::NodeFailure;

/// The most requests waiting for one node.
pub(crate) const QUEUE_CAPACITY: usize = 65_536;

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

impl Pipeline {
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
        Pipeline {
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

    /// Whether callers wait for their answers with a watchdog ([`served`](Pipeline::served)):
    /// the serving task runs on a current-thread runtime. (A multi-thread runtime runs its tasks for as
    /// long as it lives, and a queue whose runtime is gone is closed.)
    pub(crate) fn watched(&self) -> bool {
        self.watched
    }

    /// Waits for `answer` with the watchdog of [`served`](Pipeline::served), for callers of
    /// a [`watched`](Pipeline::watched) queue (the others simply await `answer`).
    pub(crate) async fn watched_answer(
        &self,
        answer: oneshot::Receiver<Result<i64, NodeFailure>>,
    ) -> Result<i64, NodeFailure> {
        match self.served(answer).await {
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
            resend_until: None,
        }) {
            Ok(()) => Ok(answer),
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
        let job = Job::Run {
            req,
            reply: Some(reply),
            resend_until: None,
        };
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
        let first = resend.hold_flush(first);
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
                    Job::Run {
                        resend_until: Some(_),
                        ..
                    }
                ) {
                    resend.jobs.push(next);
                } else {
                    backlog.push_front(next);
                }
                break;
            }
        }
        // (A timeout too long for an Instant leaves the first, far-future deadline.)
        if let Some(at) = tokio::time::Instant::from_std(clock::now()).checked_add(timeout) {
            deadline.as_mut().reset(at);
        }
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
                if matches!(failure, NodeFailure::Timeout(_)) {
                    // Every request queued behind a hung call has waited long enough: answer
                    // it now. (A flush among them keeps its place: it is held, if need be,
                    // when its turn comes, so that it never passes what was queued before it.)
                    while let Ok(job) = queue.try_recv() {
                        backlog.push_back(job);
                    }
                    answer_behind_hung_call(&mut backlog, &failure);
                }
            }
        }
        resend.settle();
    }
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
    backlog.retain_mut(|job| match job {
        Job::Run { req, reply, .. } => {
            if let Some(reply) = reply.take() {
                let _ = reply.send(Err(failure.clone()));
            }
            if !matches!(req.op, Op::Release | Op::Leave) {
                return false;
            }
            cleanups += 1;
            cleanups <= QUEUE_CAPACITY
        }
        Job::Flush(_) => true,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::batch::test_jobs::job;

    fn tokens(backlog: &VecDeque<Job>) -> Vec<String> {
        backlog
            .iter()
            .map(|job| match job {
                Job::Run { req, .. } => req.token.to_string(),
                Job::Flush(_) => "flush".to_owned(),
            })
            .collect()
    }

    #[test]
    fn behind_a_hung_call_every_caller_is_answered_and_the_cleanups_are_kept_in_order() {
        let failure = NodeFailure::Timeout(Duration::from_millis(50));
        let mut backlog = VecDeque::new();
        let mut answers = Vec::new();
        for (op, token) in [
            (Op::Acquire, "a1"),
            (Op::Release, "r1"),
            (Op::Extend, "e1"),
            (Op::Leave, "l1"),
            (Op::Release, "r2"),
        ] {
            let (job, answer) = job(op, token);
            backlog.push_back(job);
            answers.push(answer);
        }
        let (flushed, _) = oneshot::channel();
        backlog.push_back(Job::Flush(flushed));

        answer_behind_hung_call(&mut backlog, &failure);

        for mut answer in answers {
            assert!(matches!(
                answer.try_recv(),
                Ok(Err(NodeFailure::Timeout(_)))
            ));
        }
        // The acquire and the extend were never sent: dropped.
        let kept = ["r1", "l1", "r2", "flush"];
        assert_eq!(tokens(&backlog), kept);
        // A second timeout answers nobody twice and keeps the same jobs.
        answer_behind_hung_call(&mut backlog, &failure);
        assert_eq!(tokens(&backlog), kept);
    }

    #[test]
    fn a_node_that_stays_hung_keeps_a_bounded_backlog() {
        let failure = NodeFailure::Timeout(Duration::from_millis(50));
        let mut backlog = VecDeque::new();
        for round in 0..3 {
            for i in 0..QUEUE_CAPACITY {
                backlog.push_back(job(Op::Release, &format!("r{round}-{i}")).0);
                backlog.push_back(job(Op::Acquire, &format!("a{round}-{i}")).0);
            }
            answer_behind_hung_call(&mut backlog, &failure);
            assert_eq!(backlog.len(), QUEUE_CAPACITY);
        }
        // The oldest releases are kept: they follow the acquires most likely to have landed.
        assert_eq!(tokens(&backlog)[..2], ["r0-0", "r0-1"]);
    }
}
