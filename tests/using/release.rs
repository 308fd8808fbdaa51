//! Release on every exit path: a panicking routine, a panic in a spawned scope, a dropped
//! `using` future, a scope that ends at once; and no task outliving the call.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use redfence::Error;

use crate::support::{Servers, TestRedlock, eventually};
use crate::{MS, held_everywhere, recorded};

#[tokio::test]
async fn a_panicking_routine_releases_the_lock_then_propagates() {
    let servers = Servers::start(5);
    let redlock = servers.patient();
    let checker = &servers;
    let outcome =
        AssertUnwindSafe(
            redlock.using(&["job"], Duration::from_secs(10), |signal| async move {
                held_everywhere(checker, &signal).await;
                if signal.remaining() > Duration::ZERO {
                    panic!("routine panicked on purpose");
                }
                Ok::<(), Error>(())
            }),
        )
        .catch_unwind()
        .await;
    let panic = outcome.expect_err("the panic propagates");
    assert_eq!(
        panic.downcast_ref::<&str>(),
        Some(&"routine panicked on purpose")
    );
    // Released on every node before the panic resumed.
    for i in 0..5 {
        assert!(
            servers.keys(i).is_empty(),
            "node {i}: {:?}",
            servers.keys(i)
        );
    }
}

#[tokio::test]
async fn a_panic_in_a_spawned_scope_is_a_join_error_and_releases() {
    let servers = Arc::new(Servers::start(3));
    let redlock = servers.patient();
    let checker = Arc::clone(&servers);
    let task = tokio::spawn(async move {
        redlock
            .using(&["job"], Duration::from_secs(10), |signal| async move {
                held_everywhere(&checker, &signal).await;
                let fail = true;
                if fail {
                    panic!("boom");
                }
                Ok::<(), Error>(())
            })
            .await
    });
    let err = task.await.expect_err("the task panicked");
    assert!(err.is_panic());
    for i in 0..3 {
        assert!(servers.keys(i).is_empty(), "node {i}");
    }
}

#[tokio::test]
async fn dropping_the_using_future_releases_the_lock_promptly() {
    let servers = Servers::start(5);
    let redlock = servers.patient();
    let checker = &servers;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let token = tokio::select! {
        result = redlock.using(&["job"], Duration::from_secs(10), |signal| async move {
            held_everywhere(checker, &signal).await;
            let _ = started_tx.send(signal.token().to_owned());
            std::future::pending::<Result<(), Error>>().await
        }) => panic!("the routine never returns: {result:?}"),
        token = started_rx => token.expect("the routine started"),
    };
    // The `using` future is dropped here, mid-routine.
    let dropped = Instant::now();
    assert_eq!(servers.holders("job", &token, 0..5).len(), 5);
    assert!(eventually(|| servers.on_every_node("job", Option::is_none)).await);
    let took = dropped.elapsed();
    assert!(took < Duration::from_secs(2), "released after {took:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn no_task_outlives_the_using_call() {
    // One node: a quorum of one leaves no straggler call running after a round, so the
    // count of live tasks is exact.
    let servers = Servers::start(1);
    // Extensions about every 300 ms, each with 300 ms to be confirmed: longer than the node
    // timeout, so that a loaded machine neither cuts a round off nor loses the lock (a 500 ms
    // TTL left a 146 ms window, shorter than the 250 ms node timeout).
    let threshold = 300 * MS;
    let ttl = crate::support::ttl_for_window(threshold);
    let (events, redlock) = recorded(
        servers
            .builder()
            .node_timeout(250 * MS)
            .automatic_extension_threshold(threshold),
    );
    let metrics = tokio::runtime::Handle::current().metrics();
    // Warm the connections (each node's connection has its own driver task) and the
    // extension timer (one task for every lock's extension waits), through one extension.
    redlock
        .using(&["warm"], ttl, |_| {
            let events = events.clone();
            async move {
                assert!(eventually(|| events.extended() >= 1).await);
                Ok::<_, Error>(())
            }
        })
        .await
        .expect("using");
    let baseline = metrics.num_alive_tasks();
    let during = redlock
        .using(&["job"], ttl, |signal| {
            let events = events.clone();
            async move {
                // Run through a few extensions.
                assert!(eventually(|| events.extended() >= 4).await);
                signal.check()?;
                Ok::<_, Error>(metrics_now())
            }
        })
        .await
        .expect("using");
    assert_eq!(
        during,
        baseline + 1,
        "the extension task is the only extra task"
    );
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        baseline,
        "a task outlived using()"
    );
}

fn metrics_now() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// When an acquire round is decided by a majority, the calls still running on the other nodes
/// go on in the background; one that had not yet written its command must not land its SET
/// after the release of a scope that ended within milliseconds (the lock's requests follow
/// each other on every node).
#[tokio::test]
async fn a_scope_that_ends_at_once_leaves_no_key() {
    let mut leftovers = Vec::new();
    for round in 0..40 {
        let servers = Servers::start(3);
        // A node timeout a loaded machine meets: a call given up after it was written would
        // let its release (answered at once) go out behind it, and leave a key for a moment.
        let redlock = servers.patient();
        redlock
            .using(&["job"], Duration::from_secs(5), |_| async {
                Ok::<_, Error>(())
            })
            .await
            .expect("using");
        for i in 0..3 {
            if servers.get(i, "job").is_some() {
                leftovers.push((round, i, servers.pttl(i, "job")));
            }
        }
    }
    assert!(
        leftovers.is_empty(),
        "(round, node, PTTL ms) left: {leftovers:?}"
    );
}
