//! Fan-out: every request goes to all nodes at once, each call bounded by `node_timeout`; the
//! round is decided as soon as a majority agreed or a majority became impossible, and the
//! stragglers finish in the background (tracked, so that `Redlock::close` can wait for them).

use std::sync::{Arc, LazyLock};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::watch;
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
    answered: Vec<bool>,
    /// Which nodes order and bound their own calls (see `Node::pipelined`).
    pipelined: Vec<bool>,
}

impl Round {
    /// The votes so far; the calls still running finish in the background (each bounded by
    /// the node timeout), and the returned [`Settled`] tells a later round when they have.
    pub(crate) fn into_parts(self, tasks: &TaskTracker) -> (Tally, Settled) {
        // Only calls to nodes that do not order them need following: a pipelined node runs
        // a dropped call to its end, before anything queued after it.
        let gated: Vec<bool> = self
            .answered
            .iter()
            .zip(&self.pipelined)
            .map(|(answered, pipelined)| !answered && !pipelined)
            .collect();
        if !gated.contains(&true) {
            return (self.tally, Settled::none());
        }
        let (done, rx) = watch::channel(false);
        // Only those: a pipelined node's call, dropped, still runs to its end, and it may be
        // answered long after the node timeout under load (queued behind others), which a
        // gated call must not wait for.
        let mut pending = self.pending;
        for (call, pipelined) in pending.0.iter_mut().zip(&self.pipelined) {
            if *pipelined {
                *call = None;
            }
        }
        tasks.spawn(async move {
            pending.drain().await;
            let _ = done.send(true);
        });
        let settled = Settled {
            pending: gated.into(),
            done: rx,
        };
        (self.tally, settled)
    }

    /// Waits for the calls still running (each bounded by the node timeout) and counts them in.
    pub(crate) async fn finish(mut self, nodes: &Nodes, op: Op) -> Tally {
        while let Some((index, result)) = self.pending.next().await {
            self.tally.record(nodes, op, index, result);
        }
        self.tally
    }
}

/// The nodes whose call in an earlier round of a lock was still running when that round was
/// decided, and a way to wait until those calls have finished or timed out.
///
/// A later round of the same lock sends to those nodes only after that, so that on each node
/// the lock's requests run in the order they were made: a release never overtakes the acquire
/// it undoes (which would leave our key behind until its TTL). On a plain node this holds
/// across a reconnect too (its queue sends a call given up before anything after it). A
/// Cluster or Sentinel voter sends a call given up at `node_timeout` on a connection it then
/// replaces: a hung server that resumes may run that acquire after the release that came on
/// the new connection, and the key stays until its TTL there (availability, not safety: the
/// token is ours alone).
#[derive(Clone, Debug)]
pub(crate) struct Settled {
    pending: Arc<[bool]>,
    done: watch::Receiver<bool>,
}

impl Settled {
    /// Nothing to wait for.
    pub(crate) fn none() -> Self {
        // Made once: most rounds have nothing to wait for, and cloning is two `Arc` clones.
        static NONE: LazyLock<Settled> = LazyLock::new(|| {
            let (_, rx) = watch::channel(true);
            Settled {
                pending: Arc::from(Vec::new()),
                done: rx,
            }
        });
        NONE.clone()
    }

    fn holds(&self, index: usize) -> bool {
        self.pending.get(index).copied().unwrap_or(false)
    }

    async fn wait(mut self) {
        // An error means the draining task is gone (its runtime shut down): nothing to wait for.
        let _ = self.done.wait_for(|done| *done).await;
    }
}

/// Sends `req` to every node at once, each call bounded by `timeout`, and returns as soon as
/// the round is decided by `until`, with the calls still running. A node that still had a
/// call running from the earlier round `after` gets this request only once that call ended;
/// the same `timeout` bounds the wait and the call together, so no node's answer takes longer
/// than `timeout` after the round started.
pub(crate) async fn fan_out(
    nodes: &Nodes,
    req: &Request,
    timeout: Duration,
    until: Until,
    after: &Settled,
) -> Round {
    let calls = calls_to(nodes, req, timeout, after, |_| true);
    decide(calls, nodes, req.op, until).await
}

/// Starts `req`'s call to every node whose index `to` takes. A node that orders its own
/// calls (see `Node::pipelined`) has the request queued by the time this returns, so that it
/// runs there before anything sent later.
fn calls_to(
    nodes: &Nodes,
    req: &Request,
    timeout: Duration,
    after: &Settled,
    to: impl Fn(usize) -> bool,
) -> Calls {
    let calls = nodes
        .iter()
        .enumerate()
        .map(|(index, node)| {
            if !to(index) {
                return None;
            }
            let call = node.call(req);
            if node.pipelined() {
                // The node orders its calls and bounds each one itself.
                return Some(call);
            }
            let gate = after.holds(index).then(|| after.clone());
            // One timeout covers the wait for the earlier call and this call together, so a
            // node costs a lock at most one `timeout` per round however many rounds it had:
            // waits never chain from round to round. A call whose turn has not come by then
            // is never sent (the node is skipped for this round).
            let call = NodeCall::boxed(async move {
                let gated = async move {
                    if let Some(gate) = gate {
                        gate.wait().await;
                    }
                    call.await
                };
                match tokio::time::timeout(timeout, gated).await {
                    Ok(result) => result,
                    Err(_) => Err(NodeFailure::Timeout(timeout)),
                }
            });
            Some(call)
        })
        .collect();
    Calls(calls)
}

/// Counts the outcomes of `pending` until the round is decided by `until`.
async fn decide(mut pending: Calls, nodes: &Nodes, op: Op, until: Until) -> Round {
    let mut tally = Tally::new(nodes.len());
    let mut answered = vec![false; nodes.len()];
    while !tally.decided(until) {
        let Some((index, result)) = pending.next().await else {
            break;
        };
        answered[index] = true;
        tally.record(nodes, op, index, result);
    }
    let pipelined = nodes.iter().map(|node| node.pipelined()).collect();
    Round {
        tally,
        pending,
        answered,
        pipelined,
    }
}

/// One acquire attempt over `nodes`: fan out, count, compute the validity, and on failure
/// release on every node that did not refuse (also those that failed or timed out: their
/// write may have landed).
///
/// On success returns how long after `start` the lock stays valid (`ttl - drift`) — the caller
/// adds it to an instant taken before the call, which keeps the validity conservative — and
/// the calls still running, which later rounds of the lock must follow.
pub(crate) async fn acquire_round(
    nodes: &Nodes,
    req: &Request,
    node_timeout: Duration,
    drift_factor: f64,
    tasks: &TaskTracker,
) -> Result<(Duration, Settled), Failed> {
    debug_assert_eq!(req.op, Op::Acquire);
    let ttl = Duration::from_millis(req.ttl_ms);
    let start = clock::now();
    let round = fan_out(nodes, req, node_timeout, Until::Granted, &Settled::none()).await;
    let elapsed = clock::since(start);
    round.tally.trace();
    let reached = round.tally.reached();
    if reached && let Some(valid) = validity(ttl, elapsed, drift_factor) {
        let (_, settled) = round.into_parts(tasks);
        return Ok((elapsed + valid, settled));
    }
    // Failed. The answers still due complete the error (each bounded: a hung node answers
    // with the node timeout) and spare a release where a node refused.
    let tally = round.finish(nodes, req.op).await;
    tally.trace();
    // A node that refused wrote nothing: no release there. One that failed or timed out may
    // have taken the write: released in the background, queued now behind its acquire
    // (`close` waits for it), since waiting for a node that just timed out could cost the
    // attempt another node timeout. The nodes that granted are waited for, so that nothing
    // is left there when this returns (a process may exit next).
    let release = failed_attempt_release(req);
    let failed_on = |index: usize| tally.errors.iter().any(|e| e.index == index);
    if !tally.errors.is_empty() {
        tasks.spawn(calls_to(nodes, &release, node_timeout, &Settled::none(), failed_on).drain());
    }
    let granted_on = |index: usize| !failed_on(index) && !tally.refused_by.contains(&index);
    calls_to(nodes, &release, node_timeout, &Settled::none(), granted_on)
        .drain()
        .await;
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

/// The release that undoes a failed attempt's acquire. It keeps the attempt's place in any
/// fair queue: only a lock's own release leaves it.
fn failed_attempt_release(req: &Request) -> Request {
    Request {
        op: Op::Release,
        queue: None,
        ..req.clone()
    }
}

/// Compare-and-delete on every node, waiting for each (bounded by the timeout), so that
/// nothing of ours is left behind when this returns (an acquisition whose fencing token could
/// not be issued).
pub(crate) async fn release_everywhere(
    nodes: &Nodes,
    req: &Request,
    node_timeout: Duration,
    after: &Settled,
) -> Tally {
    let release = failed_attempt_release(req);
    fan_out(nodes, &release, node_timeout, Until::All, after)
        .await
        .finish(nodes, Op::Release)
        .await
}

#[cfg(test)]
mod tests;
