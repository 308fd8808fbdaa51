//! A Sentinel voter's restart quarantine, as a server's: a master that lost its memory does not
//! count, for the client that saw it and a fresh one alike; after a failover the voter follows
//! the new master, a new `run_id`, which counts as a restart (a promoted replica has a long
//! uptime, and may miss the grants not yet replicated).

use std::time::{Duration, Instant};

use redfence::{Error, NodeAddr, NodeFailure, Redlock};

use crate::support::restarted::quarantined;
use crate::support::sentinel::{MASTER, SentinelGroup};
use crate::support::{self, PATIENT, Servers, eventually};

const TTL: Duration = Duration::from_secs(20);

/// A client with the default quarantine over the Sentinel voter (node 0) and `servers` (nodes
/// 1 and 2).
fn client(group: &SentinelGroup, servers: &Servers) -> Redlock {
    Redlock::builder()
        .node(NodeAddr::sentinel(group.urls(), MASTER))
        .nodes(servers.urls())
        .node_timeout(PATIENT)
        .retry_count(0)
        .build()
        .expect("config")
}

/// The roster key in which the other servers remember the Sentinel voter's marker: it is
/// named as clients name it.
fn roster_key(group: &SentinelGroup) -> String {
    let seeds = group.urls().join(", ");
    format!("redfence:roster:sentinel[{MASTER}@{seeds}]")
}

/// The master's marker id (server 0 of the group).
fn marker_id(group: &SentinelGroup) -> Option<String> {
    let marker = group.servers.get(0, "redfence:memory")?;
    Some(marker.rsplit_once('|')?.0.to_owned())
}

/// The Sentinel group's master flushed (`FLUSHALL`: every key gone, its marker too) while a
/// client was connected: that client does not count its vote, and neither does a fresh one
/// (a new process), which learns of the loss from the other servers' rosters. Server 1 is
/// held by another owner, so that no majority forms without the voter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_lost_its_memory_is_quarantined_for_a_fresh_client_too() {
    let group = SentinelGroup::start();
    let servers = Servers::start(2);
    let seen = client(&group, &servers);
    let lock = seen
        .try_acquire(&["warm"], TTL)
        .await
        .expect("a brand-new voter set grants at once");
    lock.release().await.expect("release");
    // Both other servers' rosters remember the master's marker.
    let (key, group_ref) = (roster_key(&group), &group);
    let remembered = || {
        let id = marker_id(group_ref);
        (0..2).all(|i| {
            let entry = servers.get(i, &key);
            matches!((entry, &id), (Some(entry), Some(id)) if entry.starts_with(&format!("{id}|")))
        })
    };
    assert!(eventually(remembered).await, "the rosters know the marker");

    group.servers.cmd::<()>(0, &["FLUSHALL"]);
    servers.cmd::<()>(0, &["SET", "job", "another-owner", "PX", "60000"]);
    // The connected client: it sees the marker gone (at the latest at its next reading).
    let deadline = Instant::now() + support::DEADLINE;
    let err = loop {
        let err = seen
            .try_acquire(&["job"], TTL)
            .await
            .expect_err("server 0 is held by another owner");
        if quarantined(&err) == vec![0] || Instant::now() > deadline {
            break err;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(quarantined(&err), vec![0], "the connected client: {err}");
    // A fresh client, which never saw the master before.
    let err = client(&group, &servers)
        .try_acquire(&["job"], TTL)
        .await
        .expect_err("the master lost its memory, server 0 is held");
    assert_eq!(quarantined(&err), vec![0], "a fresh client: {err}");
    assert!(err.to_string().contains("quarantined"), "{err}");
    // The failed attempts released their keys.
    assert!(
        eventually(|| group.servers.get(0, "job").is_none() && servers.get(1, "job").is_none())
            .await,
        "the refused attempts released"
    );
}

/// After a failover the voter follows the new master, and the grant it makes there does not
/// count: the new master is a new `run_id`, a restart for the quarantine. The key is still
/// written (and released, the attempt having failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_the_voters_grant_is_quarantined_as_a_restart() {
    let mut group = SentinelGroup::start();
    let redlock = Redlock::builder()
        .node(NodeAddr::sentinel(group.urls(), MASTER))
        .node_timeout(PATIENT)
        .retry_count(0)
        .build()
        .expect("config");
    let warm = redlock.try_acquire(&["warm"], TTL).await.expect("granted");
    warm.release().await.expect("release");

    group.kill_master();
    // Until the voter has asked the sentinels again, its calls fail on the dead master.
    let deadline = Instant::now() + support::DEADLINE;
    let err = loop {
        match redlock.try_acquire(&["job"], TTL).await {
            Ok(lock) => panic!("a new master counted at once: {}", lock.token()),
            Err(err) if quarantined(&err) == vec![0] || Instant::now() > deadline => break err,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let Error::QuorumUnreachable { errors, .. } = &err else {
        panic!("not a quorum failure: {err}");
    };
    assert!(
        matches!(errors[0].failure, NodeFailure::Quarantined { remaining } if remaining > Duration::from_secs(30)),
        "quarantined for about the period: {err}"
    );
    // Its key on the new master was released after the failed attempt.
    assert!(
        eventually(|| group.servers.get(1, "job").is_none()).await,
        "the refused attempt released on the new master"
    );
}
