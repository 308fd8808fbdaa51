//! Fan-out and vote counting: the pure Redlock logic, over any [`Node`].
//!
//! Every request goes to all nodes at once, each call bounded by `node_timeout`; the round is
//! decided as soon as a majority agreed or a majority became impossible, and the stragglers
//! finish in the background.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::watch;

use crate::Error;
use crate::error::{LossReason, NodeError, NodeFailure};
use crate::node::{Node, Op, Request};

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
}

impl Tally {
    fn new(nodes: usize) -> Self {
        Tally {
            nodes,
            granted: 0,
            denied: 0,
            errors: Vec::new(),
        }
    }

    pub(crate) fn quorum(&self) -> usize {
        quorum(self.nodes)
    }

    /// Counts one node's outcome.
    fn record<N: Node>(
        &mut self,
        nodes: &[N],
        op: Op,
        index: usize,
        result: Result<i64, NodeFailure>,
    ) {
        match result {
            Ok(reply) if reply > 0 || op == Op::Release => self.granted += 1,
            Ok(_) => self.denied += 1,
            Err(failure) => self.errors.push(NodeError {
                index,
                addr: nodes[index].addr().to_owned(),
                failure,
            }),
        }
    }

    /// A majority granted.
    pub(crate) fn reached(&self) -> bool {
        self.granted >= self.quorum()
    }

    /// How many nodes answered, whatever the answer.
    pub(crate) fn answered(&self) -> usize {
        self.granted + self.denied
    }

    fn decided(&self, until: Until) -> bool {
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

    /// The error for a failed acquire round: contention when refusals alone rule out a
    /// majority, unreachable nodes otherwise.
    pub(crate) fn acquire_error(self, resources: &[String]) -> Error {
        if self.refused_by_majority() {
            Error::Contended {
                resources: resources.to_vec(),
                denied: self.denied,
                nodes: self.nodes,
                attempts: 1,
            }
        } else {
            self.unreachable()
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

    /// `QuorumUnreachable` with every node's error.
    pub(crate) fn unreachable(self) -> Error {
        Error::QuorumUnreachable {
            granted: self.granted,
            denied: self.denied,
            quorum: self.quorum(),
            nodes: self.nodes,
            errors: self.errors,
        }
    }
}

/// One node call of a round: the node's index and its outcome.
type Call = BoxFuture<'static, (usize, Result<i64, NodeFailure>)>;

/// A decided round: the votes, and the calls still running when it was decided.
pub(crate) struct Round {
    pub(crate) tally: Tally,
    pending: FuturesUnordered<Call>,
    answered: Vec<bool>,
}

impl Round {
    /// The votes so far; the calls still running finish in the background (each bounded by
    /// the node timeout), and the returned [`Settled`] tells a later round when they have.
    pub(crate) fn into_parts(self) -> (Tally, Settled) {
        if self.pending.is_empty() {
            return (self.tally, Settled::none());
        }
        let (done, rx) = watch::channel(false);
        let mut pending = self.pending;
        tokio::spawn(async move {
            while pending.next().await.is_some() {}
            let _ = done.send(true);
        });
        let settled = Settled {
            pending: self.answered.iter().map(|answered| !answered).collect(),
            done: rx,
        };
        (self.tally, settled)
    }

    /// Waits for the calls still running (each bounded by the node timeout) and counts them in.
    pub(crate) async fn finish<N: Node>(mut self, nodes: &[N], op: Op) -> Tally {
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
pub(crate) async fn fan_out<N: Node>(
    nodes: &[N],
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
    Round {
        tally,
        pending,
        answered,
    }
}

/// One acquire attempt over `nodes`: fan out, count, compute the validity, and on failure
/// release on every node (also those that failed or timed out: their write may have landed).
///
/// On success returns how long after `start` the lock stays valid (`ttl - drift`) — the caller
/// adds it to an instant taken before the call, which keeps the validity conservative — and
/// the calls still running, which later rounds of the lock must follow.
pub(crate) async fn acquire_round<N: Node>(
    nodes: &[N],
    req: &Request,
    resources: &[String],
    node_timeout: Duration,
    drift_factor: f64,
) -> Result<(Duration, Settled), Error> {
    debug_assert_eq!(req.op, Op::Acquire);
    let ttl = Duration::from_millis(req.ttl_ms);
    // Tokio's clock is the monotonic clock (and can be paused in unit tests).
    let start = tokio::time::Instant::now();
    let round = fan_out(nodes, req, node_timeout, Until::Granted, &Settled::none()).await;
    let elapsed = start.elapsed();
    let reached = round.tally.reached();
    if reached && let Some(valid) = validity(ttl, elapsed, drift_factor) {
        let (_, settled) = round.into_parts();
        return Ok((elapsed + valid, settled));
    }
    // Let the calls still running land (or time out) first, so that the release follows them
    // on every node; their outcomes complete the error.
    let tally = round.finish(nodes, req.op).await;
    let error = if reached {
        Error::NoValidity {
            ttl,
            elapsed,
            drift: drift(ttl, drift_factor),
        }
    } else {
        tally.acquire_error(resources)
    };
    release_everywhere(nodes, req, node_timeout, &Settled::none()).await;
    Err(error)
}

/// Compare-and-delete on every node, waiting for each (bounded by the timeout), so that
/// nothing of ours is left behind when this returns.
pub(crate) async fn release_everywhere<N: Node>(
    nodes: &[N],
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
    use std::future::Future;
    use std::sync::{Arc, Mutex};

    const TIMEOUT: Duration = Duration::from_millis(50);
    const MS: Duration = Duration::from_millis(1);

    /// How a fake node behaves.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Fake {
        Grant,
        Deny,
        Fail,
        /// Grants after a delay.
        Slow(Duration),
        Never,
    }

    /// What a fake node saw: which script, when it started and when it ended.
    #[derive(Clone, Debug)]
    struct Seen {
        op: Op,
        started: tokio::time::Instant,
        ended: Option<tokio::time::Instant>,
    }

    struct FakeNode {
        behaviour: Fake,
        seen: Arc<Mutex<Vec<Seen>>>,
    }

    impl FakeNode {
        fn new(behaviour: Fake) -> Self {
            FakeNode {
                behaviour,
                seen: Arc::default(),
            }
        }
        fn seen(&self) -> Vec<Seen> {
            self.seen.lock().map(|c| c.clone()).unwrap_or_default()
        }
        fn calls(&self) -> Vec<Op> {
            self.seen().iter().map(|s| s.op).collect()
        }
    }

    impl Node for FakeNode {
        fn call(
            &self,
            req: &Request,
        ) -> impl Future<Output = Result<i64, NodeFailure>> + Send + 'static {
            let behaviour = if req.op == Op::Acquire {
                self.behaviour
            } else {
                Fake::Grant
            };
            let (seen, op) = (Arc::clone(&self.seen), req.op);
            async move {
                // Recorded when the call really starts (after any gate), not when it is made.
                let slot = seen.lock().ok().map(|mut s| {
                    s.push(Seen {
                        op,
                        started: tokio::time::Instant::now(),
                        ended: None,
                    });
                    s.len() - 1
                });
                let result = match behaviour {
                    Fake::Grant => Ok(1),
                    Fake::Deny => Ok(0),
                    Fake::Fail => Err(NodeFailure::Reply(redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "injected",
                    )))),
                    Fake::Slow(d) => {
                        tokio::time::sleep(d).await;
                        Ok(1)
                    }
                    Fake::Never => std::future::pending().await,
                };
                if let (Some(slot), Ok(mut s)) = (slot, seen.lock()) {
                    s[slot].ended = Some(tokio::time::Instant::now());
                }
                result
            }
        }
        fn addr(&self) -> &str {
            "fake"
        }
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
            Fake::Grant => (Duration::ZERO, Some(true)),
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
                let nodes: Vec<_> = behaviours.iter().map(|b| FakeNode::new(*b)).collect();
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
                let nodes: Vec<_> = behaviours.iter().map(|b| FakeNode::new(*b)).collect();
                let keys = ["k".to_string()];
                let result = acquire_round(&nodes, &request(), &keys, TIMEOUT, 0.01).await;
                let (want_granted, _) = expected(&behaviours);
                assert_eq!(result.is_ok(), want_granted, "{behaviours:?}: {result:?}");
                for node in &nodes {
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
            let nodes: Vec<_> = b.into_iter().map(FakeNode::new).collect();
            acquire_round(&nodes, &request(), &["k".to_string()], TIMEOUT, 0.01).await
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
        let keys = ["k".to_string()];
        let nodes: Vec<_> = (0..3).map(|_| FakeNode::new(Fake::Slow(40 * MS))).collect();
        let req = Request {
            ttl_ms: 41,
            ..request()
        };
        let e = acquire_round(&nodes, &req, &keys, TIMEOUT, 0.01).await;
        assert!(matches!(e, Err(Error::NoValidity { .. })), "{e:?}");
        assert!(nodes.iter().all(|n| n.calls().contains(&Op::Release)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_never_overtakes_the_acquire_it_follows() {
        use Fake::*;
        let behaviours = [Grant, Grant, Grant, Slow(40 * MS), Never];
        let nodes: Vec<_> = behaviours.iter().map(|b| FakeNode::new(*b)).collect();
        let req = request();
        let t0 = tokio::time::Instant::now();
        let (_, settled) = acquire_round(&nodes, &req, &["k".to_string()], TIMEOUT, 0.01)
            .await
            .expect("a majority granted at once");
        assert_eq!(t0.elapsed(), Duration::ZERO, "waited for the stragglers");

        let release = Request {
            op: Op::Release,
            ..req
        };
        let (tally, done) = fan_out(&nodes, &release, TIMEOUT, Until::Answered, &settled)
            .await
            .into_parts();
        assert_eq!(
            t0.elapsed(),
            Duration::ZERO,
            "the release waited for the stragglers"
        );
        assert!(tally.answered() >= 3);
        done.wait().await;

        // The slow node got the release only after its acquire had finished...
        let slow = nodes[3].seen();
        assert_eq!(
            slow.iter().map(|s| s.op).collect::<Vec<_>>(),
            [Op::Acquire, Op::Release]
        );
        assert_eq!(slow[0].ended, Some(t0 + 40 * MS));
        assert!(slow[1].started >= t0 + 40 * MS, "{slow:?}");
        // ... and the hung node only after its acquire had timed out.
        let hung = nodes[4].seen();
        assert_eq!(
            hung.iter().map(|s| s.op).collect::<Vec<_>>(),
            [Op::Acquire, Op::Release]
        );
        assert!(hung[1].started >= t0 + TIMEOUT, "{hung:?}");
        // The fast nodes were released at once.
        assert_eq!(nodes[0].seen()[1].started, t0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_node_costs_each_round_at_most_one_timeout() {
        use Fake::*;
        let nodes: Vec<_> = [Grant, Grant, Never]
            .iter()
            .map(|b| FakeNode::new(*b))
            .collect();
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
                .into_parts();
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

    #[test]
    fn quorum_sizes() {
        assert_eq!(
            (1..=7).map(quorum).collect::<Vec<_>>(),
            vec![1, 2, 2, 3, 3, 4, 4]
        );
    }

    #[test]
    fn validity_subtracts_elapsed_and_drift() {
        let ttl = Duration::from_secs(10);
        // drift = 10 s * 0.01 + 2 ms = 102 ms
        assert_eq!(drift(ttl, 0.01), 102 * MS);
        assert_eq!(validity(ttl, 100 * MS, 0.01), Some(ttl - 202 * MS));
        assert_eq!(validity(ttl, ttl - 102 * MS, 0.01), None);
        assert_eq!(validity(ttl, ttl, 0.01), None);
        assert_eq!(validity(ttl, ttl * 2, 0.01), None);
        assert_eq!(validity(3 * MS, Duration::ZERO, 0.0), Some(MS));
    }
}
