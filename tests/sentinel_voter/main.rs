//! A Sentinel-managed master as one voter: locks work through the master the sentinels name,
//! and after a failover during a hold the voter follows the new master, which still holds the
//! lock when it was replicated before the failover (the documented behaviour; a grant not yet
//! replicated is forgotten, like a restart without persistence); a master that hangs then
//! resumes runs a lock's release after its acquire; a master that hangs is left for the one
//! the sentinels promote once the patience window has passed; a call its caller cancels early
//! keeps the connection, and a sentinel that hangs is passed over. The voter is a server like
//! any other: its restart quarantine (`quarantine.rs`), fair mode, plain commands and release
//! hand-off (`like_a_server.rs`).
#![cfg(feature = "sentinel")]

#[path = "../support/mod.rs"]
mod support;

mod like_a_server;
mod quarantine;

use std::time::{Duration, Instant};

use redfence::{Error, NodeAddr, Redlock};
use support::Servers;
use support::sentinel::{MASTER, SentinelGroup};

const TTL: Duration = Duration::from_secs(20);
/// How long a Sentinel voter keeps its connection while the master leaves calls unanswered
/// (the documented patience window), before it asks the sentinels again.
const PATIENCE: Duration = Duration::from_secs(5);

/// A client of the voter alone, quarantine off: a new master is a restart for the quarantine
/// (see `quarantine.rs`), and these tests are about following the master.
fn redlock(group: &SentinelGroup) -> Redlock {
    Redlock::builder()
        .node(NodeAddr::sentinel(group.urls(), MASTER))
        .restart_quarantine(Duration::ZERO)
        .node_timeout(Duration::from_millis(500))
        .retry_delay(Duration::from_millis(20))
        .retry_jitter(Duration::from_millis(10))
        .build()
        .expect("config")
}

#[tokio::test]
async fn a_failover_during_a_hold_moves_the_voter_to_the_new_master() {
    let mut group = SentinelGroup::start();
    let redlock = redlock(&group);

    let mut lock = redlock.acquire(&["job"], TTL).await.expect("acquire");
    let token = lock.token().to_owned();
    let servers = &group.servers;
    assert_eq!(servers.get(0, "job").as_deref(), Some(token.as_str()));
    // Replicated before the failover: the new master will hold it.
    assert!(
        support::eventually(|| servers.get(1, "job").as_deref() == Some(token.as_str())).await,
        "the grant reached the replica"
    );

    // The master dies; the sentinels promote the replica.
    group.kill_master();
    let servers = &group.servers;

    // The voter's connection to the old master fails and it asks the sentinels again: within
    // a few rounds, extend reaches the new master.
    let deadline = Instant::now() + support::DEADLINE;
    loop {
        match lock.extend(Duration::from_secs(40)).await {
            Ok(()) => break,
            Err(err) if Instant::now() < deadline && err.is_retryable() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("extend after the failover: {err}"),
        }
    }
    assert!(
        servers.pttl(1, "job") > 25_000,
        "extended on the new master"
    );

    // Still exclusive through the new master.
    let rival = Redlock::builder()
        .node(NodeAddr::sentinel(group.urls(), MASTER))
        .node_timeout(Duration::from_millis(500))
        .retry_count(0)
        .build()
        .expect("config");
    let err = rival.acquire(&["job"], TTL).await.expect_err("held");
    assert!(matches!(err, Error::Contended { .. }), "{err}");
    lock.release().await.expect("release");
    assert_eq!(servers.get(1, "job"), None);
}

/// A master that hangs (paused) while a lock's acquire is in flight on it: the other voters
/// grant the lock and it is released at once; the Sentinel voter gives its acquire up at
/// `node_timeout`, with the release queued behind it. When the master resumes it runs the
/// acquire and then the release (the same connection carries both, in order, and the release
/// is sent again until answered): no lock key is left on it. Before (one script call per
/// request, a lock's calls ordered by the quorum logic), the release waited for the acquire's
/// time-out within its own, was never sent, and the key stayed there until its TTL.
#[tokio::test]
async fn a_master_hung_then_resumed_runs_the_release_after_the_acquire() {
    let group = SentinelGroup::start();
    // Paused for longer than a second: no failover in this test.
    group.set_down_after(60_000);
    let servers = Servers::start(2);
    let redlock = Redlock::builder()
        .node(NodeAddr::sentinel(group.urls(), MASTER))
        .nodes(servers.urls())
        .node_timeout(Duration::from_millis(200))
        .retry_count(0)
        .build()
        .expect("config");
    support::warm_up(&redlock).await;
    let ttl = Duration::from_secs(60);
    group.servers.pause(0);
    let started = Instant::now();
    let lock = redlock
        .acquire(&["job"], ttl)
        .await
        .expect("the two servers grant");
    // Released at once, while the Sentinel voter's acquire is still in flight; the master
    // stays hung well past the node timeout, at which the voter gives that call up.
    lock.release().await.expect("the two servers release");
    tokio::time::sleep(Duration::from_secs(2)).await;
    group.servers.resume(0);
    assert!(started.elapsed() < PATIENCE, "paused within the window");
    tokio::time::timeout(support::DEADLINE, redlock.close())
        .await
        .expect("close() returns once the master answers");
    assert_eq!(
        group.servers.get(0, "job"),
        None,
        "the resumed master holds the lock key: the release ran before the acquire, or never"
    );
}

/// A master that hangs (paused: its connection stays open and nothing answers) is replaced by
/// the sentinels. The voter keeps its connection through the calls that time out for the
/// patience window (the master may yet resume, and a new connection could run a release
/// before the acquire still waiting on the old one); then it asks the sentinels again, finds
/// the new master, and locks there.
#[tokio::test]
async fn a_hung_master_is_left_for_the_new_one_after_the_patience_window() {
    let mut group = SentinelGroup::start();
    let redlock = redlock(&group);
    redlock
        .acquire(&["warm"], TTL)
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");

    group.pause_master();
    let started = Instant::now();
    let deadline = started + PATIENCE + support::DEADLINE;
    let lock = loop {
        match redlock.acquire(&["job"], TTL).await {
            Ok(lock) => break lock,
            Err(err) if Instant::now() < deadline && err.is_retryable() => {}
            Err(err) => panic!("acquire after the failover: {err}"),
        }
    };
    assert!(
        started.elapsed() >= PATIENCE,
        "left the hung master after {:?}, within the patience window",
        started.elapsed()
    );
    let servers = &group.servers;
    assert_eq!(
        servers.get(1, "job").as_deref(),
        Some(lock.token()),
        "granted by the new master"
    );
    lock.release().await.expect("release");
    servers.resume(0);
}

/// Sentinels far away (every round trip to them takes longer than `node_timeout`):
/// discovering the master takes several round trips, so no single call can finish it. It
/// runs in a task of its own that a given-up call does not abandon, and a later call finds
/// the connection made. Before, every call restarted discovery and was cut off, for good.
#[tokio::test]
async fn discovery_longer_than_a_node_timeout_still_connects() {
    let group = SentinelGroup::start();
    let delay = support::proxy::Mode::Delay(Duration::from_millis(40));
    let proxies = support::proxy::Proxy::in_front_of_each(&group.urls(), delay).await;
    let far = Redlock::builder()
        .node(NodeAddr::sentinel(
            proxies.iter().map(|p| p.url()).collect::<Vec<_>>(),
            MASTER,
        ))
        .node_timeout(Duration::from_millis(100))
        .retry_count(0)
        .build()
        .expect("config");
    let lock = support::acquire_within(
        &far,
        &["job"],
        TTL,
        support::DEADLINE,
        "never connected through far-away sentinels",
    )
    .await;
    assert_eq!(group.servers.get(0, "job").as_deref(), Some(lock.token()));
    lock.release().await.expect("release");
}

/// A hung sentinel (paused: it accepts connections and never answers) among three: the voter
/// asks the others and locks.
#[tokio::test]
async fn a_hung_sentinel_is_passed_over() {
    let group = SentinelGroup::start();
    group.pause_sentinel(0);
    let redlock = Redlock::builder()
        .node(NodeAddr::sentinel(group.urls(), MASTER))
        .node_timeout(Duration::from_millis(300))
        .retry_count(0)
        .build()
        .expect("config");
    let lock = support::acquire_within(
        &redlock,
        &["job"],
        TTL,
        support::DEADLINE,
        "never connected past the hung sentinel",
    )
    .await;
    assert_eq!(group.servers.get(0, "job").as_deref(), Some(lock.token()));
    lock.release().await.expect("release");
}

/// A call its caller cancels early (a short timeout around `acquire`) says nothing about the
/// master: the voter keeps its connection instead of asking the sentinels and connecting
/// again on the next call.
#[tokio::test]
async fn a_cancelled_call_keeps_the_master_connection() {
    let group = SentinelGroup::start();
    let redlock = Redlock::builder()
        .node(NodeAddr::sentinel(group.urls(), MASTER))
        .node_timeout(Duration::from_millis(1_000))
        .retry_count(0)
        .build()
        .expect("config");
    let warm = support::acquire_within(&redlock, &["warm"], TTL, support::DEADLINE, "warm").await;
    warm.release().await.expect("release");
    let accepted = group.servers.accepted_connections(0);
    let before = accepted.count();
    // Paused for far less than the sentinels' down-after (1 s): no failover.
    group.servers.pause(0);
    let cut = tokio::time::timeout(Duration::from_millis(50), redlock.acquire(&["job"], TTL)).await;
    group.servers.resume(0);
    assert!(cut.is_err(), "the master is paused: {cut:?}");
    let lock = support::acquire_within(&redlock, &["job"], TTL, support::DEADLINE, "resumed").await;
    lock.release().await.expect("release");
    assert_eq!(
        accepted.count(),
        before,
        "the master got a new connection after a cancelled call"
    );
}

/// A voter with no sentinel or no master name is refused by `build()`, before any traffic.
#[test]
fn a_sentinel_voter_without_sentinels_or_master_name_is_refused() {
    let none: [&str; 0] = [];
    for (sentinels, master) in [(&none[..], "mymaster"), (&["redis://127.0.0.1:1"][..], " ")] {
        let err = Redlock::builder()
            .node(NodeAddr::sentinel(sentinels.iter().copied(), master))
            .build()
            .expect_err("refused");
        assert!(
            matches!(err, redfence::ConfigError::BadNodeUrl { index: 0, .. }),
            "{err:?}"
        );
    }
}
