//! The restart quarantine by memory, with **default settings** and **fresh clients** (a new
//! `Redlock`, as every new process makes): a voter that lost any of its memory (a restart
//! without persistence, `FLUSHALL`, a reload of an old snapshot, a step of its clock) does not
//! count toward a majority, for a client that never saw it happen; a brand-new voter set grants
//! at once. Real servers, three of them.

#[path = "../support/mod.rs"]
mod support;

mod plain_rerun;
mod review;

use std::time::Duration;

use redfence::{Error, Lock, NodeFailure};
use review::{assert_quarantined, fresh, rosters_current};
use support::faketime::{Clocks, Pieces};
use support::{Servers, TestRedlock, eventually, warm_up};

const RES: &str = "ledger:memory";
const TTL: Duration = Duration::from_secs(20);

/// A, a client with default settings, holds `RES` on all three servers (a brand-new voter
/// set, which grants at once), and the rosters remember every marker.
async fn a_holds(servers: &Servers) -> Lock {
    let a = fresh(servers);
    let lock = a
        .try_acquire(&[RES], TTL)
        .await
        .expect("a new voter set grants at once");
    let everywhere = eventually(|| servers.holders(RES, lock.token(), 0..3) == vec![0, 1, 2]);
    assert!(everywhere.await, "A holds on every server");
    rosters_current(servers).await;
    lock
}

/// How old server `i`'s marker is, by its own clock.
fn marker_age(servers: &Servers, i: usize) -> Duration {
    let marker = servers.get(i, "redfence:memory").expect("a marker");
    let made: u64 = marker
        .rsplit_once('|')
        .and_then(|(_, ms)| ms.parse().ok())
        .expect("id|ms");
    let (secs, micros): (u64, u64) = servers.cmd(i, &["TIME"]);
    Duration::from_millis((secs * 1000 + micros / 1000).saturating_sub(made))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brand_new_voter_set_grants_the_first_lock_at_once() {
    let servers = Servers::start(3);
    let lock = fresh(&servers)
        .try_acquire(&[RES], TTL)
        .await
        .expect("no client ever locked here: nothing can have been forgotten");
    lock.release().await.expect("release");
    rosters_current(&servers).await;
    // A second fresh client finds the markers first seen, not replaced: it grants too.
    let lock = fresh(&servers)
        .try_acquire(&[RES], TTL)
        .await
        .expect("grants");
    lock.release().await.expect("release");
}

/// The first finding: a fresh process granted a lock another one still held, after
/// nodes 1 and 2 restarted without persistence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_client_is_refused_after_a_majority_restart() {
    let mut servers = Servers::start(3);
    let a = a_holds(&servers).await;
    servers.restart(1);
    servers.restart(2);
    assert_eq!(servers.holders(RES, a.token(), 0..3), vec![0]);

    let err = fresh(&servers)
        .try_acquire(&[RES], Duration::from_secs(5))
        .await
        .expect_err("nodes 1 and 2 forgot A's lock");
    assert_quarantined(&err, &[1, 2]);
    assert!(!a.is_expired());
    // The refused attempt released what it wrote on the quarantined nodes.
    assert!(
        eventually(|| (1..3).all(|i| servers.get(i, RES).is_none())).await,
        "the failed attempt released its keys"
    );
    // Without the quarantine, the same fresh client is a second owner: what it prevents.
    let reckless = servers.unquarantined();
    let second = reckless
        .try_acquire(&[RES], Duration::from_secs(5))
        .await
        .expect("two owners without the quarantine");
    assert!(!a.is_expired(), "A still holds: two valid owners");
    second.release().await.expect("release");
}

/// A flush loses memory as a restart does, but the `run_id` stays and no connection drops: the
/// markers tell it, to a fresh client and to one that was connected (in its next batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_on_a_majority_is_quarantined_for_every_client() {
    flush_a_majority(Servers::start(3), "FLUSHALL").await;
}

/// The same with `FLUSHDB`, where a one-key lock is plain commands (Valkey 9): the marker is
/// read in the batch's pipeline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushdb_on_a_majority_is_quarantined_on_plain_commands() {
    flush_a_majority(
        Servers::start_launched(3, &[], |_| support::valkey9()),
        "FLUSHDB",
    )
    .await;
}

async fn flush_a_majority(servers: Servers, flush: &str) {
    let connected = fresh(&servers);
    warm_up(&connected).await;
    let a = a_holds(&servers).await;
    for i in [1, 2] {
        let _: () = servers.cmd(i, &[flush]);
    }
    let err = fresh(&servers)
        .try_acquire(&[RES], Duration::from_secs(5))
        .await
        .expect_err("nodes 1 and 2 forgot A's lock");
    assert_quarantined(&err, &[1, 2]);
    // The connected client at once: its batches read the markers (it last read the servers
    // less than a second ago, before the flush).
    let err = connected
        .try_acquire(&[RES], Duration::from_secs(5))
        .await
        .expect_err("the connected client sees the markers gone");
    assert_quarantined(&err, &[1, 2]);
    assert!(!a.is_expired());
    a.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_restart_costs_only_that_voters_vote() {
    let mut servers = Servers::start(3);
    a_holds(&servers).await.release().await.expect("release");
    servers.restart(2);
    // A free resource: nodes 0 and 1 are a majority, node 2's grant does not count.
    let lock = fresh(&servers)
        .try_acquire(&["free"], TTL)
        .await
        .expect("two voters of three are a majority");
    lock.release().await.expect("release");
    // With node 0 held by another owner, node 2's vote would be the deciding one: refused.
    let _: () = servers.cmd(0, &["SET", RES, "other", "PX", "20000"]);
    let err = fresh(&servers)
        .try_acquire(&[RES], Duration::from_secs(5))
        .await
        .expect_err("node 2 is quarantined");
    assert_quarantined(&err, &[2]);
}

/// A majority restarted from an RDB snapshot taken before the lock: the snapshot has the
/// markers (and the rosters), not the lock. Quarantined for fresh and connected clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_reloaded_from_an_older_snapshot_is_quarantined() {
    let mut servers = Servers::start(3);
    let connected = fresh(&servers);
    warm_up(&connected).await;
    rosters_current(&servers).await;
    // A server's uptime is in whole seconds: a marker made in the second or two before its
    // start cannot be told from one made just after it. Real markers are days old.
    let aged = eventually(|| (0..2).all(|i| marker_age(&servers, i) > Duration::from_millis(2500)));
    assert!(aged.await, "the markers age");
    for i in [0, 1] {
        let _: () = servers.cmd(i, &["SAVE"]);
    }
    let a = fresh(&servers).try_acquire(&[RES], TTL).await.expect("A");
    servers.restart(0);
    servers.restart(1);
    assert_eq!(servers.holders(RES, a.token(), 0..3), vec![2]);
    assert!(
        servers.get(0, "redfence:memory").is_some(),
        "the marker was reloaded"
    );

    let err = fresh(&servers)
        .try_acquire(&[RES], Duration::from_secs(5))
        .await
        .expect_err("nodes 0 and 1 reloaded a snapshot older than A's lock");
    assert_quarantined(&err, &[0, 1]);
    let err = connected
        .try_acquire(&[RES], Duration::from_secs(5))
        .await
        .expect_err("the connected client saw the restarts");
    assert_quarantined(&err, &[0, 1]);
    assert!(!a.is_expired());
}

/// K = 2 permits held by A; nodes 1 and 2 restart and forget the slots and the size. A fresh
/// client gets no permit: there are never more than K holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_never_exceeds_its_permits_through_a_majority_restart() {
    let mut servers = Servers::start(3);
    let a = fresh(&servers);
    let sem = a.semaphore("pool", 2).expect("semaphore");
    let first = sem.try_acquire(TTL).await.expect("permit 1");
    let second = sem.try_acquire(TTL).await.expect("permit 2");
    rosters_current(&servers).await;
    servers.restart(1);
    servers.restart(2);

    let b = fresh(&servers);
    let sem_b = b.semaphore("pool", 2).expect("semaphore");
    for attempt in 0..2 {
        match sem_b.try_acquire(Duration::from_secs(5)).await {
            Err(Error::QuorumUnreachable { errors, .. }) => assert!(
                errors
                    .iter()
                    .any(|e| matches!(e.failure, NodeFailure::Quarantined { .. })),
                "attempt {attempt}: {errors:?}"
            ),
            Err(other) => panic!("attempt {attempt}: {other}"),
            Ok(_) => panic!("attempt {attempt}: a third holder of a 2-permit semaphore"),
        }
    }
    assert!(!first.is_expired() && !second.is_expired());
}

/// A server whose clock steps forward (its expiries were wrong) is quarantined by a client
/// that watched it, which replaces its marker: a fresh client sees the loss too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_whose_clock_steps_is_quarantined() {
    let (servers, clocks) = match Pieces::find() {
        Ok(pieces) => Clocks::start(&pieces, 3, &[]),
        Err(missing) => {
            eprintln!("skipping a_voter_whose_clock_steps_is_quarantined: missing {missing}");
            return;
        }
    };
    let connected = fresh(&servers);
    warm_up(&connected).await;
    rosters_current(&servers).await;
    clocks.jump(2, Duration::from_secs(30));
    // Node 0 held by another owner: node 2's vote decides.
    let _: () = servers.cmd(0, &["SET", RES, "other", "PX", "60000"]);
    // A connected client reads a server's clock beside a call once a second: the step shows
    // in the first reading a second after the last one.
    node_2_quarantined_for_both(&connected, &servers, "node 2's clock stepped").await;
}

/// A server that evicted keys (a `maxmemory` reached under a policy that evicts keys with a
/// TTL, as lock keys have) is quarantined by a client that read it before and after, which
/// replaces its marker (kept: it has no TTL): a fresh client sees the loss too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voter_that_evicted_keys_is_quarantined() {
    let servers = Servers::start(3);
    let connected = fresh(&servers);
    warm_up(&connected).await;
    rosters_current(&servers).await;
    // Node 2 short of memory: keys with a TTL are evicted to make room.
    let used = |i: usize| -> u64 {
        let info: String = servers.cmd(i, &["INFO", "memory"]);
        info.lines()
            .find_map(|line| line.strip_prefix("used_memory:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("used_memory")
    };
    let limit = (used(2) + 512 * 1024).to_string();
    let _: () = servers.cmd(2, &["CONFIG", "SET", "maxmemory-policy", "volatile-random"]);
    let _: () = servers.cmd(2, &["CONFIG", "SET", "maxmemory", &limit]);
    let filler = "x".repeat(64 * 1024);
    let evicted = |i: usize| -> u64 {
        let info: String = servers.cmd(i, &["INFO", "stats"]);
        info.lines()
            .find_map(|line| line.strip_prefix("evicted_keys:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("evicted_keys")
    };
    for n in 0..64 {
        let _: () = servers.cmd(2, &["SET", &format!("filler:{n}"), &filler, "PX", "60000"]);
    }
    assert!(evicted(2) > 0, "node 2 evicted keys");
    let _: () = servers.cmd(2, &["CONFIG", "SET", "maxmemory", "0"]);
    assert!(
        servers.get(2, "redfence:memory").is_some(),
        "the marker has no TTL: kept"
    );
    // Node 0 held by another owner: node 2's vote decides. The evictions show in the first
    // reading a second after the last one.
    let _: () = servers.cmd(0, &["SET", RES, "other", "PX", "60000"]);
    node_2_quarantined_for_both(&connected, &servers, "node 2 evicted keys").await;
}

/// Node 2 saw a loss its marker survived (`why`): the connected client quarantines it in the
/// first reading a second after its last one (the signs need `INFO`), and replaces its marker,
/// so that a fresh client quarantines it too. Node 0 is held by another owner, so node 2's vote
/// decides.
async fn node_2_quarantined_for_both(connected: &redfence::Redlock, servers: &Servers, why: &str) {
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let err = connected
        .try_acquire(&[RES], Duration::from_secs(5))
        .await
        .expect_err(why);
    assert_quarantined(&err, &[2]);
    let err = fresh(servers)
        .try_acquire(&[RES], Duration::from_secs(5))
        .await
        .expect_err("node 2's marker was replaced: a fresh client quarantines it too");
    assert_quarantined(&err, &[2]);
}
