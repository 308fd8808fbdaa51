//! A whole Redis Cluster as one voter: three small clusters vote as three nodes, losing one
//! whole cluster keeps locks working, a slot migration (ASK, then MOVED) during a hold keeps
//! the lock, a member that hangs while its slot moves is left behind, and a lock across hash
//! slots is refused before any traffic.
#![cfg(feature = "cluster")]

mod support;

use std::time::Duration;

use redfence::{Error, InvalidInput, MemoryCounter, NodeAddr, Redlock, RedlockBuilder};
use support::redis_cluster::RedisCluster;

const TTL: Duration = Duration::from_secs(10);

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

/// A member that hangs (paused, or cut off without a reset) while its slot moves to another
/// member, as a failover does: the cluster connection has no response timeout of its own and
/// learns of a new slot owner only from a reply, which a hung member never sends. A call
/// given up at `node_timeout` now has a new connection made in the background (the slots
/// mapped again), and the other member keeps answering meanwhile. Before, every call went to
/// the hung member, for good.
#[tokio::test]
async fn a_hung_member_whose_slot_moved_is_left_behind() {
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
    // The other member's slots keep working while the connection is made again.
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
        support::DEADLINE * 2,
        "the voter stayed with the hung member",
    )
    .await;
    assert_eq!(
        cluster.servers.get(1 - hung, "moved").as_deref(),
        Some(lock.token()),
        "locked on the slot's new owner"
    );
    lock.release().await.expect("release");
    cluster.servers.resume(hung);
}

/// A call its caller cancelled early (a short timeout around `acquire`) says nothing about
/// the members: the cluster connection is not made again for it. One that waited its node
/// timeout is.
#[tokio::test]
async fn a_cancelled_call_does_not_remake_the_connection() {
    let cluster = RedisCluster::start();
    let redlock = builder(std::slice::from_ref(&cluster))
        .node_timeout(Duration::from_millis(1_000))
        .retry_count(0)
        .build()
        .expect("config");
    let lock = support::acquire_within(&redlock, &["job"], TTL, support::DEADLINE, "warm").await;
    lock.release().await.expect("release");
    let owner = cluster.owner("job");
    let other = 1 - owner;
    let accepted = cluster.servers.accepted_connections(other);
    let before = accepted.count();
    cluster.servers.pause(owner);
    // Cancelled after 50 ms, a twentieth of the node timeout.
    let cut = tokio::time::timeout(Duration::from_millis(50), redlock.acquire(&["job"], TTL)).await;
    assert!(cut.is_err(), "the owner is paused: {cut:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        accepted.count(),
        before,
        "no new connection for a cancelled call"
    );
    // Given up at the node timeout: the connection is made again (the seeds asked).
    let err = redlock.acquire(&["job"], TTL).await.expect_err("paused");
    assert!(err.is_retryable(), "{err}");
    assert!(
        support::eventually(|| accepted.count() > before).await,
        "a timed-out call remakes the connection"
    );
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
