//! A node's serving task: takes everything waiting, up to the caps, sends it as one batch over
//! the node's [`Link`], and answers each request (see the [module](super) docs).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::resend::Resend;
use super::{Progress, QUEUE_CAPACITY};
use crate::clock;
use crate::error::NodeFailure;
use crate::node::Op;
use crate::node::batch::{Batch, Job, Link, Run};

/// Serves the queue until every sender is gone and nothing is left to resend.
pub(super) async fn serve<L: Link>(
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
mod tests {
    use super::*;
    use crate::node::batch::test_jobs::job;
    use tokio::sync::oneshot;

    fn tokens(backlog: &VecDeque<Job>) -> Vec<String> {
        backlog
            .iter()
            .map(|job| match job {
                Job::Run(run) => run.req.token.to_string(),
                Job::Flush(_) => "flush".to_owned(),
                Job::Advise { .. } => "advise".to_owned(),
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
