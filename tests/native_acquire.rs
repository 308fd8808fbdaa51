//! A plain single-key acquire goes to a node as one native `SET key token NX GET PX ttl`
//! beside the batch script, once a script call has succeeded on the connection: it is
//! granted, refused (and marks the key as waited for) or fails alone exactly as in the
//! script. (A user who may not run the scripts never gets a native lock it could not
//! release: `tests/acl.rs`.)

mod support;

use std::time::Duration;

use redfence::{Error, NodeFailure};
use support::{Servers, TestRedlock, eventually};

const TTL: Duration = Duration::from_secs(30);

/// `command`'s calls on every server since the last `CONFIG RESETSTAT`.
fn calls(servers: &Servers, command: &str) -> Vec<u64> {
    (0..servers.len())
        .map(|i| servers.command_stat(i, command, "calls"))
        .collect()
}

/// Warms `redlock` up until every node's connection has passed the probe: an acquire goes
/// to every node without a script call. (A probe can be inconclusive, e.g. when the first
/// call timed out while connecting: the next batches carry it again.)
async fn natives_on(redlock: &redfence::Redlock, servers: &Servers) {
    support::warm_up(redlock).await;
    let deadline = std::time::Instant::now() + support::DEADLINE;
    for n in 0.. {
        let lock = redlock
            .acquire(&[format!("probe:{n}")], TTL)
            .await
            .expect("acquire");
        lock.release().await.expect("release");
        reset_stats(servers);
        let lock = redlock
            .acquire(&[format!("check:{n}")], TTL)
            .await
            .expect("acquire");
        let sets = eventually(|| calls(servers, "set").iter().all(|&n| n >= 1)).await;
        let scripts = calls(servers, "evalsha");
        lock.release().await.expect("release");
        if sets && scripts.iter().all(|&n| n == 0) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "natives never came on: {scripts:?}"
        );
    }
}

fn reset_stats(servers: &Servers) {
    for i in 0..servers.len() {
        servers.cmd::<()>(i, &["CONFIG", "RESETSTAT"]);
    }
}

#[tokio::test]
async fn once_a_script_ran_a_plain_acquire_is_one_native_set_per_node() {
    let servers = Servers::start(3);
    let redlock = servers.redlock();
    natives_on(&redlock, &servers).await;
    reset_stats(&servers);

    let lock = redlock.acquire(&["job"], TTL).await.expect("acquire");
    // (The last node may answer after the majority.)
    assert!(
        eventually(|| calls(&servers, "set") == [1, 1, 1]).await,
        "one native SET per node: {:?}",
        calls(&servers, "set")
    );
    assert_eq!(calls(&servers, "evalsha"), [0, 0, 0], "no script for it");
    for i in 0..3 {
        assert_eq!(servers.get(i, "job").as_deref(), Some(lock.token()));
        let pttl: i64 = servers.cmd(i, &["PTTL", "job"]);
        assert!(pttl > 0 && pttl <= 30_000, "node {i}: PTTL {pttl}");
    }
    // The release is the script's (compare and delete).
    lock.release().await.expect("release");
    assert!(eventually(|| calls(&servers, "evalsha") == [1, 1, 1]).await);
    assert!(eventually(|| (0..3).all(|i| servers.get(i, "job").is_none())).await);
}

#[tokio::test]
async fn a_refused_native_acquire_marks_the_key_as_waited_for() {
    let servers = Servers::start(3);
    let redlock = servers.builder().retry_count(0).build().expect("config");
    natives_on(&redlock, &servers).await;
    let held = redlock.acquire(&["job"], TTL).await.expect("acquire");
    reset_stats(&servers);

    match redlock.try_acquire(&["job"], TTL).await {
        Err(Error::Contended { .. }) => {}
        other => panic!("the lock is held: {other:?}"),
    }
    assert!(
        eventually(|| calls(&servers, "set").iter().all(|&n| n >= 1)).await,
        "refused natively: {:?}",
        calls(&servers, "set")
    );
    assert_eq!(
        calls(&servers, "evalsha"),
        [0, 0, 0],
        "no script for the refusal"
    );
    // The mark goes out after the refusal, with the node's next write (at once when idle).
    assert!(
        eventually(|| (0..3).all(|i| servers.get(i, "job:redfence:waiting").is_some())).await,
        "every node marks the key as waited for"
    );
    for i in 0..3 {
        assert_eq!(servers.get(i, "job:redfence:waiting").as_deref(), Some("1"));
        let pttl: i64 = servers.cmd(i, &["PTTL", "job:redfence:waiting"]);
        assert!(pttl > 20_000, "node {i}: the waiter's TTL, {pttl} ms left");
    }
    // So the release deletes the mark with the key.
    held.release().await.expect("release");
    assert!(
        eventually(|| (0..3).all(|i| servers.keys(i).is_empty())).await,
        "{:?}",
        (0..3).map(|i| servers.keys(i)).collect::<Vec<_>>()
    );
}

// A current-thread runtime: every request of the `join!` is queued before the node queues
// run, so they share one write per node (natives, then the script call).
#[tokio::test]
async fn a_native_acquire_on_a_key_of_another_type_fails_alone_in_a_shared_write() {
    let servers = Servers::start(3);
    let redlock = servers.builder().retry_count(0).build().expect("config");
    natives_on(&redlock, &servers).await;
    let held = redlock.acquire(&["held"], TTL).await.expect("acquire");
    for i in 0..3 {
        let _: i64 = servers.cmd(i, &["HSET", "hash", "field", "value"]);
    }
    reset_stats(&servers);
    let (hash, free, other, released) = tokio::join!(
        redlock.acquire(&["hash"], TTL),
        redlock.acquire(&["free:1"], TTL),
        redlock.acquire(&["free:2"], TTL),
        held.release(), // a script operation in the same write
    );
    match hash {
        Err(Error::QuorumUnreachable { errors, .. }) => {
            assert_eq!(errors.len(), 3);
            for e in &errors {
                assert!(matches!(e.failure, NodeFailure::Reply(_)), "{e}");
                assert!(e.to_string().contains("WRONGTYPE"), "{e}");
            }
        }
        other => panic!("expected WRONGTYPE on every node, got {other:?}"),
    }
    let failed = || {
        (0..3)
            .map(|i| servers.command_stat(i, "set", "failed_calls"))
            .collect::<Vec<_>>()
    };
    assert!(
        eventually(|| failed() == [1, 1, 1]).await,
        "the native SET on the hash failed: {:?}",
        failed()
    );
    released.expect("the release beside it");
    for lock in [free, other] {
        let lock = lock.expect("its neighbours are granted");
        for i in 0..3 {
            let key = &lock.resources()[0];
            assert!(
                eventually(|| servers.get(i, key).as_deref() == Some(lock.token())).await,
                "node {i}: {key}"
            );
        }
        lock.release().await.expect("release");
    }
    for i in 0..3 {
        let kind: String = servers.cmd(i, &["TYPE", "hash"]);
        assert_eq!(kind, "hash", "node {i}: the hash is intact");
        assert!(
            eventually(|| servers.get(i, "held").is_none()).await,
            "node {i}"
        );
    }
}

#[tokio::test]
async fn after_a_script_flush_natives_and_the_script_in_one_write_both_run() {
    let servers = Servers::start(3);
    let redlock = servers.redlock();
    natives_on(&redlock, &servers).await;
    let held = redlock.acquire(&["held"], TTL).await.expect("acquire");
    for i in 0..3 {
        servers.cmd::<()>(i, &["SCRIPT", "FLUSH"]);
    }
    reset_stats(&servers);
    let (lock, released) = tokio::join!(redlock.acquire(&["job"], TTL), held.release());
    let lock = lock.expect("the native acquire");
    released.expect("the release, after NOSCRIPT and a reload");
    for i in 0..3 {
        assert!(
            eventually(|| servers.get(i, "job").as_deref() == Some(lock.token())).await,
            "node {i}"
        );
        assert!(
            eventually(|| servers.get(i, "held").is_none()).await,
            "node {i}"
        );
        let (_, failed) = servers.evalsha_stats(i);
        assert!(
            servers.command_stat(i, "evalsha", "rejected_calls") + failed >= 1,
            "node {i}: the script call met NOSCRIPT first"
        );
    }
    lock.release().await.expect("release");
}

#[tokio::test]
async fn once_evalsha_is_revoked_a_failed_script_call_stops_the_natives() {
    let servers = Servers::start(3);
    let redlock = servers.builder().retry_count(0).build().expect("config");
    natives_on(&redlock, &servers).await;
    for i in 0..3 {
        servers.cmd::<()>(i, &["ACL", "SETUSER", "default", "-evalsha"]);
    }
    // Nothing tells the connections yet: a native acquire is still granted...
    let lock = redlock.acquire(&["first"], TTL).await.expect("native");
    // ...but its release is a script call, refused: natives stop there, and the lock's keys
    // are left to their TTL (the cost of revoking a permission under a running client; so is
    // a native that shares a write with a refused script call).
    let _ = lock.release().await;
    let refused = || (0..3).all(|i| servers.command_stat(i, "evalsha", "rejected_calls") >= 1);
    assert!(eventually(refused).await, "every node refused the release");
    let err = redlock
        .acquire(&["second"], TTL)
        .await
        .expect_err("scripts only now, and refused");
    match &err {
        Error::QuorumUnreachable { errors, .. } => {
            assert!(
                errors
                    .iter()
                    .all(|e| matches!(e.failure, NodeFailure::Permission(_))),
                "{err}"
            );
        }
        other => panic!("expected the permission error, got {other:?}"),
    }
    for i in 0..3 {
        assert_eq!(servers.get(i, "second"), None, "node {i}");
    }
}
