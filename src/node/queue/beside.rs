//! What a node's queue does beside sending a lock call once:
//!
//! - it sends again the releases and leaves whose call timed out or lost its connection (see
//!   `Batch::fail`), until a call carrying them is answered or they expire, and holds the
//!   flush markers (what `Redlock::close` waits on) that wait for them ([`Resend`]);
//! - it answers advisory calls, flushes, a release's wait for room in a full queue, and the
//!   callers of a queue served on a current-thread runtime (a watchdog).

use std::future::Future;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use super::{Queue, StartedQueue};
use crate::clock;
use crate::error::NodeFailure;
use crate::node::batch::{Job, Run};
use crate::node::{Advice, Advisory, Request, stopped};

/// The longest pause before resending alone to a node whose calls keep failing.
const MAX_RESEND_PAUSE: Duration = Duration::from_secs(1);
/// The releases and leaves a node's queue sends again, and the flushes waiting for them.
pub(super) struct Resend {
    pub(super) jobs: Vec<Job>,
    /// Flush markers that arrived while something was to be sent again: answered once
    /// nothing is.
    pub(super) flushes: Vec<oneshot::Sender<()>>,
    /// The first pause before sending them again alone, after a failed call; it doubles with
    /// each failed call in a row, up to [`MAX_RESEND_PAUSE`].
    pause: Duration,
    /// Failed calls in a row.
    failures: u32,
    /// The most kept (the node's queue capacity).
    cap: usize,
    /// When they may be sent again alone (nothing else to send); set whenever `jobs` is not
    /// empty.
    next: Option<tokio::time::Instant>,
}

impl Resend {
    pub(super) fn new(node_timeout: Duration, cap: usize) -> Self {
        Resend {
            jobs: Vec::new(),
            flushes: Vec::new(),
            pause: node_timeout.clamp(Duration::from_millis(5), MAX_RESEND_PAUSE),
            failures: 0,
            cap,
            next: None,
        }
    }

    /// The next job: one from the queue, or, once the pause after a failed call is over, one
    /// to send again. `None` when the queue is closed and nothing is left to send.
    pub(super) async fn next_job(
        &mut self,
        queue: &mut mpsc::Receiver<Job>,
        open: &mut bool,
    ) -> Option<Job> {
        loop {
            let Some(at) = self.next.filter(|_| !self.jobs.is_empty()) else {
                if !*open {
                    return None;
                }
                return queue.recv().await;
            };
            if !*open {
                tokio::time::sleep_until(at).await;
                self.next = None;
                return self.jobs.pop();
            }
            tokio::select! {
                job = queue.recv() => match job {
                    Some(job) => return Some(job),
                    None => *open = false,
                },
                () = tokio::time::sleep_until(at) => {
                    self.next = None;
                    return self.jobs.pop();
                }
            }
        }
    }

    /// `job`, or `job`'s place taken by nothing when it is a flush that must wait for what is
    /// to be sent again (it is answered by [`settle`](Self::settle)).
    pub(super) fn hold_flush(&mut self, job: Job) -> Job {
        match job {
            Job::Flush(done) if !self.jobs.is_empty() => {
                self.flushes.push(done);
                // An empty flush keeps the batch's shape: answered with it.
                let (placeholder, _) = oneshot::channel();
                Job::Flush(placeholder)
            }
            job => job,
        }
    }

    /// A call failed: what is to be sent again waits for the pause (unless other requests
    /// go first, which it joins), and at most `cap` are kept (the oldest:
    /// they follow the acquires most likely to have landed).
    pub(super) fn failed(&mut self) {
        self.jobs.truncate(self.cap);
        let pause = self
            .pause
            .saturating_mul(1 << self.failures.min(8))
            .min(MAX_RESEND_PAUSE);
        self.failures = self.failures.saturating_add(1);
        if !self.jobs.is_empty() {
            self.next = Some(tokio::time::Instant::now() + pause);
        }
    }

    /// A call was answered: the node is back, the pauses start short again.
    pub(super) fn answered(&mut self) {
        self.failures = 0;
    }

    /// Drops what has run out of time, and answers the waiting flushes once nothing is left.
    pub(super) fn settle(&mut self) {
        let now = clock::now();
        self.jobs.retain(|job| match job {
            Job::Run(run) => run.resend_until.is_some_and(|until| now < until),
            Job::Flush(_) => true,
            Job::Advise { .. } => false,
        });
        if self.jobs.is_empty() {
            self.next = None;
            for done in self.flushes.drain(..) {
                let _ = done.send(());
            }
        } else if self.next.is_none() {
            // Left over from a full batch that was answered: next, with no pause.
            self.next = Some(tokio::time::Instant::now());
        }
    }
}

impl Queue {
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

impl StartedQueue {
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

    /// Queues `advisory`; the answer arrives once it has run (or failed).
    fn submit_advice(
        &self,
        advisory: Advisory,
    ) -> Result<oneshot::Receiver<Result<Advice, NodeFailure>>, NodeFailure> {
        let (reply, answer) = oneshot::channel();
        self.try_send(Job::Advise { advisory, reply })?;
        Ok(answer)
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
    use super::*;
    use crate::node::Op;
    use crate::node::batch::Run;
    use crate::node::batch::test_jobs::job;

    const CAP: usize = 1_000;

    fn resent(op: Op, token: &str, for_ms: u64) -> Job {
        let (job, _) = job(op, token);
        let Job::Run(run) = job else {
            unreachable!("job() makes a run")
        };
        Job::Run(Run::resent(
            run.req,
            clock::now() + Duration::from_millis(for_ms),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn a_flush_waits_for_what_is_resent_and_is_answered_once_it_is_gone() {
        let mut resend = Resend::new(Duration::from_millis(50), CAP);
        // Nothing to resend: a flush goes through as it is (its batch answers it).
        let (done, mut flushed) = oneshot::channel();
        let Job::Flush(through) = resend.hold_flush(Job::Flush(done)) else {
            panic!("a flush stays a flush")
        };
        let _ = through.send(());
        assert!(flushed.try_recv().is_ok(), "the flush itself went through");
        // With a release to resend, a flush is held (a placeholder takes its place).
        resend.jobs.push(resent(Op::Release, "r1", 1_000));
        resend.failed();
        let (done, mut flushed) = oneshot::channel();
        let placeholder = resend.hold_flush(Job::Flush(done));
        assert!(matches!(placeholder, Job::Flush(_)));
        resend.settle();
        assert!(
            flushed.try_recv().is_err(),
            "answered while a release waits"
        );
        assert!(resend.next.is_some(), "the release has a time to go again");
        // Sent and answered (taken into a batch that succeeded): the flush is answered.
        let taken = resend.jobs.pop();
        assert!(taken.is_some());
        resend.settle();
        assert!(
            flushed.try_recv().is_ok(),
            "answered once nothing is to be resent"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn resends_expire_at_their_deadline_and_are_bounded() {
        let mut resend = Resend::new(Duration::from_millis(50), CAP);
        resend.jobs.push(resent(Op::Release, "short", 100));
        resend.jobs.push(resent(Op::Leave, "long", 10_000));
        let (done, mut flushed) = oneshot::channel();
        let _ = resend.hold_flush(Job::Flush(done));
        tokio::time::advance(Duration::from_millis(200)).await;
        resend.settle();
        let left: Vec<String> = resend
            .jobs
            .iter()
            .map(|job| match job {
                Job::Run(run) => run.req.token.to_string(),
                Job::Flush(_) => "flush".to_owned(),
                Job::Advise { .. } => "advise".to_owned(),
            })
            .collect();
        assert_eq!(left, ["long"]);
        assert!(flushed.try_recv().is_err());
        tokio::time::advance(Duration::from_secs(10)).await;
        resend.settle();
        assert!(resend.jobs.is_empty() && resend.next.is_none());
        assert!(
            flushed.try_recv().is_ok(),
            "answered once every resend expired"
        );
        // At most QUEUE_CAPACITY are kept, the oldest.
        for i in 0..CAP + 10 {
            resend
                .jobs
                .push(resent(Op::Release, &format!("r{i}"), 1_000));
        }
        resend.failed();
        assert_eq!(resend.jobs.len(), CAP);
    }

    #[tokio::test(start_paused = true)]
    async fn the_pause_before_a_resend_doubles_with_each_failure_and_resets_once_answered() {
        let mut resend = Resend::new(Duration::from_millis(50), CAP);
        resend.jobs.push(resent(Op::Release, "r1", 60_000));
        let mut pauses = Vec::new();
        for _ in 0..7 {
            resend.failed();
            let next = resend.next.expect("a time to resend");
            pauses.push((next - tokio::time::Instant::now()).as_millis());
        }
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1_000, 1_000]);
        resend.answered();
        resend.failed();
        let next = resend.next.expect("a time to resend");
        assert_eq!((next - tokio::time::Instant::now()).as_millis(), 50);
    }
}
