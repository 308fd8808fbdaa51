//! The per-node pipeline against real redis-server processes: bursts are granted, every lock
//! in a batch gets its own answer, a bad key fails only its own lock, a killed node fails
//! its batch without any lock granted short of a majority, releases follow acquires, and
//! acquires queued behind a hung call are never sent; a large foreign value at a lock key
//! contends that lock alone. The node's connection: a late reply never reaches the next lock,
//! the URL's database is selected, a server without the script gets it once, and a slow
//! handshake goes on in the background.

mod support;

use std::time::Duration;

use futures::future::join_all;
use redfence::{Error, NodeFailure, Redlock};
use support::proxy::{Mode, Proxy};
use support::{Servers, TestRedlock, eventually};

const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_five_thousand_is_all_granted_on_a_majority() {
    const BURST: usize = 5_000;
    let servers = Servers::start(3);
    let redlock = servers.redlock();
    support::warm_up(&redlock).await;
    let results = join_all((0..BURST).map(|i| {
        let redlock = redlock.clone();
        async move { redlock.acquire(&[format!("burst:{i}")], TTL).await }
    }))
    .await;
    let mut locks = Vec::with_capacity(BURST);
    for (i, result) in results.into_iter().enumerate() {
        match result {
            Ok(lock) => locks.push(lock),
            Err(err) => panic!("lock {i} of the burst failed: {err}"),
        }
    }
    // Every lock's key is on a majority (on a loaded machine a node's straggling acquires may
    // be dropped behind a timed-out call: the lock still stands on the other two).
    let on_a_majority = || {
        let keys: Vec<std::collections::HashSet<String>> = (0..3)
            .map(|n| servers.keys(n).into_iter().collect())
            .collect();
        (0..BURST).all(|i| {
            let key = format!("burst:{i}");
            keys.iter().filter(|k| k.contains(&key)).count() >= 2
        })
    };
    assert!(
        eventually(on_a_majority).await,
        "keys per node: {:?}",
        (0..3).map(|n| servers.keys(n).len()).collect::<Vec<_>>()
    );
    for lock in locks.iter().step_by(97) {
        let key = &lock.resources()[0];
        assert!(servers.holders(key, lock.token(), 0..3).len() >= 2);
    }
    join_all(locks.into_iter().map(|l| l.release())).await;
    assert!(eventually(|| (0..3).all(|n| servers.keys(n).is_empty())).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_foreign_value_contends_its_own_lock_only() {
    let servers = Servers::start(3);
    let redlock = servers.one_attempt(support::PATIENT);
    support::warm_up(&redlock).await;
    // Another program's 2 MiB value at one lock's key, on every node.
    let big = "v".repeat(2 << 20);
    for n in 0..3 {
        let _: () = redis::cmd("SET")
            .arg("foreign:big")
            .arg(&big)
            .query(&mut servers.conn(n))
            .expect("SET");
    }
    let mut names: Vec<String> = (0..50).map(|i| format!("beside:{i}")).collect();
    names.push("foreign:big".into());
    // All at once, so that they share batches.
    let results = join_all(names.iter().map(|name| {
        let redlock = redlock.clone();
        async move { redlock.acquire(&[name.as_str()], TTL).await }
    }))
    .await;
    let mut locks = Vec::new();
    for (name, result) in names.iter().zip(results) {
        match (name.as_str(), result) {
            ("foreign:big", Err(Error::Contended { denied: 3, .. })) => {}
            ("foreign:big", other) => panic!("the foreign key: {other:?}"),
            (_, Ok(lock)) => locks.push(lock),
            (name, Err(err)) => panic!("{name}: {err}"),
        }
    }
    join_all(locks.into_iter().map(|l| l.release())).await;
    for n in 0..3 {
        assert_eq!(
            servers.get(n, "foreign:big").map(|v| v.len()),
            Some(big.len())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_lock_in_a_batch_gets_its_own_answer() {
    let servers = Servers::start(3);
    // Every node's answer counts (denied: 3): a node timeout a loaded machine can meet.
    let redlock = servers.one_attempt(Duration::from_millis(500));
    support::warm_up(&redlock).await;
    // Half the resources are held by someone else on every node; the other half are free.
    for n in 0..3 {
        for i in (0..200).step_by(2) {
            let _: () = servers.cmd(n, &["SET", &format!("mixed:{i}"), "someone-else"]);
        }
        // And one key holds a hash: WRONGTYPE for its lock alone.
        let _: i64 = servers.cmd(n, &["HSET", "mixed:hash", "field", "value"]);
    }
    let mut names: Vec<String> = (0..200).map(|i| format!("mixed:{i}")).collect();
    names.push("mixed:hash".into());
    // All at once, so that they share batches.
    let results = join_all(names.iter().map(|name| {
        let redlock = redlock.clone();
        async move { redlock.acquire(&[name.as_str()], TTL).await }
    }))
    .await;
    for (i, result) in results.iter().enumerate().take(200) {
        match (i % 2, result) {
            (0, Err(Error::Contended { denied: 3, .. })) => {}
            (1, Ok(_)) => {}
            (_, other) => panic!("mixed:{i}: {other:?}"),
        }
    }
    match &results[200] {
        Err(Error::QuorumUnreachable { errors, .. }) => {
            assert_eq!(errors.len(), 3);
            for e in errors {
                assert!(matches!(e.failure, NodeFailure::Reply(_)), "{e}");
                assert!(e.to_string().contains("WRONGTYPE"), "{e}");
            }
        }
        other => panic!("the hash's lock: {other:?}"),
    }
    // The granted locks hold their keys; the held and the hash ones were left untouched.
    for n in 0..3 {
        assert_eq!(servers.get(n, "mixed:0").as_deref(), Some("someone-else"));
        let kind: String = servers.cmd(n, &["TYPE", "mixed:hash"]);
        assert_eq!(kind, "hash");
    }
    let granted: Vec<_> = results.into_iter().filter_map(Result::ok).collect();
    assert_eq!(granted.len(), 100);
    join_all(granted.into_iter().map(|l| l.release())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_batch_fails_its_locks_and_nothing_is_granted_without_a_majority() {
    let mut servers = Servers::start(3);
    let redlock = servers.builder().retry_count(0).build().expect("config");
    support::warm_up(&redlock).await;
    servers.kill(2);
    servers.kill(1);
    let results = join_all((0..300).map(|i| {
        let redlock = redlock.clone();
        async move { redlock.acquire(&[format!("killed:{i}")], TTL).await }
    }))
    .await;
    for (i, result) in results.iter().enumerate() {
        match result {
            Err(Error::QuorumUnreachable {
                granted, errors, ..
            }) => {
                assert!(*granted <= 1, "killed:{i}: {result:?}");
                assert!(
                    errors.iter().any(|e| e.index == 1 || e.index == 2),
                    "killed:{i}: {result:?}"
                );
            }
            other => panic!("killed:{i}: granted without a majority? {other:?}"),
        }
    }
    // Every failed attempt released what it had taken on the live node.
    assert!(eventually(|| servers.keys(0).is_empty()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_runs_after_its_acquire_on_every_node() {
    let servers = Servers::start(3);
    // Patient: the subject is order, not time; a call of the burst timed out on a loaded
    // machine (at the default 50 ms) failed a release with QuorumUnreachable.
    let redlock: Redlock = servers.patient();
    support::warm_up(&redlock).await;
    // Acquire and release back to back, many at once: the release returns at a majority, and
    // on the last node it must still come after the acquire (or the key would stay behind).
    join_all((0..500).map(|i| {
        let redlock = redlock.clone();
        async move {
            let lock = redlock
                .acquire(&[format!("order:{i}")], TTL)
                .await
                .expect("acquire");
            lock.release().await.expect("release");
        }
    }))
    .await;
    redlock.close().await;
    for n in 0..3 {
        assert!(
            servers.keys(n).is_empty(),
            "node {n} kept {} keys",
            servers.keys(n).len()
        );
    }
}

/// Acquires queued behind a call to a hung node are answered with the timeout and never sent
/// (only their releases are, in order): once the node answers again, none of those locks'
/// keys is ever set there, not even for a moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_queued_behind_a_hung_call_never_land_later() {
    let servers = Servers::start(3);
    // Long enough for the loop below to finish while the first call hangs.
    let redlock = servers.one_attempt(Duration::from_secs(2));
    support::warm_up(&redlock).await;
    // Every SET on node 0 announces itself on a channel, read on a connection of its own.
    let _: () = servers.cmd(0, &["CONFIG", "SET", "notify-keyspace-events", "E$"]);
    let mut events = servers.conn(0);
    events
        .set_read_timeout(Some(support::DEADLINE))
        .expect("read timeout");
    let mut events = events.as_pubsub();
    events
        .subscribe(&["__keyevent@0__:set", "marker"])
        .expect("subscribe");

    servers.pause(0);
    // The first goes out to node 0 and hangs there; the rest queue behind it.
    for i in 0..10 {
        let lock = redlock
            .acquire(&[format!("r{i}")], TTL)
            .await
            .expect("nodes 1 and 2 make the majority");
        lock.release().await.expect("release");
    }
    // A lock held on node 1 and free on node 2 fails only once node 0 has answered too: with
    // the timeout of the call it hangs on, which answers everything queued behind it.
    let _: () = servers.cmd(1, &["SET", "witness", "someone-else"]);
    match redlock.acquire(&["witness"], TTL).await {
        Err(Error::QuorumUnreachable { errors, .. }) => assert!(
            errors
                .iter()
                .any(|e| e.index == 0 && matches!(e.failure, NodeFailure::Timeout(_))),
            "{errors:?}"
        ),
        other => panic!("expected node 0's timeout, got {other:?}"),
    }
    servers.resume(0);
    // Everything kept to be sent has been sent.
    redlock.close().await;
    let _: i64 = servers.cmd(0, &["PUBLISH", "marker", "end"]);
    let mut set = Vec::new();
    loop {
        let message = events.get_message().expect("the marker arrives");
        if message.get_channel_name() == "marker" {
            break;
        }
        set.push(message.get_payload::<String>().expect("key name"));
    }
    // The first lock's acquire was in flight when the node hung: it may land (its release
    // follows it). None of the others may, nor the witness's.
    assert!(
        set.iter().all(|key| key == "r0"),
        "acquires queued behind the hung call landed later: {set:?}"
    );
    assert!(
        eventually(|| servers.keys(0).is_empty()).await,
        "{:?}",
        servers.keys(0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_reply_is_never_handed_to_the_next_lock() {
    // One node, so that its answer alone decides each lock.
    let servers = Servers::start(1);
    // Patient: the calls made while the node is stopped time out whatever the timeout; the
    // later ones must each be answered, which a short timeout does not promise on a loaded
    // machine.
    let redlock = servers.one_attempt(support::PATIENT);
    support::warm_up(&redlock).await;
    let _: () = servers.cmd(0, &["SET", "late:held", "someone-else"]);
    // Calls that time out while the node is stopped: their replies (refusals, and the
    // failed attempts' releases) are still owed on the connection when it wakes up.
    servers.pause(0);
    for _ in 0..3 {
        match redlock.acquire(&["late:held"], TTL).await {
            Err(Error::QuorumUnreachable { errors, .. }) => assert!(
                matches!(errors[0].failure, NodeFailure::Timeout(_)),
                "{errors:?}"
            ),
            other => panic!("the node is stopped: {other:?}"),
        }
    }
    servers.resume(0);
    // Every later lock gets its own answer: a free resource is granted (a refusal owed to a
    // call given up would refuse it), a held one is refused.
    for i in 0..5 {
        let lock = redlock
            .acquire(&[format!("late:free:{i}")], TTL)
            .await
            .expect("a free resource is granted");
        match redlock.acquire(&["late:held"], TTL).await {
            Err(Error::Contended { .. }) => {}
            other => panic!("a held resource is refused: {other:?}"),
        }
        assert_eq!(
            servers.get(0, &format!("late:free:{i}")).as_deref(),
            Some(lock.token())
        );
        lock.release().await.expect("release");
    }
    assert_eq!(servers.get(0, "late:held").as_deref(), Some("someone-else"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_in_a_node_url_is_where_the_keys_go() {
    let servers = Servers::start(3);
    let urls: Vec<String> = (0..3).map(|i| format!("{}/3", servers.url(i))).collect();
    let redlock = Redlock::builder().nodes(urls).build().expect("config");
    let lock = redlock.acquire(&["in-db-3"], TTL).await.expect("acquire");
    let in_db_3 = |i: usize| -> Option<String> {
        let client = redis::Client::open(format!("{}/3", servers.url(i))).expect("client");
        let mut conn = client.get_connection().expect("connection");
        redis::cmd("GET")
            .arg("in-db-3")
            .query(&mut conn)
            .expect("GET")
    };
    assert!(
        eventually(|| (0..3).all(|i| in_db_3(i).as_deref() == Some(lock.token()))).await,
        "every node holds the lock in database 3"
    );
    for i in 0..3 {
        assert_eq!(servers.get(i, "in-db-3"), None, "node {i}, database 0");
    }
    lock.release().await.expect("release");
    assert!(eventually(|| (0..3).all(|i| in_db_3(i).is_none())).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_script_gets_it_on_its_first_call_once() {
    let mut servers = Servers::start(3);
    // The script for every call (on Valkey 9 single-key locks would go as plain commands).
    let redlock = servers
        .builder()
        .native_commands(false)
        .build()
        .expect("config");
    // Servers that never saw the script, then one restarted (its scripts gone).
    for _ in 0..3 {
        let lock = redlock.acquire(&["preload"], TTL).await.expect("acquire");
        lock.release().await.expect("release");
    }
    servers.restart(0);
    support::warm_up(&redlock).await;
    for _ in 0..3 {
        let lock = redlock.acquire(&["preload"], TTL).await.expect("acquire");
        lock.release().await.expect("release");
    }
    redlock.close().await;
    // (A server's statistics start again with it.) The first call met NOSCRIPT, loaded the
    // script and ran again; no later call did.
    for i in 0..3 {
        let (calls, failed) = servers.evalsha_stats(i);
        assert!(calls >= 3, "node {i} ran the batch script ({calls} calls)");
        assert!(
            failed <= 1,
            "node {i}: {failed} EVALSHA calls met NOSCRIPT ({calls} calls)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_slower_than_the_node_timeout_still_connects() {
    let servers = Servers::start(1);
    // 30 ms each way: a call takes one round trip (60 ms), the handshake two (`SELECT`, then
    // loading the script: 120 ms), longer than the node timeout (90 ms). A connect cut short
    // at every call's timeout would never finish; one that goes on in the background does.
    let proxy = Proxy::start(servers.port(0)).await;
    proxy.set(Mode::Delay(Duration::from_millis(30)));
    let redlock = Redlock::builder()
        .nodes([format!("{}/1", proxy.url())])
        .node_timeout(Duration::from_millis(90))
        .retry_count(0)
        .build()
        .expect("config");
    let deadline = std::time::Instant::now() + support::DEADLINE;
    let lock = loop {
        match redlock.acquire(&["slow-handshake"], TTL).await {
            Ok(lock) => break lock,
            Err(err) if std::time::Instant::now() < deadline => {
                assert!(err.is_retryable(), "{err}");
            }
            Err(err) => panic!("never connected: {err}"),
        }
    };
    lock.release().await.expect("release");
}

/// A current-thread runtime, for the tests of calls from more than one runtime.
fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn a_call_from_another_runtime_fails_in_time_while_the_queues_runtime_is_idle() {
    let servers = Servers::start(3);
    // Patient: the first runtime's lock must be granted; the second runtime's call fails
    // without waiting for any node (bounded below by its own 10 s).
    let redlock = servers.one_attempt(support::PATIENT);
    // The node queues start on this runtime, which then stays alive but idle. Every node's
    // connection is made first: a connect still running on the idle runtime would hold up
    // `close` below (a limit this test does not cover).
    let first = current_thread_runtime();
    first.block_on(async {
        let lock = redlock.acquire(&["first"], TTL).await.expect("acquire");
        let token = lock.token().to_owned();
        assert!(eventually(|| servers.holders("first", &token, 0..3).len() == 3).await);
        lock.release().await.expect("release");
    });
    let second = current_thread_runtime();
    let outcome = second.block_on(async {
        let attempt = redlock.try_acquire(&["second"], TTL);
        tokio::time::timeout(Duration::from_secs(10), attempt).await
    });
    let err = match outcome {
        Err(_) => panic!("a call from another runtime hung while the queues' runtime was idle"),
        Ok(Ok(_)) => panic!("granted without any node answering"),
        Ok(Err(err)) => err,
    };
    let Error::QuorumUnreachable { errors, .. } = &err else {
        panic!("not QuorumUnreachable: {err}");
    };
    assert_eq!(errors.len(), 3, "{err}");
    assert!(
        errors
            .iter()
            .all(|f| f.to_string().contains("another Tokio runtime")),
        "each node says why: {err}"
    );
    // Nothing was sent, so nothing is held.
    assert!(servers.on_every_node("second", Option::is_none));
    // `close` waits for what is queued for each node, and gives up on queues nothing serves.
    let closed = second
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), redlock.close()).await });
    assert!(closed.is_ok(), "close hung on queues that nothing serves");
    drop(first);
}

#[test]
fn after_the_queues_runtime_shuts_down_the_next_runtime_gets_queues_of_its_own() {
    let servers = Servers::start(3);
    let redlock = servers.patient();
    let first = current_thread_runtime();
    first.block_on(async {
        let lock = redlock.acquire(&["first"], TTL).await.expect("acquire");
        lock.release().await.expect("release");
    });
    drop(first);
    let second = current_thread_runtime();
    let token = second.block_on(async {
        let lock = redlock.acquire(&["second"], TTL).await.expect("acquire");
        let token = lock.token().to_owned();
        assert!(servers.holders("second", &token, 0..3).len() >= 2);
        lock.release().await.expect("release");
        token
    });
    let released = second.block_on(eventually(|| {
        servers.holders("second", &token, 0..3).is_empty()
    }));
    assert!(released, "released on every node");
}
