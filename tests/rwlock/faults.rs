//! Failures and limits: nodes down, bad input, keys of another type, restarts, Valkey 9's
//! plain commands beside the script, and 16 tasks mixing reads and writes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redfence::{Error, InvalidInput, Redlock};

use crate::support::{self, PATIENT, Servers, TestRedlock, eventually};
use crate::{READERS, TTL, WRITER, contended, invalid, readers, rwlock};

#[tokio::test]
async fn a_minority_down_works_and_a_majority_down_fails_with_the_quorum_error() {
    let mut servers = Servers::start(3);
    servers.kill(2);
    let redlock = servers.one_attempt(PATIENT);
    let lock = rwlock(&redlock);
    let read = lock
        .acquire_read(TTL)
        .await
        .expect("read with a majority up");
    read.release().await.expect("release");
    let write = lock
        .acquire_write(TTL)
        .await
        .expect("write with a majority up");
    assert!((0..2).all(|i| servers.get(i, WRITER).as_deref() == Some(write.token())));
    write.release().await.expect("release");
    servers.kill(1);
    for result in [
        lock.acquire_read(TTL).await.map(drop),
        lock.acquire_write(TTL).await.map(drop),
    ] {
        match result {
            Err(Error::QuorumUnreachable { granted, .. }) => assert!(granted <= 1),
            other => panic!("expected QuorumUnreachable, got {other:?}"),
        }
    }
    // The failed attempts left nothing on the node that granted.
    assert!(eventually(|| servers.get(0, WRITER).is_none() && readers(&servers, 0) == 0).await);
}

#[tokio::test]
async fn bad_input_is_refused_before_any_traffic() {
    let servers = Servers::start(1);
    let redlock = Redlock::builder()
        .node(servers.url(0))
        .build()
        .expect("config");
    assert_eq!(
        invalid(redlock.rwlock("")),
        InvalidInput::EmptyResource { index: 0 }
    );
    let long = "x".repeat(redfence::MAX_RESOURCE_LEN);
    assert!(matches!(
        invalid(redlock.rwlock(&long)),
        InvalidInput::ResourceTooLong { .. }
    ));
    let lock = rwlock(&redlock);
    assert!(matches!(
        invalid(lock.acquire_read(Duration::ZERO).await),
        InvalidInput::ZeroTtl { .. }
    ));
    assert!(matches!(
        invalid(lock.try_acquire_write(Duration::ZERO).await),
        InvalidInput::ZeroTtl { .. }
    ));
    assert!(matches!(
        invalid(lock.acquire_write(Duration::from_millis(2)).await),
        InvalidInput::TtlTooShort { .. }
    ));
    assert!(matches!(
        invalid(
            lock.using_write(Duration::from_millis(100), |_| async {
                Ok::<(), Error>(())
            })
            .await
        ),
        InvalidInput::TtlNotAboveThreshold { .. }
    ));
    assert!(servers.keys(0).is_empty(), "nothing was written");
    let commands: u64 =
        servers.command_stat(0, "evalsha", "calls") + servers.command_stat(0, "eval", "calls");
    assert_eq!(commands, 0, "no script ran");
}

/// A key of another type fails the operation on that node alone, with the server's error.
#[tokio::test]
async fn a_key_of_another_type_is_a_node_error() {
    let servers = Servers::start(3);
    let redlock = servers.one_attempt(PATIENT);
    let lock = rwlock(&redlock);
    for i in 0..2 {
        let _: () = servers.cmd(i, &["SET", READERS, "not a set"]);
    }
    match lock.try_acquire_read(TTL).await {
        Err(Error::QuorumUnreachable { errors, .. }) => {
            assert_eq!(errors.len(), 2);
            assert!(
                format!("{:?}", errors[0]).contains("WRONGTYPE"),
                "{errors:?}"
            );
        }
        other => panic!("expected QuorumUnreachable, got {other:?}"),
    }
    assert_eq!(servers.get(0, READERS).as_deref(), Some("not a set"));
}

/// 16 tasks mixing reads (3 in 4) and writes over 5 nodes: each records the window in which
/// its hold was valid, from when the acquisition returned to the earlier of its validity's
/// end and the start of its release. A writer's window never meets another window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_a_writer_beside_a_reader_or_another_writer() {
    const ROUNDS: usize = 6;
    let servers = Servers::start(5);
    let redlock = servers
        .builder()
        .node_timeout(PATIENT)
        .retry_count(100_000)
        .retry_delay(Duration::from_millis(2))
        .retry_jitter(Duration::from_millis(2))
        .build()
        .expect("config");
    let lock = rwlock(&redlock);
    let windows: Arc<Mutex<Vec<(Instant, Instant, bool)>>> = Arc::default();
    let tasks: Vec<_> = (0..16)
        .map(|task| {
            let (lock, windows) = (lock.clone(), Arc::clone(&windows));
            tokio::spawn(async move {
                for round in 0..ROUNDS {
                    let write = (task + round) % 4 == 0;
                    let (start, end) = if write {
                        let guard = lock.acquire_write(TTL).await.expect("write");
                        let start = Instant::now();
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        let end = Instant::now().min(guard.expires_at());
                        guard.release().await.expect("release");
                        (start, end)
                    } else {
                        let guard = lock.acquire_read(TTL).await.expect("read");
                        let start = Instant::now();
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        let end = Instant::now().min(guard.expires_at());
                        guard.release().await.expect("release");
                        (start, end)
                    };
                    windows.lock().expect("windows").push((start, end, write));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let windows = windows.lock().expect("windows").clone();
    assert_eq!(windows.len(), 16 * ROUNDS, "every task got every hold");
    let writes = windows.iter().filter(|w| w.2).count();
    assert!(writes >= 16, "{writes} writes");
    for (i, a) in windows.iter().enumerate() {
        for b in &windows[i + 1..] {
            if a.2 || b.2 {
                assert!(
                    a.1 <= b.0 || b.1 <= a.0,
                    "a writer beside another holder: {a:?} and {b:?}"
                );
            }
        }
    }
    // Readers did share the lock.
    let most = crate::support::most_at_once(
        windows
            .iter()
            .filter(|w| !w.2)
            .map(|&(start, end, _)| (start, end)),
    );
    assert!(most >= 2, "readers never held side by side ({most})");
}

/// On Valkey 9 (plain commands for a mutex), the read-write lock's operations still go in the
/// script and behave the same.
#[tokio::test]
async fn works_on_valkey_9_beside_plain_commands() {
    let servers = Servers::start_launched(3, &[], |_| support::valkey9());
    let redlock = servers.patient();
    // A mutex first, so that the links learn the server's plain commands.
    let mutex = redlock.acquire(&["m"], TTL).await.expect("mutex");
    mutex.release().await.expect("release");
    let lock = rwlock(&redlock);
    let a = lock.acquire_read(TTL).await.expect("a");
    let b = lock.acquire_read(TTL).await.expect("b");
    contended(lock.try_acquire_write(TTL).await, "a writer beside readers");
    drop((a, b));
    assert!(eventually(|| (0..3).all(|i| readers(&servers, i) == 0)).await);
    let write = lock.try_acquire_write(TTL).await.expect("writer");
    contended(
        lock.try_acquire_read(TTL).await,
        "a reader beside the writer",
    );
    write.release().await.expect("release");
}

/// A restarted node forgets the writer; its grant of a reader does not count while it is
/// quarantined (as for a mutex), so no reader gets in beside the writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_nodes_grant_does_not_count_during_its_quarantine() {
    let mut servers = Servers::start(5);
    let reader = servers
        .builder()
        .retry_count(0)
        .node_timeout(PATIENT)
        .build()
        .expect("config");
    support::warm_up(&reader).await; // it knows every node's run_id
    for i in [3, 4] {
        let _: () = servers.cmd(i, &["SET", WRITER, "other", "PX", "1000"]);
    }
    let writer = servers
        .builder()
        .restart_quarantine(Duration::ZERO)
        .retry_count(0)
        .node_timeout(PATIENT)
        .build()
        .expect("config");
    let write = rwlock(&writer)
        .try_acquire_write(Duration::from_secs(30))
        .await
        .expect("the writer on nodes 0-2");
    assert_eq!(servers.holders(WRITER, write.token(), 0..5), vec![0, 1, 2]);
    assert!(eventually(|| (3..5).all(|i| servers.get(i, WRITER).is_none())).await);
    servers.restart(2);
    match rwlock(&reader).try_acquire_read(TTL).await {
        Err(Error::QuorumUnreachable { errors, .. }) => {
            let quarantined: Vec<usize> = errors
                .iter()
                .filter(|e| matches!(e.failure, redfence::NodeFailure::Quarantined { .. }))
                .map(|e| e.index)
                .collect();
            assert_eq!(quarantined, vec![2], "{errors:?}");
        }
        other => panic!("expected QuorumUnreachable (node 2 quarantined), got {other:?}"),
    }
    assert!(
        eventually(|| (2..5).all(|i| readers(&servers, i) == 0)).await,
        "the failed read was released"
    );
    assert!(!write.is_expired());
    write.release().await.expect("release");
}
