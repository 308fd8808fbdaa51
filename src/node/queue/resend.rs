//! What a node's queue sends again: the releases and leaves whose call timed out or lost its
//! connection (see `Batch::fail`), until a call carrying them is answered or they expire, and
//! the flush markers (what `Redlock::close` waits on) that wait for them.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::clock;
use crate::node::batch::Job;

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
