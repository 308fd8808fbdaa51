//! Fan-out: every request goes to all nodes at once; the round is decided as soon as a
//! majority agreed or a majority became impossible. Each node bounds its own calls
//! (`node_timeout` on the call in flight) and runs them in the order they were made, to their
//! end even when the round stopped waiting for them: the stragglers finish on their node's
//! queue (which `Redlock::close` flushes), and a lock's later call never overtakes them there.

use std::task::Poll;
use std::time::Duration;

use tokio_util::task::TaskTracker;

use super::tally::{Failed, Tally, Until, drift, validity};
use crate::error::NodeFailure;
use crate::node::{NodeCall, Nodes, Op, Request};
use crate::{Error, clock};

/// The node calls of a round still running, by node index. A round has a handful, so they
/// are polled together on every wake-up, with no allocation or waker per call (unlike a
/// `FuturesUnordered`).
pub(crate) struct Calls(Vec<Option<NodeCall>>);

impl Calls {
    /// The next call to finish, with its node's index; `None` once none is left.
    async fn next(&mut self) -> Option<(usize, Result<i64, NodeFailure>)> {
        std::future::poll_fn(|cx| {
            let mut running = false;
            for (index, slot) in self.0.iter_mut().enumerate() {
                if let Some(call) = slot {
                    if let Poll::Ready(result) = std::pin::Pin::new(call).poll(cx) {
                        *slot = None;
                        return Poll::Ready(Some((index, result)));
                    }
                    running = true;
                }
            }
            if running {
                Poll::Pending
            } else {
                Poll::Ready(None)
            }
        })
        .await
    }
}

impl Calls {
    /// Waits for every call (each bounded), whatever it answers.
    async fn drain(mut self) {
        while self.next().await.is_some() {}
    }
}

/// A decided round: the votes, and the calls still running when it was decided.
pub(crate) struct Round {
    pub(crate) tally: Tally,
    pending: Calls,
}

impl Round {
    /// The votes so far; the calls still running finish on their nodes' queues, in order
    /// before anything sent to those nodes later.
    pub(crate) fn into_tally(self) -> Tally {
        self.tally
    }

    /// Waits for the calls still running (each bounded by its node) and counts them in.
    pub(crate) async fn finish(mut self, nodes: &Nodes, op: Op) -> Tally {
        while let Some((index, result)) = self.pending.next().await {
            self.tally.record(nodes, op, index, result);
        }
        self.tally
    }
}

/// Sends `req` to every node at once and returns as soon as the round is decided by `until`,
/// with the calls still running.
pub(crate) async fn fan_out(nodes: &Nodes, req: &Request, until: Until) -> Round {
    let calls = calls_to(nodes, req, |_| true);
    decide(calls, nodes, req.op, until).await
}

/// Queues `req` on every node whose index `to` takes: by the time this returns, it runs
/// there before anything sent later.
fn calls_to(nodes: &Nodes, req: &Request, to: impl Fn(usize) -> bool) -> Calls {
    let calls = nodes
        .iter()
        .enumerate()
        .map(|(index, node)| to(index).then(|| node.call(req)))
        .collect();
    Calls(calls)
}

/// Counts the outcomes of `pending` until the round is decided by `until`.
async fn decide(mut pending: Calls, nodes: &Nodes, op: Op, until: Until) -> Round {
    let mut tally = Tally::new(nodes.len());
    while !tally.decided(until) {
        let Some((index, result)) = pending.next().await else {
            break;
        };
        tally.record(nodes, op, index, result);
    }
    Round { tally, pending }
}

/// One acquire attempt over `nodes`: fan out, count, compute the validity, and on failure
/// release on every node that did not refuse (also those that failed or timed out: their
/// write may have landed).
///
/// On success returns how long after `start` the lock stays valid (`ttl - drift`): the caller
/// adds it to an instant taken before the call, which keeps the validity conservative.
///
/// `ttl` is the lock's TTL, from which the validity is computed: the keys' TTL on the servers
/// (`req.ttl_ms`) may be longer by the lock-delay.
pub(crate) async fn acquire_round(
    nodes: &Nodes,
    req: &Request,
    ttl: Duration,
    drift_factor: f64,
    tasks: &TaskTracker,
) -> Result<Duration, Failed> {
    debug_assert_eq!(req.op, Op::Acquire);
    let start = clock::now();
    let round = fan_out(nodes, req, Until::Granted).await;
    let elapsed = clock::since(start);
    round.tally.trace();
    let reached = round.tally.reached();
    if reached && let Some(valid) = validity(ttl, elapsed, drift_factor) {
        return Ok(elapsed + valid);
    }
    // Failed. The answers still due complete the error (each bounded: a hung node answers
    // with the node timeout) and spare a release where a node refused.
    let tally = round.finish(nodes, req.op).await;
    tally.trace();
    // A node that refused wrote nothing: no release there. Every node that answered
    // otherwise is waited for, so that nothing is left there when this returns (a process
    // may exit next, and a task left to a current-thread runtime runs only while it is in
    // `block_on`): those that granted, and those whose grant did not count (a restarted
    // node in quarantine wrote its key all the same) or that answered with an error. One
    // that did not answer (timed out, unreachable, its queue full) may have taken the write
    // too: its release is queued now, behind its acquire, and waited for in the background
    // (`close` waits for it), since waiting for a node that just timed out could cost the
    // attempt another node timeout.
    let release = failed_attempt_release(req);
    let unanswered_on = |index: usize| {
        tally
            .errors
            .iter()
            .any(|e| e.index == index && !answered(&e.failure))
    };
    if tally.errors.iter().any(|e| !answered(&e.failure)) {
        tasks.spawn(calls_to(nodes, &release, unanswered_on).drain());
    }
    let answered_on = |index: usize| !unanswered_on(index) && !tally.refused_by.contains(&index);
    calls_to(nodes, &release, answered_on).drain().await;
    Err(if reached {
        Failed::Other(Error::NoValidity {
            ttl,
            elapsed,
            drift: drift(ttl, drift_factor),
        })
    } else {
        tally.acquire_failure()
    })
}

/// Whether a node whose call failed with `failure` answered it: its grant did not count
/// (restart quarantine), or it replied with an error. Its release is then as quick as its
/// answer was, and worth waiting for.
fn answered(failure: &NodeFailure) -> bool {
    failure.class().answered()
}

/// The release that undoes a failed attempt's acquire. It keeps the attempt's place in any
/// fair queue: only a lock's own release leaves it.
fn failed_attempt_release(req: &Request) -> Request {
    Request {
        op: Op::Release,
        queue: None,
        ..req.clone()
    }
}

/// Compare-and-delete on every node, waiting for each (bounded by its node), so that
/// nothing of ours is left behind when this returns (an acquisition whose fencing token could
/// not be issued).
pub(crate) async fn release_everywhere(nodes: &Nodes, req: &Request) -> Tally {
    let release = failed_attempt_release(req);
    fan_out(nodes, &release, Until::All)
        .await
        .finish(nodes, Op::Release)
        .await
}

#[cfg(test)]
mod tests;
