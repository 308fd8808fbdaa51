//! Fan-out: every request goes to all nodes at once, each call bounded by `node_timeout`; the
//! round is decided as soon as a majority agreed or a majority became impossible, and the
//! stragglers finish in the background (tracked, so that `Redlock::close` can wait for them).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use super::tally::{Failed, Tally, Until, drift, validity};
use crate::error::NodeFailure;
use crate::node::{Nodes, Op, Request};
use crate::{Error, clock};

/// One node call of a round: the node's index and its outcome.
type Call = BoxFuture<'static, (usize, Result<i64, NodeFailure>)>;

/// A decided round: the votes, and the calls still running when it was decided.
pub(crate) struct Round {
    pub(crate) tally: Tally,
    pending: FuturesUnordered<Call>,
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
        let mut pending = self.pending;
        tasks.spawn(async move {
            while pending.next().await.is_some() {}
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
/// it undoes (which would leave our key behind until its TTL), not even across a reconnect.
#[derive(Clone, Debug)]
pub(crate) struct Settled {
    pending: Arc<[bool]>,
    done: watch::Receiver<bool>,
}

impl Settled {
    /// Nothing to wait for.
    pub(crate) fn none() -> Self {
        let (_, rx) = watch::channel(true);
        Settled {
            pending: Arc::from(Vec::new()),
            done: rx,
        }
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
    let mut pending: FuturesUnordered<Call> = nodes
        .iter()
        .enumerate()
        .map(|(index, node)| {
            let call = node.call(req);
            if node.pipelined() {
                // The node orders its calls and bounds each one itself.
                let call: Call = Box::pin(async move { (index, call.await) });
                return call;
            }
            let gate = after.holds(index).then(|| after.clone());
            // One timeout covers the wait for the earlier call and this call together, so a
            // node costs a lock at most one `timeout` per round however many rounds it had:
            // waits never chain from round to round. A call whose turn has not come by then
            // is never sent (the node is skipped for this round).
            let call: Call = Box::pin(async move {
                let gated = async move {
                    if let Some(gate) = gate {
                        gate.wait().await;
                    }
                    call.await
                };
                let result = match tokio::time::timeout(timeout, gated).await {
                    Ok(result) => result,
                    Err(_) => Err(NodeFailure::Timeout(timeout)),
                };
                (index, result)
            });
            call
        })
        .collect();
    let mut tally = Tally::new(nodes.len());
    let mut answered = vec![false; nodes.len()];
    while !tally.decided(until) {
        let Some((index, result)) = pending.next().await else {
            break;
        };
        answered[index] = true;
        tally.record(nodes, req.op, index, result);
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
/// release on every node (also those that failed or timed out: their write may have landed).
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
    // Let the calls still running land (or time out) first, so that the release follows them
    // on every node; their outcomes complete the error.
    let tally = round.finish(nodes, req.op).await;
    tally.trace();
    let failed = if reached {
        Failed::Other(Error::NoValidity {
            ttl,
            elapsed,
            drift: drift(ttl, drift_factor),
        })
    } else {
        tally.acquire_failure()
    };
    release_everywhere(nodes, req, node_timeout, &Settled::none()).await;
    Err(failed)
}

/// Compare-and-delete on every node, waiting for each (bounded by the timeout), so that
/// nothing of ours is left behind when this returns.
pub(crate) async fn release_everywhere(
    nodes: &Nodes,
    req: &Request,
    node_timeout: Duration,
    after: &Settled,
) -> Tally {
    let release = Request {
        op: Op::Release,
        ..req.clone()
    };
    fan_out(nodes, &release, node_timeout, Until::All, after)
        .await
        .finish(nodes, Op::Release)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Node;
    use crate::node::fake::{Fake, FakeNode};
    use crate::quorum::quorum;

    const TIMEOUT: Duration = Duration::from_millis(50);
    const MS: Duration = Duration::from_millis(1);

    fn fakes(behaviours: &[Fake]) -> (Vec<Arc<FakeNode>>, Vec<Arc<dyn Node>>) {
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

    async fn acquire(
        nodes: &[Arc<dyn Node>],
        req: &Request,
    ) -> Result<(Duration, Settled), Failed> {
        acquire_round(nodes, req, TIMEOUT, 0.01, &TaskTracker::new()).await
    }

    fn request() -> Request {
        Request {
            op: Op::Acquire,
            keys: Arc::from(vec!["k".to_string()]),
            token: Arc::from("t"),
            ttl_ms: 10_000,
        }
    }

    /// When the node's answer arrives, and whether it is a grant.
    fn answer(b: Fake) -> (Duration, Option<bool>) {
        match b {
            Fake::Grant | Fake::Real => (Duration::ZERO, Some(true)),
            Fake::Deny => (Duration::ZERO, Some(false)),
            Fake::Fail => (Duration::ZERO, None),
            Fake::Slow(d) if d < TIMEOUT => (d, Some(true)),
            Fake::Slow(_) | Fake::Never => (TIMEOUT, None),
        }
    }

    /// The model: (granted?, decision time) for a set of behaviours.
    fn expected(behaviours: &[Fake]) -> (bool, Duration) {
        let n = behaviours.len();
        let q = quorum(n);
        let mut answers: Vec<_> = behaviours.iter().map(|b| answer(*b)).collect();
        answers.sort_by_key(|(t, _)| *t);
        let (mut granted, mut failed) = (0, 0);
        for (t, grant) in answers {
            if grant == Some(true) {
                granted += 1;
            } else {
                failed += 1;
            }
            if granted >= q {
                return (true, t);
            }
            if failed > n - q {
                return (false, t);
            }
        }
        unreachable!("every round is decided once all nodes answered")
    }

    fn all_combinations(n: usize) -> Vec<Vec<Fake>> {
        let choices = [
            Fake::Grant,
            Fake::Deny,
            Fake::Fail,
            Fake::Slow(20 * MS),
            Fake::Slow(200 * MS),
            Fake::Never,
        ];
        let mut out = vec![vec![]];
        for _ in 0..n {
            out = out
                .into_iter()
                .flat_map(|prefix| {
                    choices.iter().map(move |c| {
                        let mut v = prefix.clone();
                        v.push(*c);
                        v
                    })
                })
                .collect();
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn every_combination_follows_the_majority_rule_and_returns_early() {
        for n in 1..=5 {
            for behaviours in all_combinations(n) {
                let (_, nodes) = fakes(&behaviours);
                let (want_granted, want_time) = expected(&behaviours);
                let start = tokio::time::Instant::now();
                let tally = fan_out(
                    &nodes,
                    &request(),
                    TIMEOUT,
                    Until::Granted,
                    &Settled::none(),
                )
                .await
                .tally;
                let took = start.elapsed();
                assert_eq!(tally.reached(), want_granted, "{behaviours:?}: {tally:?}");
                assert_eq!(took, want_time, "{behaviours:?}: decided at the wrong time");
                assert!(
                    took <= TIMEOUT,
                    "{behaviours:?}: slower than the node timeout"
                );
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failed_rounds_release_every_node_and_granted_rounds_release_none() {
        for n in 1..=5 {
            for behaviours in all_combinations(n) {
                let (fakes, nodes) = fakes(&behaviours);
                let result = acquire(&nodes, &request()).await;
                let (want_granted, _) = expected(&behaviours);
                assert_eq!(result.is_ok(), want_granted, "{behaviours:?}: {result:?}");
                for node in &fakes {
                    let released = node.calls().contains(&Op::Release);
                    assert_eq!(
                        released,
                        !want_granted,
                        "{behaviours:?}: {:?}",
                        node.calls()
                    );
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_are_contention_failures_are_unreachable() {
        let run = |b: Vec<Fake>| async move {
            let (_, nodes) = fakes(&b);
            acquire(&nodes, &request())
                .await
                .map_err(|f| f.into_error(&["k".to_string()], 1))
        };
        use Fake::*;
        let e = run(vec![Deny, Deny, Deny, Grant, Grant]).await;
        assert!(
            matches!(
                e,
                Err(Error::Contended {
                    denied: 3,
                    nodes: 5,
                    ..
                })
            ),
            "{e:?}"
        );
        let e = run(vec![Fail, Never, Fail, Grant, Grant]).await;
        match e {
            Err(Error::QuorumUnreachable {
                granted: 2,
                errors,
                quorum: 3,
                ..
            }) => {
                assert_eq!(errors.len(), 3);
                assert!(
                    errors
                        .iter()
                        .any(|e| matches!(e.failure, NodeFailure::Timeout(_)))
                );
                assert!(
                    errors
                        .iter()
                        .any(|e| matches!(e.failure, NodeFailure::Reply(_)))
                );
            }
            other => panic!("expected QuorumUnreachable, got {other:?}"),
        }
        // Mixed: neither refusals nor failures alone rule a majority out.
        let e = run(vec![Deny, Deny, Fail, Fail, Grant]).await;
        assert!(
            matches!(e, Err(Error::QuorumUnreachable { denied: 2, .. })),
            "{e:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn slow_majority_leaves_no_validity() {
        let (fakes, nodes) = fakes(&[Fake::Slow(40 * MS); 3]);
        let req = Request {
            ttl_ms: 41,
            ..request()
        };
        let e = acquire(&nodes, &req).await;
        assert!(
            matches!(e, Err(Failed::Other(Error::NoValidity { .. }))),
            "{e:?}"
        );
        assert!(fakes.iter().all(|n| n.calls().contains(&Op::Release)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_never_overtakes_the_acquire_it_follows() {
        use Fake::*;
        let behaviours = [Grant, Grant, Grant, Slow(40 * MS), Never];
        let (fakes, nodes) = fakes(&behaviours);
        let req = request();
        let t0 = tokio::time::Instant::now();
        let (_, settled) = acquire(&nodes, &req)
            .await
            .expect("a majority granted at once");
        assert_eq!(t0.elapsed(), Duration::ZERO, "waited for the stragglers");

        let release = Request {
            op: Op::Release,
            ..req
        };
        let (tally, done) = fan_out(&nodes, &release, TIMEOUT, Until::Answered, &settled)
            .await
            .into_parts(&TaskTracker::new());
        assert_eq!(
            t0.elapsed(),
            Duration::ZERO,
            "the release waited for the stragglers"
        );
        assert!(tally.answered() >= 3);
        done.wait().await;

        // The slow node got the release only after its acquire had finished...
        let slow = fakes[3].seen();
        assert_eq!(
            slow.iter().map(|s| s.op).collect::<Vec<_>>(),
            [Op::Acquire, Op::Release]
        );
        assert_eq!(slow[0].ended, Some(t0 + 40 * MS));
        assert!(slow[1].started >= t0 + 40 * MS, "{slow:?}");
        // ... and the hung node only after its acquire had timed out.
        let hung = fakes[4].seen();
        assert_eq!(
            hung.iter().map(|s| s.op).collect::<Vec<_>>(),
            [Op::Acquire, Op::Release]
        );
        assert!(hung[1].started >= t0 + TIMEOUT, "{hung:?}");
        // The fast nodes were released at once.
        assert_eq!(fakes[0].seen()[1].started, t0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_node_costs_each_round_at_most_one_timeout() {
        use Fake::*;
        let (_, nodes) = fakes(&[Grant, Grant, Never]);
        let req = request();
        let tasks = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        let before = tasks();
        // Rounds far more often than the node timeout, each decided at once by the two
        // healthy nodes, each following the previous one's straggler on the hung node.
        let mut settled = Settled::none();
        let mut most_tasks = 0;
        for _ in 0..40 {
            let (tally, next) = fan_out(&nodes, &req, TIMEOUT, Until::Granted, &settled)
                .await
                .into_parts(&TaskTracker::new());
            assert!(tally.reached());
            settled = next;
            most_tasks = most_tasks.max(tasks() - before);
            tokio::time::sleep(5 * MS).await;
        }
        // The last round waits for every node: the hung one costs one timeout, not a chain of
        // the waits of every earlier round.
        let start = tokio::time::Instant::now();
        let tally = fan_out(&nodes, &req, TIMEOUT, Until::All, &settled)
            .await
            .finish(&nodes, Op::Acquire)
            .await;
        assert!(start.elapsed() <= TIMEOUT, "took {:?}", start.elapsed());
        assert_eq!(tally.errors.len(), 1);
        // Straggler drains live one timeout each: their number stays bounded by the rounds
        // that fit in one timeout, however long the lock lives.
        assert!(most_tasks <= 12, "{most_tasks} tasks alive at once");
    }
}
