//! `Redlock::inspect` and `Redlock::force_release` against real redis-server processes.

mod support;

use std::time::Duration;

use redfence::{Error, InvalidInput, KeyState, NodeFailure, TOKEN_PREFIX_LEN};
use support::{Servers, TestRedlock, eventually};

#[tokio::test]
async fn inspect_reports_each_node_and_the_quorum_view() {
    let mut servers = Servers::start(5);
    let redlock = servers
        .builder()
        .key_prefix("locks:")
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("valid config");
    let lock = redlock
        .acquire(&["job"], Duration::from_secs(20))
        .await
        .expect("acquire");
    // The acquire returns at the majority: let the last nodes' calls land first, so that
    // the DEL below is not overtaken by one.
    assert!(
        eventually(|| servers.holders("locks:job", lock.token(), 0..5).len() == 5).await,
        "the key reached every node"
    );
    // Node 4 loses its key, node 3 dies, and "other" holds a hash on node 0.
    let _: i64 = servers.cmd(4, &["DEL", "locks:job"]);
    servers.kill(3);
    let _: i64 = servers.cmd(0, &["HSET", "locks:other", "f", "v"]);

    let report = redlock.inspect(&["job", "other"]).await.expect("inspect");
    assert_eq!(report.keys, ["locks:job", "locks:other"]);
    assert_eq!(report.quorum, 3);
    assert_eq!(report.answered(), 4);
    let prefix = &lock.token()[..TOKEN_PREFIX_LEN];
    for i in [0, 1, 2] {
        let keys = report.nodes[i].keys.as_ref().expect("answered");
        match &keys[0] {
            KeyState::Held { token_prefix, ttl } => {
                assert_eq!(token_prefix, prefix);
                let ttl = ttl.expect("expires");
                assert!(ttl > Duration::from_secs(10) && ttl <= Duration::from_secs(20));
            }
            other => panic!("node {i}: {other:?}"),
        }
    }
    assert!(matches!(
        report.nodes[3].keys,
        Err(NodeFailure::Connection(_) | NodeFailure::Timeout(_))
    ));
    assert_eq!(
        report.nodes[4].keys.as_ref().expect("answered")[0],
        KeyState::Absent
    );

    let job = report.view(0);
    let owner = job.owner().expect("held by a majority");
    assert_eq!(owner.nodes, [0, 1, 2]);
    assert_eq!((job.absent, job.failed), (1, 1));
    let text = job.to_string();
    assert!(
        text.starts_with(&format!("held by one owner ({prefix}) on 3/5 nodes, ~")),
        "{text}"
    );
    let other = report.view(1);
    assert!(other.owner().is_none());
    assert_eq!(other.foreign, 1);
    assert!(other.is_free(), "absent on 3 of the 4 nodes that answered");

    // Inspection is read-only: the lock is still ours.
    lock.release().await.expect("release after inspect");
}

#[tokio::test]
async fn force_release_deletes_whoever_holds_it() {
    let servers = Servers::start(3);
    let redlock = servers.patient();
    let lock = redlock
        .acquire(&["job"], Duration::from_secs(20))
        .await
        .expect("acquire");
    // The acquire returns at the majority: let the last node's call land first.
    assert!(
        eventually(|| servers.holders("job", lock.token(), 0..3).len() == 3).await,
        "the key reached every node"
    );
    let before = redlock.force_release(&["job"]).await.expect("force");
    assert_eq!(before.present(), 3, "it reports what it deleted");
    for i in 0..3 {
        assert_eq!(servers.get(i, "job"), None);
    }
    let next = redlock
        .try_acquire(&["job"], Duration::from_secs(5))
        .await
        .expect("free after a forced release");
    next.release().await.expect("release");
    drop(lock);

    let bad = redlock.force_release(&["a", "a"]).await;
    assert!(matches!(
        bad,
        Err(Error::InvalidInput(InvalidInput::DuplicateResource { .. }))
    ));
    let none: &[&str] = &[];
    assert!(matches!(
        redlock.inspect(none).await,
        Err(Error::InvalidInput(InvalidInput::NoResources))
    ));
}

#[tokio::test]
async fn check_warns_about_a_node_that_may_evict_lock_keys() {
    let servers = Servers::start(3);
    let _: () = servers.cmd(1, &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = std::sync::Arc::clone(&events);
    let redlock = servers
        .builder()
        .on_event(move |e| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.clone());
            }
        })
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("config");
    let checks = redlock.check().await;
    assert_eq!(checks.len(), 3);
    let evicting: Vec<usize> = checks
        .iter()
        .filter(|c| c.may_evict_locks())
        .map(|c| c.index)
        .collect();
    assert_eq!(evicting, [1]);
    assert_eq!(
        checks[0].maxmemory_policy.as_deref().ok(),
        Some("noeviction")
    );
    let events = events.lock().expect("events").clone();
    assert!(
        matches!(
            events.as_slice(),
            [redfence::Event::EvictionPolicy { index: 1, policy, .. }] if policy == "allkeys-lru"
        ),
        "{events:?}"
    );
}

/// Two nodes that are one server at two addresses (here the server and a proxy in front of
/// it) pass `build()`, which can only compare addresses; `check()` compares the servers'
/// `run_id` and reports the second as the same server as the first, with an event.
#[tokio::test]
async fn check_reports_two_nodes_that_are_one_server() {
    let servers = Servers::start(2);
    let proxy = support::proxy::Proxy::start(servers.port(0)).await;
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = std::sync::Arc::clone(&events);
    let redlock = redfence::Redlock::builder()
        .nodes([servers.url(0), servers.url(1), proxy.url()])
        .node_timeout(Duration::from_millis(500))
        .on_event(move |e| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.clone());
            }
        })
        .build()
        .expect("three addresses pass build()");
    let checks = redlock.check().await;
    let same: Vec<Option<usize>> = checks.iter().map(|c| c.same_server_as).collect();
    assert_eq!(same, [None, None, Some(0)]);
    assert!(checks.iter().all(|c| c.run_id.is_some()), "{checks:?}");
    let events = events.lock().expect("events").clone();
    assert!(
        matches!(
            events.as_slice(),
            [redfence::Event::SameServer {
                first: 0,
                second: 2,
                ..
            }]
        ),
        "{events:?}"
    );
}

/// A forced release stands in for a fair holder's own release: the holder (which stays at the
/// head of the nodes' line while it holds) leaves the line with its key, and the waiters are
/// told at once, so the next one gets the resource long before its retry delay or the
/// holder's place would have run out.
#[tokio::test]
async fn a_forced_release_hands_a_fair_resource_to_its_waiter() {
    let servers = Servers::start(3);
    // Waiters that poll every 5 s, and places in line that last 15 s.
    let fair = || {
        servers
            .builder()
            .fair(true)
            .node_timeout(Duration::from_millis(500))
            .backoff(redfence::Backoff::fixed(Duration::from_secs(5), Duration::ZERO).retries(10))
            .build()
            .expect("valid config")
    };
    let (holder, waiter) = (fair(), fair());
    support::warm_up(&holder).await;
    support::warm_up(&waiter).await;
    let held = holder
        .acquire(&["job"], Duration::from_secs(60))
        .await
        .expect("holder");
    let waiting =
        tokio::spawn(async move { waiter.acquire(&["job"], Duration::from_secs(60)).await });
    // The waiter stands in line behind the holder on every node.
    assert!(
        eventually(|| (0..3).all(|i| servers.cmd::<i64>(i, &["ZCARD", "job:redfence:queue"]) == 2))
            .await,
        "the waiter did not take its place"
    );
    let forced = std::time::Instant::now();
    servers
        .redlock()
        .force_release(&["job"])
        .await
        .expect("force");
    let next = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the waiter got the resource within 3 s of the forced release")
        .expect("waiter task")
        .expect("acquired");
    assert!(forced.elapsed() < Duration::from_secs(3));
    next.release().await.expect("release");
    drop(held);
}
