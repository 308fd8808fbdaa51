//! A whole Redis Cluster as one voter: three small clusters vote as three nodes, losing one
//! whole cluster keeps locks working, a slot migration (ASK, then MOVED) during a hold keeps
//! the lock, a member that hangs then resumes runs a lock's release after its acquire, a
//! member that hangs while its slot moves is left behind after the patience window, and a
//! lock across hash slots is refused before any traffic.
#![cfg(feature = "cluster")]

mod support;

use std::time::{Duration, Instant};

use redfence::{Error, InvalidInput, MemoryCounter, NodeAddr, Redlock, RedlockBuilder};
use support::Servers;
use support::redis_cluster::RedisCluster;

const TTL: Duration = Duration::from_secs(10);
/// How long a Cluster voter keeps its connection while a member leaves calls unanswered (the
/// documented patience window), before it makes it again.
const PATIENCE: Duration = Duration::from_secs(5);

fn builder(clusters: &[RedisCluster]) -> RedlockBuilder {
    Redlock::builder()
        .nodes(clusters.iter().map(|c| NodeAddr::cluster(c.seeds())))
        .node_timeout(Duration::from_millis(500))
        .retry_delay(Duration::from_millis(20))
        .retry_jitter(Duration::from_millis(10))
}

#[tokio::test]
async fn three_clusters_vote_as_three_nodes_and_survive_losing_one_whole() {
    let mut clusters: Vec<RedisCluster> = (0..3).map(|_| RedisCluster::start()).collect();
    let redlock = builder(&clusters)
        .fencing(MemoryCounter::new())
        .build()
        .expect("config");
    assert_eq!(redlock.quorum(), 2);

    // Two resources with one hash tag: one slot, so one cluster member runs the script.
    let resources = ["{order:7}:payment", "{order:7}:invoice"];
    let mut lock = redlock.acquire(&resources, TTL).await.expect("acquire");
    assert_eq!(lock.fence(), Some(1));
    let token = lock.token().to_owned();
    assert!(
        support::eventually(|| clusters.iter().all(|c| resources
            .iter()
            .all(|r| c.get(r).as_deref() == Some(&token))))
        .await,
        "every cluster holds both keys"
    );
    let rival = builder(&clusters).retry_count(0).build().expect("config");
    let err = rival
        .acquire(&resources, TTL)
        .await
        .expect_err("the lock is held");
    assert!(matches!(err, Error::Contended { denied: 3, .. }), "{err}");

    lock.extend(Duration::from_secs(60)).await.expect("extend");
    assert!(
        support::eventually(|| clusters.iter().all(|c| c.pttl(resources[0]) > 30_000)).await,
        "the extension reached every cluster"
    );
    lock.release().await.expect("release");
    assert!(
        support::eventually(|| clusters.iter().all(|c| c.get(resources[0]).is_none())).await,
        "the release reached every cluster"
    );

    // One whole cluster is gone: two of three still make a majority.
    clusters[2].kill();
    let lock = redlock.acquire(&["solo"], TTL).await.expect("acquire");
    assert_eq!(clusters[0].get("solo").as_deref(), Some(lock.token()));
    assert_eq!(clusters[1].get("solo").as_deref(), Some(lock.token()));
    lock.release().await.expect("release");

    let value = redlock
        .using(&["scoped"], TTL, |signal| async move {
            signal.check()?;
            Ok::<_, Error>(42)
        })
        .await
        .expect("using");
    assert_eq!(value, 42);
}

#[tokio::test]
async fn a_slot_migration_during_a_hold_keeps_the_lock() {
    let cluster = RedisCluster::start();
    let clusters = [cluster];
    let redlock = builder(&clusters).build().expect("config");
    let cluster = &clusters[0];
    let mut lock = redlock.acquire(&["held"], TTL).await.expect("acquire");
    let token = lock.token().to_owned();
    let before = cluster.owner("held");

    // Mid-migration: the key has moved and the old owner answers ASK.
    let migration = cluster.start_migration("held");
    lock.extend(Duration::from_secs(30))
        .await
        .expect("extend during the migration");
    cluster.finish_migration(migration);
    assert_ne!(cluster.owner("held"), before, "the slot moved");
    assert_eq!(cluster.get("held").as_deref(), Some(token.as_str()));
    assert!(cluster.pttl("held") > 20_000, "extended on the new owner");

    // After it: the old owner answers MOVED; the lock is still ours and still exclusive.
    lock.extend(Duration::from_secs(60))
        .await
        .expect("extend after the migration");
    assert!(cluster.pttl("held") > 40_000);
    let rival = builder(&clusters).retry_count(0).build().expect("config");
    let err = rival
        .acquire(&["held"], TTL)
        .await
        .expect_err("the lock survived the migration");
    assert!(matches!(err, Error::Contended { .. }), "{err}");
    lock.release().await.expect("release");
    assert_eq!(cluster.get("held"), None);
}

#[tokio::test]
async fn a_lock_across_hash_slots_is_refused_before_any_traffic() {
    // Nothing listens there: any traffic would be an unreachable node, not this error.
    let redlock = Redlock::builder()
        .node(NodeAddr::cluster(["redis://127.0.0.1:1"]))
        .build()
        .expect("config");
    let err = redlock
        .acquire(&["a", "b"], TTL)
        .await
        .expect_err("different slots");
    assert!(
        matches!(
            err,
            Error::InvalidInput(InvalidInput::KeysAcrossSlots {
                node: 0,
                first: 0,
                second: 1,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("hash tag"), "{err}");
    // So are an inspection and a forced release of them: one call per node reads them.
    let across = |result: Result<redfence::Inspection, Error>| {
        matches!(
            result,
            Err(Error::InvalidInput(InvalidInput::KeysAcrossSlots {
                node: 0,
                ..
            }))
        )
    };
    assert!(across(redlock.inspect(&["a", "b"]).await));
    assert!(across(redlock.force_release(&["a", "b"]).await));
}

/// Seeds far away (every round trip to them takes longer than `node_timeout`): the cluster
/// connection (seeds, slot map, every master) cannot be made within one call. It is made in
/// a task of its own that a given-up call does not abandon, and a later call finds it.
/// Before, every call restarted it and was cut off, for good.
#[tokio::test]
async fn discovery_longer_than_a_node_timeout_still_connects() {
    let cluster = RedisCluster::start();
    let delay = support::proxy::Mode::Delay(Duration::from_millis(40));
    let proxies = support::proxy::Proxy::in_front_of_each(&cluster.seeds(), delay).await;
    let far = Redlock::builder()
        .node(NodeAddr::cluster(proxies.iter().map(|p| p.url())))
        .node_timeout(Duration::from_millis(100))
        .retry_count(0)
        .build()
        .expect("config");
    let lock = support::acquire_within(
        &far,
        &["job"],
        TTL,
        support::DEADLINE,
        "never connected through far-away seeds",
    )
    .await;
    assert_eq!(cluster.get("job").as_deref(), Some(lock.token()));
    lock.release().await.expect("release");
}

/// A member that hangs (paused) while a lock's acquire is in flight on it: the other voters
/// grant the lock and it is released at once; the Cluster voter gives its acquire up at
/// `node_timeout`, with the release queued behind it. When the member resumes it runs the
/// acquire and then the release (the same connection carries both, in order, and the release
/// is sent again until answered): no lock key is left on it. Before (one script call per
/// request, a lock's calls ordered by the quorum logic), the release waited for the acquire's
/// time-out within its own, was never sent, and the key stayed there until its TTL.
#[tokio::test]
async fn a_member_hung_then_resumed_runs_the_release_after_the_acquire() {
    let cluster = RedisCluster::start();
    let servers = Servers::start(2);
    let redlock = Redlock::builder()
        .node(NodeAddr::cluster(cluster.seeds()))
        .nodes(servers.urls())
        .node_timeout(Duration::from_millis(200))
        .retry_count(0)
        .build()
        .expect("config");
    support::warm_up(&redlock).await;
    let ttl = Duration::from_secs(60);
    let owner = cluster.owner("job");
    // The other member would call the paused one failed (and the cluster down) after its
    // cluster-node-timeout, 2 s: not in this test.
    let _: () = cluster.servers.cmd(
        1 - owner,
        &["CONFIG", "SET", "cluster-node-timeout", "60000"],
    );
    cluster.servers.pause(owner);
    let started = Instant::now();
    let lock = redlock
        .acquire(&["job"], ttl)
        .await
        .expect("the two servers grant");
    // Released at once, while the Cluster voter's acquire is still in flight; the member
    // stays hung well past the node timeout, at which the voter gives that call up.
    lock.release().await.expect("the two servers release");
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.servers.resume(owner);
    assert!(started.elapsed() < PATIENCE, "paused within the window");
    tokio::time::timeout(support::DEADLINE, redlock.close())
        .await
        .expect("close() returns once the member answers");
    assert_eq!(
        cluster.servers.get(owner, "job"),
        None,
        "the resumed member holds the lock key: the release ran before the acquire, or never"
    );
}

/// A member that hangs (paused, or cut off without a reset) while its slot moves to another
/// member, as a failover does: the cluster connection has no response timeout of its own and
/// learns of a new slot owner only from a reply, which a hung member never sends. The voter
/// keeps its connection (and the order of the calls on it) for the patience window, then
/// makes it again (the slots mapped again) and locks on the slot's new owner; the other
/// member keeps answering all along.
#[tokio::test]
async fn a_hung_member_whose_slot_moved_is_left_behind_after_the_patience_window() {
    let cluster = RedisCluster::start();
    let redlock = builder(std::slice::from_ref(&cluster))
        .node_timeout(Duration::from_millis(300))
        .retry_count(0)
        .build()
        .expect("config");
    // The connection is made and the slot map cached, with "moved" on its first owner, and
    // the script loaded on both members (first calls, given time on a loaded machine).
    let elsewhere = (0..)
        .map(|i| format!("elsewhere:{i}"))
        .find(|key| cluster.owner(key) != cluster.owner("moved"))
        .expect("a key on the other member");
    for key in ["moved", elsewhere.as_str()] {
        let lock = support::acquire_within(&redlock, &[key], TTL, support::DEADLINE, "warm").await;
        lock.release().await.expect("release");
    }
    let hung = cluster.take_slot_from_hung_owner("moved");
    let started = Instant::now();
    // The other member's slots keep working while the hung one is waited for.
    let err = redlock.acquire(&["moved"], TTL).await.expect_err("hung");
    assert!(err.is_retryable(), "{err}");
    let lock = redlock
        .acquire(&[elsewhere.as_str()], TTL)
        .await
        .expect("the member that answers still locks");
    lock.release().await.expect("release");

    let lock = support::acquire_within(
        &redlock,
        &["moved"],
        TTL,
        PATIENCE + support::DEADLINE * 2,
        "the voter stayed with the hung member",
    )
    .await;
    assert!(
        started.elapsed() >= PATIENCE,
        "left the hung member after {:?}, within the patience window",
        started.elapsed()
    );
    assert_eq!(
        cluster.servers.get(1 - hung, "moved").as_deref(),
        Some(lock.token()),
        "locked on the slot's new owner"
    );
    lock.release().await.expect("release");
    cluster.servers.resume(hung);
}

/// Neither a call its caller cancelled early (a short timeout around `acquire`) nor calls
/// that time out make the cluster connection again within the patience window: a new
/// connection could run a later call before those still waiting on the old one. Once a
/// member has left calls unanswered for the window, the connection is made again.
#[tokio::test]
async fn the_connection_is_kept_through_time_outs_for_the_patience_window() {
    let cluster = RedisCluster::start();
    let redlock = builder(std::slice::from_ref(&cluster))
        .node_timeout(Duration::from_millis(500))
        .retry_count(0)
        .build()
        .expect("config");
    let lock = support::acquire_within(&redlock, &["job"], TTL, support::DEADLINE, "warm").await;
    lock.release().await.expect("release");
    let owner = cluster.owner("job");
    let other = 1 - owner;
    let _: () = cluster
        .servers
        .cmd(other, &["CONFIG", "SET", "cluster-node-timeout", "60000"]);
    let accepted = cluster.servers.accepted_connections(other);
    let before = accepted.count();
    cluster.servers.pause(owner);
    let paused = Instant::now();
    // Cancelled after 50 ms, a tenth of the node timeout.
    let cut = tokio::time::timeout(Duration::from_millis(50), redlock.acquire(&["job"], TTL)).await;
    assert!(cut.is_err(), "the owner is paused: {cut:?}");
    // Calls that time out, for most of the window.
    while paused.elapsed() < PATIENCE - Duration::from_secs(2) {
        let err = redlock.acquire(&["job"], TTL).await.expect_err("paused");
        assert!(err.is_retryable(), "{err}");
    }
    assert_eq!(
        accepted.count(),
        before,
        "a new connection within the patience window"
    );
    // Past the window (the releases of those attempts are still being sent again), the
    // connection is made again: the seeds asked.
    assert!(
        support::eventually(|| accepted.count() > before).await,
        "the connection was never made again"
    );
    assert!(paused.elapsed() >= PATIENCE);
    cluster.servers.resume(owner);
}

/// `check()` reads every master's eviction policy (`CONFIG GET` alone reaches one member, at
/// random): one member that may evict lock keys is reported, however often it is asked.
#[tokio::test]
async fn check_reads_every_masters_eviction_policy() {
    let cluster = RedisCluster::start();
    let _: () = cluster
        .servers
        .cmd(1, &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    let redlock = builder(std::slice::from_ref(&cluster))
        .build()
        .expect("config");
    let member = format!("127.0.0.1:{}", cluster.servers.port(1));
    for _ in 0..8 {
        let checks = redlock.check().await;
        let policy = checks[0].maxmemory_policy.as_deref().expect("read");
        assert!(checks[0].may_evict_locks(), "{policy}");
        assert_eq!(policy, format!("allkeys-lru (on {member})"));
    }
    let _: () = cluster
        .servers
        .cmd(1, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let checks = redlock.check().await;
    assert_eq!(
        checks[0].maxmemory_policy.as_deref().ok(),
        Some("noeviction")
    );
}

/// On Cluster voters the election's lock and leader record must share a slot (the name is
/// their hash tag): a name starting with `}` (an empty tag) is refused before any traffic;
/// braces inside a name are fine.
#[test]
fn an_election_whose_keys_would_split_across_slots_is_refused() {
    let redlock = Redlock::builder()
        .node(NodeAddr::cluster(["redis://127.0.0.1:1"]))
        .fencing(MemoryCounter::new())
        .build()
        .expect("config");
    let err = redlock
        .election("}x", None)
        .build()
        .expect_err("an empty hash tag");
    assert!(
        matches!(
            err,
            Error::Config(redfence::ConfigError::BadOption {
                option: "election name",
                ..
            })
        ),
        "{err:?}"
    );
    let election = redlock
        .election("jobs{eu}", None)
        .build()
        .expect("one slot");
    assert_eq!(election.lock_key(), "election:{jobs{eu}}");
}
