//! The Redlock quorum round. Every request goes to all nodes at once, and the round is decided
//! as soon as a majority agreed or a majority became impossible. Each node bounds its own calls
//! (`node_timeout` on the call in flight) and runs them in the order they were made, to their
//! end even when the round stopped waiting for them: the stragglers finish on their node's
//! queue (which `Redlock::close` flushes), and a lock's later call never overtakes them there.
//!
//! The vote counting (majority, drift, validity, the [`Tally`] of a round) is pure: no I/O and
//! no clock, everything a function of its arguments.

use std::task::Poll;
use std::time::Duration;

use tokio_util::task::TaskTracker;

use crate::error::{LossReason, NodeError, NodeFailure};
use crate::memory::Standing;
use crate::node::{NodeCall, Nodes, Op, Request};
use crate::{Error, clock};

/// The size of a majority of `nodes`: `floor(nodes / 2) + 1`.
pub(crate) fn quorum(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// The clock-drift allowance for a TTL: `ttl * drift_factor + 2 ms`.
pub(crate) fn drift(ttl: Duration, drift_factor: f64) -> Duration {
    ttl.mul_f64(drift_factor) + Duration::from_millis(2)
}

/// What is left of a lock's TTL once the round's elapsed time and the drift allowance are
/// subtracted; `None` when nothing positive is left.
pub(crate) fn validity(ttl: Duration, elapsed: Duration, drift_factor: f64) -> Option<Duration> {
    ttl.checked_sub(elapsed)?
        .checked_sub(drift(ttl, drift_factor))
        .filter(|v| !v.is_zero())
}

/// When a round is decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Until {
    /// A majority granted (a positive reply), or a majority became impossible.
    Granted,
    /// A majority answered at all, or a majority of answers became impossible.
    Answered,
    /// Every node answered or timed out.
    All,
}

/// The votes of one round.
#[derive(Debug)]
pub(crate) struct Tally {
    pub(crate) nodes: usize,
    pub(crate) granted: usize,
    pub(crate) denied: usize,
    pub(crate) errors: Vec<NodeError>,
    /// The nodes that refused (answered 0): an acquire wrote nothing there.
    pub(crate) refused_by: Vec<usize>,
    /// Grants whose node's standing is not settled yet (see [`Standing::Unsettled`]): by
    /// index, with how long the node stays unsettled. Counted once settled, as quarantined
    /// when every node answered and they still are not.
    unsettled: Vec<(usize, Duration)>,
}

impl Tally {
    pub(super) fn new(nodes: usize) -> Self {
        Tally {
            nodes,
            granted: 0,
            denied: 0,
            errors: Vec::new(),
            refused_by: Vec::new(),
            unsettled: Vec::new(),
        }
    }

    pub(crate) fn quorum(&self) -> usize {
        quorum(self.nodes)
    }

    /// Counts one node's outcome.
    pub(super) fn record(
        &mut self,
        nodes: &Nodes,
        op: Op,
        index: usize,
        result: Result<i64, NodeFailure>,
    ) {
        let node = &nodes[index];
        self.count(op, index, node.addr(), result, node.standing());
        self.settle(|index| (nodes[index].addr(), nodes[index].standing()));
    }

    /// Counts one node's outcome, `standing` saying whether the node's votes count, or it
    /// may have forgotten locks it granted (a restart, a flush: see `memory.rs`).
    ///
    /// A quarantined node's grant of an acquire or an extend is neither a vote nor a refusal:
    /// it is recorded as a [`NodeFailure::Quarantined`] error, so that the round cannot reach
    /// a majority with it, a failed acquire releases the key it wrote (as after any node
    /// failure), and the error says why. An unsettled node's grant waits (see
    /// [`Tally::settle`]). Refusals are refusals (another owner's key is there), and releases
    /// count as any other.
    pub(super) fn count(
        &mut self,
        op: Op,
        index: usize,
        addr: &str,
        result: Result<i64, NodeFailure>,
        standing: Standing,
    ) {
        let result = match result {
            Ok(reply) if reply > 0 && op != Op::Release && op != Op::Leave => match standing {
                Standing::Counts => Ok(reply),
                Standing::Quarantined(remaining) => Err(NodeFailure::Quarantined { remaining }),
                Standing::Unsettled(remaining) | Standing::Pending(remaining) => {
                    self.unsettled.push((index, remaining));
                    return;
                }
            },
            other => other,
        };
        match result {
            Ok(reply) if reply > 0 || op == Op::Release => self.granted += 1,
            Ok(_) => {
                self.denied += 1;
                self.refused_by.push(index);
            }
            Err(failure) => self.errors.push(NodeError {
                index,
                addr: addr.to_owned(),
                failure,
            }),
        }
    }

    /// Counts the unsettled grants whose node's `standing` (with its address, by index) is
    /// settled now: a vote once it counts (or once every node answered, still unsettled: no
    /// roster read by then remembers another marker for it, and the servers that did not
    /// answer cannot be waited for), a [`NodeFailure::Quarantined`] error once it is
    /// quarantined (or once every node answered, still pending: a reading that could show
    /// the loss is under way, and a later attempt will know).
    pub(super) fn settle<'a>(&mut self, standing: impl Fn(usize) -> (&'a str, Standing)) {
        if self.unsettled.is_empty() {
            return;
        }
        let all_in = self.answered() + self.errors.len() + self.unsettled.len() == self.nodes;
        let mut waiting = std::mem::take(&mut self.unsettled);
        waiting.retain(|&(index, _)| {
            let (addr, now) = standing(index);
            let failure = match now {
                Standing::Unsettled(_) | Standing::Pending(_) if !all_in => return true,
                Standing::Counts | Standing::Unsettled(_) => {
                    self.granted += 1;
                    return false;
                }
                Standing::Quarantined(remaining) | Standing::Pending(remaining) => {
                    NodeFailure::Quarantined { remaining }
                }
            };
            self.errors.push(NodeError {
                index,
                addr: addr.to_owned(),
                failure,
            });
            false
        });
        self.unsettled = waiting;
    }

    /// Records the votes so far in the current span.
    pub(crate) fn trace(&self) {
        crate::trace::votes(self.granted, self.denied, self.errors.len());
    }

    /// A majority granted.
    pub(crate) fn reached(&self) -> bool {
        self.granted >= self.quorum()
    }

    /// How many nodes answered, whatever the answer.
    pub(crate) fn answered(&self) -> usize {
        self.granted + self.denied
    }

    pub(super) fn decided(&self, until: Until) -> bool {
        let q = self.quorum();
        let slack = self.nodes - q;
        match until {
            Until::Granted => self.granted >= q || self.denied + self.errors.len() > slack,
            Until::Answered => self.answered() >= q || self.errors.len() > slack,
            Until::All => self.answered() + self.errors.len() == self.nodes,
        }
    }

    /// Refusals alone rule out a majority: other owners hold it.
    fn refused_by_majority(&self) -> bool {
        self.nodes - self.denied < self.quorum()
    }

    /// Why an acquire round failed: contention when refusals alone rule out a majority,
    /// unreachable nodes otherwise.
    pub(crate) fn acquire_failure(self) -> Failed {
        if self.refused_by_majority() {
            Failed::Contended {
                denied: self.denied,
                nodes: self.nodes,
            }
        } else {
            Failed::Other(self.unreachable())
        }
    }

    /// The error for a failed extension round: the lock is lost when a majority says the keys
    /// are no longer ours; otherwise the nodes could not confirm it.
    pub(crate) fn extend_error(self, resources: &[String]) -> Error {
        if self.refused_by_majority() {
            Error::LockLost {
                resources: resources.to_vec(),
                reason: LossReason::NotHeld {
                    confirmed: self.granted,
                    quorum: self.quorum(),
                },
            }
        } else {
            self.unreachable()
        }
    }

    /// `QuorumUnreachable` with every node's error; `Overloaded` instead when this client's
    /// own full queues are what kept the majority out of reach (the nodes are fine).
    pub(crate) fn unreachable(self) -> Error {
        let overloaded = self
            .errors
            .iter()
            .filter(|e| matches!(e.failure, NodeFailure::Overloaded { .. }))
            .count();
        if overloaded > 0 && self.granted + overloaded >= self.quorum() {
            return Error::Overloaded {
                overloaded,
                nodes: self.nodes,
            };
        }
        Error::QuorumUnreachable {
            granted: self.granted,
            denied: self.denied,
            quorum: self.quorum(),
            nodes: self.nodes,
            errors: self.errors,
        }
    }
}

/// Why one acquire attempt failed, before anyone knows how many attempts were made: the
/// caller turns it into an [`Error`] once, with the final count.
#[derive(Debug)]
pub(crate) enum Failed {
    /// Refusals alone ruled out a majority: other owners hold the resources.
    Contended {
        /// How many nodes refused.
        denied: usize,
        /// How many nodes there are.
        nodes: usize,
    },
    /// Any other failure, already a complete error.
    Other(Error),
}

impl Failed {
    /// Whether another attempt could succeed.
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            Failed::Contended { .. } => true,
            Failed::Other(error) => error.is_retryable(),
        }
    }

    /// The error for the caller, after `attempts` attempts in all.
    pub(crate) fn into_error(self, resources: &[String], attempts: u32) -> Error {
        match self {
            Failed::Contended { denied, nodes } => Error::Contended {
                resources: resources.to_vec(),
                denied,
                nodes,
                attempts,
            },
            Failed::Other(error) => error,
        }
    }
}

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
