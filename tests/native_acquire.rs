//! A plain single-key acquire goes to a node as one native `SET key token NX GET PX ttl`
//! beside the batch script, once a script call has succeeded on the connection: it is
//! granted, refused (and marks the key as waited for) or fails alone exactly as in the
//! script. (A user who may not run the scripts never gets a native lock it could not
//! release: `tests/acl.rs`.)

mod support;

use std::time::Duration;

use futures::future::join_all;
use redfence::{Error, NodeFailure};
use support::{Servers, TestRedlock, eventually};

const TTL: Duration = Duration::from_secs(30);

/// `command`'s calls on every server since the last `CONFIG RESETSTAT`.
fn calls(servers: &Servers, command: &str) -> Vec<u64> {
    (0..servers.len())
        .map(|i| servers.command_stat(i, command, "calls"))
        .collect()
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
    support::warm_up(&redlock).await;
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
    assert_eq!(calls(&servers, "evalsha"), [1, 1, 1]);
    for i in 0..3 {
        assert_eq!(servers.get(i, "job"), None, "node {i}");
    }
}

#[tokio::test]
async fn a_refused_native_acquire_marks_the_key_as_waited_for() {
    let servers = Servers::start(3);
    let redlock = servers.builder().retry_count(0).build().expect("config");
    support::warm_up(&redlock).await;
    let held = redlock.acquire(&["job"], TTL).await.expect("acquire");
    reset_stats(&servers);

    match redlock.try_acquire(&["job"], TTL).await {
        Err(Error::Contended { .. }) => {}
        other => panic!("the lock is held: {other:?}"),
    }
    assert!(
        calls(&servers, "set").iter().all(|&n| n >= 1),
        "refused natively: {:?}",
        calls(&servers, "set")
    );
    // The mark goes out with the node's next write: the release's own.
    assert!(
        eventually(|| (0..3).all(|i| servers.get(i, "job:redfence:waiting").is_some())).await,
        "every node marks the key as waited for"
    );
    // So the release deletes the mark with the key.
    held.release().await.expect("release");
    for i in 0..3 {
        assert!(
            servers.keys(i).is_empty(),
            "node {i}: {:?}",
            servers.keys(i)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_acquire_on_a_key_of_another_type_fails_alone() {
    let servers = Servers::start(3);
    let redlock = servers.builder().retry_count(0).build().expect("config");
    support::warm_up(&redlock).await;
    for i in 0..3 {
        let _: i64 = servers.cmd(i, &["HSET", "hash", "field", "value"]);
    }
    reset_stats(&servers);
    let results = join_all(["hash", "free:1", "free:2", "free:3"].map(|name| {
        let redlock = redlock.clone();
        async move { redlock.acquire(&[name], TTL).await }
    }))
    .await;
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
    let mut results = results.into_iter();
    match results.next() {
        Some(Err(Error::QuorumUnreachable { errors, .. })) => {
            assert_eq!(errors.len(), 3);
            for e in &errors {
                assert!(matches!(e.failure, NodeFailure::Reply(_)), "{e}");
                assert!(e.to_string().contains("WRONGTYPE"), "{e}");
            }
        }
        other => panic!("expected WRONGTYPE on every node, got {other:?}"),
    }
    for result in results {
        let lock = result.expect("its neighbours are granted");
        lock.release().await.expect("release");
    }
    for i in 0..3 {
        let kind: String = servers.cmd(i, &["TYPE", "hash"]);
        assert_eq!(kind, "hash", "node {i}: the hash is intact");
    }
}
