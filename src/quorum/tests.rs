//! Fan-out over fake nodes on a paused clock: the majority rule, early decisions, release
//! on failure, and a hung node costing each round one node timeout. (Each node bounds and
//! orders its own calls: that is its queue's, tested in `node/queue/` and on real
//! servers.)

use std::sync::Arc;

use super::*;
use crate::node::Node;
use crate::quorum::quorum;
use crate::testing::fake::{FAKE_TIMEOUT, Fake, fakes};

/// The fakes' node timeout.
const TIMEOUT: Duration = FAKE_TIMEOUT;
const MS: Duration = Duration::from_millis(1);

async fn acquire(nodes: &[Arc<dyn Node>], req: &Request) -> Result<Duration, Failed> {
    let ttl = Duration::from_millis(req.ttl_ms);
    acquire_round(nodes, req, ttl, 0.01, &TaskTracker::new()).await
}

/// [`acquire`], then waits for what it left running in the background (the release of a
/// failed attempt on the nodes that had not answered), each call bounded by the node timeout.
async fn acquire_and_settle(nodes: &[Arc<dyn Node>], req: &Request) -> Result<Duration, Failed> {
    let tasks = TaskTracker::new();
    let ttl = Duration::from_millis(req.ttl_ms);
    let result = acquire_round(nodes, req, ttl, 0.01, &tasks).await;
    tasks.close();
    tasks.wait().await;
    result
}

fn request() -> Request {
    Request {
        op: Op::Acquire,
        keys: Arc::from(vec!["k".to_string()]),
        token: Arc::from("t"),
        ttl_ms: 10_000,
        queue: None,
        rw: None,
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
            let tally = fan_out(&nodes, &request(), Until::Granted).await.tally;
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
async fn failed_rounds_release_every_node_but_those_that_refused_and_granted_rounds_release_none() {
    for n in 1..=5 {
        for behaviours in all_combinations(n) {
            let (fakes, nodes) = fakes(&behaviours);
            let result = acquire_and_settle(&nodes, &request()).await;
            let (want_granted, _) = expected(&behaviours);
            assert_eq!(result.is_ok(), want_granted, "{behaviours:?}: {result:?}");
            for (node, behaviour) in fakes.iter().zip(&behaviours) {
                let released = node.calls().contains(&Op::Release);
                // A refusal wrote nothing: there is nothing to release there.
                let refused = matches!(behaviour, Fake::Deny);
                assert_eq!(
                    released,
                    !want_granted && !refused,
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
async fn a_hung_node_costs_each_round_at_most_one_timeout() {
    use Fake::*;
    let (_, nodes) = fakes(&[Grant, Grant, Never]);
    let req = request();
    // Rounds far more often than the node timeout, each decided at once by the two healthy
    // nodes; the hung node's calls run out in the background.
    for _ in 0..40 {
        let start = tokio::time::Instant::now();
        let tally = fan_out(&nodes, &req, Until::Granted).await.into_tally();
        assert!(tally.reached());
        assert_eq!(start.elapsed(), Duration::ZERO, "waited for the hung node");
        tokio::time::sleep(5 * MS).await;
    }
    // A round that waits for every node: the hung one costs at most one timeout, however many
    // rounds came before (its queue answers every call waiting behind a call that timed out
    // at once).
    let start = tokio::time::Instant::now();
    let tally = fan_out(&nodes, &req, Until::All)
        .await
        .finish(&nodes, Op::Acquire)
        .await;
    assert!(start.elapsed() <= TIMEOUT, "{:?}", start.elapsed());
    assert_eq!(tally.errors.len(), 1);
    assert!(matches!(tally.errors[0].failure, NodeFailure::Timeout(_)));
}

#[tokio::test(start_paused = true)]
async fn a_release_of_a_failed_attempt_skips_the_nodes_that_refused_and_waits_for_those_that_granted()
 {
    use Fake::*;
    let (fakes, nodes) = fakes(&[Grant, Deny, Deny, Slow(20 * MS), Never]);
    let start = tokio::time::Instant::now();
    let err = acquire(&nodes, &request())
        .await
        .expect_err("two of five granted");
    assert!(
        matches!(err, Failed::Other(Error::QuorumUnreachable { .. })),
        "{err:?}"
    );
    // Decided once the hung node timed out (three failed or refused); the granting nodes'
    // releases were waited for.
    assert_eq!(start.elapsed(), TIMEOUT);
    for granted in [&fakes[0], &fakes[3]] {
        assert_eq!(granted.calls(), [Op::Acquire, Op::Release]);
    }
    for refused in [&fakes[1], &fakes[2]] {
        assert_eq!(refused.calls(), [Op::Acquire]);
    }
}

/// A node that restarted recently (its grants do not count: restart quarantine) and answers
/// releases after `RELEASE_DELAY`; it counts the releases it has answered, as a node's queue
/// answers one only once the server ran it.
struct Restarted {
    fake: crate::testing::fake::FakeNode,
    released: Arc<std::sync::atomic::AtomicUsize>,
}

const RELEASE_DELAY: Duration = Duration::from_millis(5);

impl Restarted {
    fn new() -> Arc<Restarted> {
        let fake = crate::testing::fake::FakeNode::new(Fake::Grant);
        fake.set(Op::Release, Fake::Slow(RELEASE_DELAY));
        Arc::new(Restarted {
            fake,
            released: Arc::default(),
        })
    }

    fn released(&self) -> usize {
        self.released.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Node for Restarted {
    fn call(&self, req: &Request) -> NodeCall {
        let call = self.fake.call(req);
        let released = Arc::clone(&self.released);
        let op = req.op;
        NodeCall::boxed(async move {
            let reply = call.await;
            if op == Op::Release {
                released.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            reply
        })
    }

    fn advise(
        &self,
        advisory: crate::node::Advisory,
    ) -> futures::future::BoxFuture<'static, Result<crate::node::Advice, NodeFailure>> {
        self.fake.advise(advisory)
    }

    fn addr(&self) -> &str {
        "restarted"
    }

    fn standing(&self) -> crate::memory::Standing {
        crate::memory::Standing::Quarantined(Duration::from_secs(60))
    }
}

/// Issue 38: a holder on node 0, nodes 1 and 2 restarted (quarantined): they grant, their
/// grants do not count, the attempt fails. Their keys are released before the attempt
/// returns, on a current-thread runtime, with nobody waiting for the background tasks (as a
/// process that exits next): those nodes answered, so their releases are as quick as their
/// answers were. (They were left to a background task, which a current-thread runtime runs
/// only while it is in `block_on`: `redfence run` exited, and nodes 1 and 2 kept the key for
/// its whole TTL.)
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_failed_attempt_waits_for_its_releases_on_the_quarantined_nodes() {
    let holder = Arc::new(crate::testing::fake::FakeNode::new(Fake::Deny));
    let restarted = [Restarted::new(), Restarted::new()];
    let nodes: Vec<Arc<dyn Node>> = vec![
        holder,
        Arc::clone(&restarted[0]) as Arc<dyn Node>,
        Arc::clone(&restarted[1]) as Arc<dyn Node>,
    ];
    let tasks = TaskTracker::new();
    let ttl = Duration::from_secs(60);
    let err = acquire_round(&nodes, &request(), ttl, 0.01, &tasks)
        .await
        .expect_err("two quarantined grants are no votes");
    match err.into_error(&["k".to_string()], 1) {
        Error::QuorumUnreachable { errors, denied, .. } => {
            assert_eq!(denied, 1);
            assert!(
                errors
                    .iter()
                    .all(|e| matches!(e.failure, NodeFailure::Quarantined { .. })),
                "{errors:?}"
            );
        }
        other => panic!("expected QuorumUnreachable, got {other:?}"),
    }
    for (i, node) in restarted.iter().enumerate() {
        assert_eq!(node.fake.calls(), [Op::Acquire, Op::Release]);
        assert_eq!(
            node.released(),
            1,
            "restarted node {i}: the release was not answered when the attempt returned"
        );
    }
    assert!(tasks.is_empty(), "nothing left to the background");
}

/// The pure arithmetic and the tally, without nodes.
mod counting {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

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

    /// Five nodes: `grants` of them grant (the quarantined ones among them, by index), the
    /// rest refuse.
    fn round(op: Op, grants: &[usize], quarantined: &[usize]) -> Tally {
        let mut tally = Tally::new(5);
        for index in 0..5 {
            let reply = if grants.contains(&index) { 1 } else { 0 };
            let standing = if quarantined.contains(&index) {
                Standing::Quarantined(Duration::from_secs(7))
            } else {
                Standing::Counts
            };
            tally.count(op, index, "node", Ok(reply), standing);
        }
        tally
    }

    #[test]
    fn a_quarantined_grant_is_no_vote_and_is_reported() {
        // Three grants, one of them from a restarted node: two votes, no majority.
        let tally = round(Op::Acquire, &[2, 3, 4], &[2]);
        assert_eq!((tally.granted, tally.denied), (2, 2));
        assert!(!tally.reached());
        assert!(tally.refused_by.iter().all(|&i| i != 2));
        assert!(matches!(
            tally.errors.as_slice(),
            [NodeError { index: 2, failure: NodeFailure::Quarantined { remaining }, .. }]
                if *remaining == Duration::from_secs(7)
        ));
        // Not contention (refusals alone leave room for a majority): the error lists why.
        match tally.acquire_failure() {
            Failed::Other(Error::QuorumUnreachable {
                errors, granted, ..
            }) => {
                assert_eq!(granted, 2);
                assert!(matches!(errors[0].failure, NodeFailure::Quarantined { .. }));
            }
            other => panic!("expected QuorumUnreachable, got {other:?}"),
        }
        // The same grants without quarantine reach the majority.
        assert!(round(Op::Acquire, &[2, 3, 4], &[]).reached());
    }

    #[test]
    fn a_quarantined_confirmation_of_an_extension_does_not_count() {
        let tally = round(Op::Extend, &[0, 1, 2], &[1]);
        assert_eq!(tally.granted, 2);
        assert!(!tally.reached());
        // A quarantined node's refusal is a refusal, and releases always count.
        let tally = round(Op::Extend, &[0, 1], &[2]);
        assert_eq!(tally.denied, 3);
        let tally = round(Op::Release, &[0, 1, 2], &[0, 1, 2]);
        assert_eq!(tally.granted, 5);
        // Four quarantined grants of five: no majority, and no contention either.
        let tally = round(Op::Acquire, &[0, 1, 2, 3, 4], &[0, 1, 2, 3]);
        assert_eq!((tally.granted, tally.errors.len()), (1, 4));
        assert!(matches!(tally.acquire_failure(), Failed::Other(_)));
    }

    #[test]
    fn an_unsettled_grant_waits_for_the_other_nodes() {
        const WAIT: Duration = Duration::from_secs(9);
        /// A node's answer that did not come in time.
        fn timed_out() -> Result<i64, NodeFailure> {
            Err(NodeFailure::Timeout(WAIT))
        }
        // Three nodes; node 0's grant is unsettled (its marker is young, the others' rosters
        // unread). The others' answers settle it: once they are read it counts.
        let mut tally = Tally::new(3);
        tally.count(Op::Acquire, 0, "a", Ok(1), Standing::Unsettled(WAIT));
        tally.settle(|_| ("a", Standing::Unsettled(WAIT)));
        assert_eq!((tally.granted, tally.errors.len()), (0, 0));
        assert!(!tally.decided(Until::Granted));
        tally.count(Op::Acquire, 1, "b", Ok(1), Standing::Counts);
        tally.settle(|_| ("a", Standing::Counts));
        assert_eq!(tally.granted, 2);
        assert!(tally.reached());
        // Still unsettled when every node answered (node 2, which could remember another
        // marker, is down): no roster read says it lost memory, so it counts.
        let mut tally = Tally::new(3);
        tally.count(Op::Acquire, 0, "a", Ok(1), Standing::Unsettled(WAIT));
        tally.count(Op::Acquire, 1, "b", Ok(1), Standing::Counts);
        tally.settle(|_| ("a", Standing::Unsettled(WAIT)));
        assert_eq!(tally.granted, 1);
        assert!(!tally.decided(Until::Granted));
        tally.count(Op::Acquire, 2, "c", timed_out(), Standing::Counts);
        tally.settle(|_| ("a", Standing::Unsettled(WAIT)));
        assert_eq!((tally.granted, tally.errors.len()), (2, 1));
        assert!(tally.reached());
        // Still pending when every node answered (a reading that could show the loss is under
        // way): quarantined, a later attempt will know.
        let mut tally = Tally::new(3);
        tally.count(Op::Acquire, 0, "a", Ok(1), Standing::Pending(WAIT));
        tally.count(Op::Acquire, 1, "b", Ok(1), Standing::Counts);
        tally.count(Op::Acquire, 2, "c", timed_out(), Standing::Counts);
        tally.settle(|_| ("a", Standing::Pending(WAIT)));
        assert_eq!((tally.granted, tally.errors.len()), (1, 2));
        assert!(!tally.reached());
        // Settled as quarantined by a roster read meanwhile.
        let mut tally = Tally::new(3);
        tally.count(Op::Acquire, 0, "a", Ok(1), Standing::Unsettled(WAIT));
        tally.settle(|_| ("a", Standing::Quarantined(WAIT)));
        assert_eq!((tally.granted, tally.errors.len()), (0, 1));
    }
}
