//! The majority rule with nodes killed, paused and restarted (real redis-server processes).

mod support;

use std::time::{Duration, Instant};

use redfence::{Error, NodeFailure};
use support::{Servers, TestRedlock, eventually};

const TTL: Duration = Duration::from_secs(5);

/// The node timeout of tests that measure no time: long enough for a live node's first call
/// on a new connection (connect, identity read, script load) on a loaded machine. Dead nodes
/// refuse connections at once, so it costs nothing.
const UNMEASURED: Duration = Duration::from_secs(5);

#[tokio::test]
async fn one_or_two_of_five_down_still_lock() {
    for down in [1, 2] {
        let mut servers = Servers::start(5);
        for i in 0..down {
            servers.kill(i);
        }
        // Patient nodes: every live node's first call must land (no retry), on a new
        // connection.
        let redlock = servers.one_attempt(UNMEASURED);
        let mut lock = redlock
            .acquire(&["job"], TTL)
            .await
            .expect("a majority is up");
        assert!(servers.holders("job", lock.token(), down..5).len() >= 3);
        lock.extend(TTL).await.expect("extend with a majority up");
        lock.release().await.expect("release with a majority up");
        assert!(eventually(|| (down..5).all(|i| servers.keys(i).is_empty())).await);
    }
}

#[tokio::test]
async fn three_of_five_down_fails_closed_and_leaves_nothing() {
    let mut servers = Servers::start(5);
    for i in 0..3 {
        servers.kill(i);
    }
    // The two live nodes must grant (errors: the three dead ones alone), on new connections.
    let redlock = servers
        .builder()
        .retry_count(2)
        .node_timeout(UNMEASURED)
        .build()
        .expect("config");
    let err = redlock
        .acquire(&["job"], TTL)
        .await
        .expect_err("no majority");
    match &err {
        Error::QuorumUnreachable {
            granted,
            quorum: 3,
            nodes: 5,
            errors,
            ..
        } => {
            assert!(*granted <= 2);
            assert_eq!(errors.len(), 3);
            assert!(errors.iter().all(|e| e.index < 3), "{errors:?}");
            assert!(
                errors.iter().all(|e| matches!(
                    e.failure,
                    NodeFailure::Connection(_) | NodeFailure::Timeout(_)
                )),
                "{errors:?}"
            );
        }
        other => panic!("expected QuorumUnreachable, got {other:?}"),
    }
    assert!(!matches!(err, Error::Contended { .. }));
    // The nodes that answered were released before the error came back.
    for i in 3..5 {
        assert!(
            servers.keys(i).is_empty(),
            "node {i} kept {:?}",
            servers.keys(i)
        );
    }
}

/// Paused nodes cost a decided round nothing, and an undecidable one one node timeout. The
/// node timeout is the yardstick: long enough (2 s) that a round of the healthy majority fits
/// in it on a loaded machine, so that "less than a node timeout" can only fail by waiting for
/// a paused node.
#[tokio::test]
async fn paused_nodes_cost_at_most_the_node_timeout() {
    let servers = Servers::start(5);
    let node_timeout = Duration::from_secs(2);
    let redlock = servers.one_attempt(node_timeout);
    // Warm the connections so that connecting is not measured.
    support::warm_up(&redlock).await;

    // Two paused nodes: the three others make the majority, without waiting for the two.
    servers.pause(0);
    servers.pause(1);
    let started = Instant::now();
    let mut lock = redlock
        .acquire(&["job"], TTL)
        .await
        .expect("majority of live nodes");
    let took = started.elapsed();
    assert!(
        took < node_timeout,
        "acquire waited for paused nodes: {took:?}"
    );
    lock.extend(TTL).await.expect("extend");
    let token = lock.token().to_owned();
    let started = Instant::now();
    lock.release().await.expect("release");
    let took = started.elapsed();
    assert!(
        took < node_timeout,
        "release waited for paused nodes: {took:?}"
    );

    // Three paused: the attempt fails after about one node timeout, not more.
    servers.pause(2);
    let started = Instant::now();
    let err = redlock
        .acquire(&["other"], TTL)
        .await
        .expect_err("no majority");
    let took = started.elapsed();
    assert!(matches!(err, Error::QuorumUnreachable { .. }), "{err:?}");
    assert!(took >= node_timeout, "{took:?}");
    // One timeout for the attempt; the release that follows it on the paused nodes runs in
    // the background (waiting for it too would make two).
    assert!(
        took < node_timeout * 3 / 2,
        "took {took:?}: more than one node timeout ({node_timeout:?})"
    );

    // Once resumed, the writes of the calls that timed out land, and the releases queued
    // behind them remove them.
    for i in 0..3 {
        servers.resume(i);
    }
    assert!(
        eventually(|| (0..5).all(|i| servers.keys(i).is_empty())).await,
        "keys left behind: {:?}",
        (0..5).map(|i| servers.keys(i)).collect::<Vec<_>>()
    );
    assert!(servers.holders("job", &token, 0..5).is_empty());
}

/// A contended attempt with a hung node costs at most one node timeout: its answer is waited
/// for no longer than that, and the release that follows it there finishes in the background.
/// (It waited for both: twice the node timeout.)
#[tokio::test]
async fn a_hung_node_costs_a_contended_attempt_one_node_timeout() {
    let servers = Servers::start(5);
    let node_timeout = Duration::from_secs(2);
    let (holder, contender) = (
        servers.one_attempt(node_timeout),
        servers.one_attempt(node_timeout),
    );
    support::warm_up(&holder).await;
    support::warm_up(&contender).await;
    let lock = holder.acquire(&["job"], TTL).await.expect("holder");
    servers.pause(0);
    // A call already hangs on node 0 when the attempt comes: its request there waits behind
    // it and is answered with that call's timeout.
    let other = contender
        .acquire(&["other"], TTL)
        .await
        .expect("four nodes answer");
    let started = Instant::now();
    let err = contender
        .acquire(&["job"], TTL)
        .await
        .expect_err("held by the holder");
    let took = started.elapsed();
    servers.resume(0);
    assert!(matches!(err, Error::Contended { .. }), "{err:?}");
    assert!(
        took < node_timeout * 3 / 2,
        "the contended attempt took {took:?}: more than one node timeout ({node_timeout:?})"
    );
    lock.release().await.expect("release");
    other.release().await.expect("release");
    contender.close().await;
    assert!(
        eventually(|| (0..5).all(|i| servers.keys(i).is_empty())).await,
        "keys left behind: {:?}",
        (0..5).map(|i| servers.keys(i)).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_restarted_node_is_used_again() {
    let mut servers = Servers::start(3);
    // Patient: a call that timed out on a loaded machine would fail "two of three" below.
    let redlock = servers.patient();
    redlock
        .acquire(&["a"], TTL)
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    servers.kill(0);
    let lock = redlock.acquire(&["b"], TTL).await.expect("two of three");
    lock.release().await.expect("release");
    servers.restart(0);
    // The connection comes back: a later lock reaches node 0 again (and its scripts are
    // loaded again on the empty server).
    let deadline = Instant::now() + support::DEADLINE;
    let mut reached = false;
    while Instant::now() < deadline {
        let lock = redlock.acquire(&["c"], TTL).await.expect("acquire");
        reached = servers.get(0, "c").as_deref() == Some(lock.token());
        lock.release().await.expect("release");
        if reached {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(reached, "node 0 never took part again after its restart");
}

#[tokio::test]
async fn a_single_node_is_its_own_majority() {
    let servers = Servers::start(1);
    // Patient: a call that timed out would be no vote, not the denial checked below.
    let redlock = servers.patient();
    assert_eq!(redlock.quorum(), 1);
    let lock = redlock.acquire(&["job"], TTL).await.expect("acquire");
    let err = redlock.try_acquire(&["job"], TTL).await.expect_err("held");
    assert!(
        matches!(
            err,
            Error::Contended {
                denied: 1,
                nodes: 1,
                ..
            }
        ),
        "{err:?}"
    );
    lock.release().await.expect("release");
}

/// A `using()` scope that outlives many node timeouts beside a hung minority node: its extension
/// rounds are decided by the healthy majority without waiting for the hung node, and however
/// many rounds queued behind the hung node's call, the final release costs about one node
/// timeout (before the fix, every round's wait on the hung node chained onto the next and it
/// took seconds).
///
/// Every number comes from the two it is about: the extension window (how long a round has to
/// be confirmed) and the node timeout (how long the hung node holds each call). The window is
/// a default threshold's 500 ms, so that a loaded machine cannot cut a healthy round off (a
/// 46 ms window lost the lock in 4 of 26 runs beside three CPU burners); the node timeout is
/// four times the rounds' period, so that rounds still pile up behind each hung call, and
/// longer than the window, so that a round that waited for the hung node would lose the lock.
#[tokio::test]
async fn a_hung_minority_costs_a_long_using_scope_one_node_timeout() {
    let servers = Servers::start(3);
    let threshold = Duration::from_millis(500);
    // Rounds about every threshold, each with the whole threshold to be confirmed.
    let ttl = support::ttl_for_window(threshold);
    let node_timeout = threshold * 4;
    let redlock = redfence::Redlock::builder()
        .nodes(servers.urls())
        .automatic_extension_threshold(threshold)
        .node_timeout(node_timeout)
        .build()
        .expect("config");
    support::warm_up(&redlock).await;
    servers.pause(2);
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let (returned, routine_done, early, late) = {
        let result = redlock
            .using(&["long"], ttl, |signal| async move {
                // One node timeout in, the hung node's queue is as long as it gets; two more
                // bring eight more rounds.
                tokio::time::sleep(node_timeout).await;
                let early = tasks();
                tokio::time::sleep(node_timeout * 2).await;
                let late = tasks();
                signal.check()?;
                Ok::<_, Error>((Instant::now(), early, late))
            })
            .await;
        let (routine_done, early, late) = result.expect("held throughout");
        (Instant::now(), routine_done, early, late)
    };
    let tail = returned - routine_done;
    // About one node timeout for the final release, which waits behind the hung node's call
    // in flight; a chain would cost at least two.
    assert!(
        tail < node_timeout * 3 / 2,
        "using() returned {tail:?} after its routine (node timeout {node_timeout:?})"
    );
    // Tasks do not pile up with the scope's age.
    assert!(
        late <= early + 5,
        "{early} tasks alive after one node timeout, {late} after three"
    );
    servers.resume(2);
}
