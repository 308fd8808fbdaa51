//! Acquire, extend and release against five real redis-server processes.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redfence::{Error, LossReason, NodeFailure};
use support::{PATIENT, Servers, TestRedlock, eventually};

const TTL: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_never_hold_the_same_resource_together() {
    let servers = Servers::start(5);
    let redlock = servers
        .builder()
        .retry_count(10_000)
        .retry_delay(Duration::from_millis(2))
        .retry_jitter(Duration::from_millis(2))
        .build()
        .expect("config");
    let holders = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    let entered = Arc::new(AtomicUsize::new(0));
    const ROUNDS: usize = 10;

    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let redlock = redlock.clone();
            let (holders, violations, entered) =
                (holders.clone(), violations.clone(), entered.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let lock = redlock.acquire(&["ledger"], TTL).await.expect("acquire");
                    if holders.fetch_add(1, Ordering::SeqCst) != 0 {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    entered.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    holders.fetch_sub(1, Ordering::SeqCst);
                    lock.release().await.expect("release");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(violations.load(Ordering::SeqCst), 0, "two holders at once");
    assert_eq!(entered.load(Ordering::SeqCst), 16 * ROUNDS);
    assert!(eventually(|| (0..5).all(|i| servers.keys(i).is_empty())).await);
}

#[tokio::test]
async fn keys_and_values_are_wire_compatible() {
    let servers = Servers::start(5);
    // Patient: every node's write must land (a call that times out before it is written is
    // never sent, and a cold connection on a loaded machine can take longer than 50 ms).
    let redlock = servers.patient();
    let lock = redlock
        .acquire(&["invoice:4821"], TTL)
        .await
        .expect("acquire");
    assert_eq!(lock.token().len(), 32);
    // The key is the resource name, the value the token, on every node, with the TTL set.
    assert!(eventually(|| servers.holders("invoice:4821", lock.token(), 0..5).len() == 5).await);
    for i in 0..5 {
        assert_eq!(
            servers.get(i, "invoice:4821").as_deref(),
            Some(lock.token())
        );
        let pttl = servers.pttl(i, "invoice:4821");
        assert!(pttl > 4_000 && pttl <= 5_000, "node {i}: PTTL {pttl}");
    }
    assert!(lock.remaining() <= TTL && lock.remaining() > Duration::from_secs(4));

    // A second lock gets a fresh token.
    let other = redlock
        .acquire(&["invoice:4822"], TTL)
        .await
        .expect("acquire");
    assert_ne!(other.token(), lock.token());
    lock.release().await.expect("release");
    other.release().await.expect("release");
    // Release returns once a majority answered; the rest follow in the background.
    assert!(eventually(|| (0..5).all(|i| servers.keys(i).is_empty())).await);

    // With a prefix, the key is prefix + resource.
    let prefixed = servers
        .builder()
        .node_timeout(PATIENT)
        .key_prefix("locks:")
        .build()
        .expect("config");
    let lock = prefixed.acquire(&["job"], TTL).await.expect("acquire");
    assert!(eventually(|| servers.holders("locks:job", lock.token(), 0..5).len() == 5).await);
    assert!(servers.on_every_node("job", Option::is_none));
    lock.release().await.expect("release");
}

#[tokio::test]
async fn a_foreign_lock_in_the_node_redlock_format_excludes_us() {
    let servers = Servers::start(3);
    // What node-redlock or redsync would write: SET key token NX PX ttl on a majority.
    for i in 0..2 {
        let _: () = servers.cmd(i, &["SET", "report", "their-token", "PX", "5000"]);
    }
    // Both refusals count (denied: 2), on new connections.
    let redlock = servers.patient();
    let err = redlock
        .try_acquire(&["report"], TTL)
        .await
        .expect_err("held by them");
    assert!(
        matches!(
            err,
            Error::Contended {
                denied: 2,
                nodes: 3,
                ..
            }
        ),
        "{err:?}"
    );
    // Their keys are untouched; ours on the free node was released.
    assert_eq!(servers.get(0, "report").as_deref(), Some("their-token"));
    assert!(eventually(|| servers.get(2, "report").is_none()).await);
}

#[tokio::test]
async fn multi_resource_locks_are_all_or_nothing() {
    let servers = Servers::start(5);
    // Patient: every node must take the first lock (on a loaded machine a first connection
    // can outlast a short node timeout, and that node's acquire is then dropped).
    let redlock = servers.patient();
    let ab = redlock
        .acquire(&["a", "b"], TTL)
        .await
        .expect("acquire a,b");
    assert_eq!(ab.resources(), ["a".to_string(), "b".to_string()]);
    assert!(eventually(|| servers.holders("b", ab.token(), 0..5).len() == 5).await);

    let err = redlock
        .try_acquire(&["b", "c"], TTL)
        .await
        .expect_err("b is held");
    assert!(matches!(err, Error::Contended { .. }), "{err:?}");
    // The failed attempt left nothing behind: c is free on every node.
    for i in 0..5 {
        assert_eq!(servers.get(i, "c"), None, "node {i} kept c");
        assert_eq!(
            servers.get(i, "b").as_deref(),
            Some(ab.token()),
            "node {i} lost b"
        );
    }
    let c = redlock.try_acquire(&["c"], TTL).await.expect("c is free");
    c.release().await.expect("release");
    ab.release().await.expect("release");
    let bc = redlock
        .try_acquire(&["b", "c"], TTL)
        .await
        .expect("b,c now free");
    bc.release().await.expect("release");
}

#[tokio::test]
async fn contention_gives_up_after_the_retries_with_the_attempt_count() {
    let servers = Servers::start(3);
    let redlock = servers.builder().retry_count(3).build().expect("config");
    let held = redlock.acquire(&["r"], TTL).await.expect("acquire");
    let err = redlock.acquire(&["r"], TTL).await.expect_err("held");
    assert!(
        matches!(err, Error::Contended { attempts: 4, .. }),
        "{err:?}"
    );
    assert!(err.is_retryable());
    held.release().await.expect("release");
}

#[tokio::test]
async fn acquire_waits_for_a_release() {
    let servers = Servers::start(3);
    let redlock = servers.redlock();
    let held = redlock.acquire(&["r"], TTL).await.expect("acquire");
    let waiter = {
        let redlock = redlock.clone();
        tokio::spawn(async move { redlock.acquire(&["r"], TTL).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished());
    held.release().await.expect("release");
    let lock = waiter
        .await
        .expect("task")
        .expect("acquired after the release");
    lock.release().await.expect("release");
}

#[tokio::test]
async fn acquire_timeout_bounds_the_whole_call() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .retry_count(u32::MAX)
        .acquire_timeout(Duration::from_millis(300))
        .build()
        .expect("config");
    let held = redlock.acquire(&["r"], TTL).await.expect("acquire");
    let started = std::time::Instant::now();
    let err = redlock.acquire(&["r"], TTL).await.expect_err("held");
    let waited = started.elapsed();
    match &err {
        Error::AcquireTimeout {
            attempts,
            last: Some(last),
            ..
        } => {
            assert!(*attempts > 1);
            assert!(matches!(**last, Error::Contended { .. }), "{last:?}");
        }
        other => panic!("expected AcquireTimeout, got {other:?}"),
    }
    assert!(waited < Duration::from_secs(2), "took {waited:?}");
    held.release().await.expect("release");
}

#[tokio::test]
async fn absurd_retry_delays_neither_panic_nor_collapse() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .retry_delay(Duration::MAX)
        .retry_jitter(Duration::MAX)
        .acquire_timeout(Duration::from_millis(300))
        .build()
        .expect("config");
    let held = redlock.acquire(&["r"], TTL).await.expect("acquire");
    // The first retry's delay would end centuries after the deadline: give up at once,
    // after one attempt, instead of panicking on the Instant or retrying in a tight loop.
    let err = redlock.acquire(&["r"], TTL).await.expect_err("held");
    assert!(
        matches!(err, Error::AcquireTimeout { attempts, .. } if attempts <= 2),
        "{err:?}"
    );
    held.release().await.expect("release");
}

#[tokio::test]
async fn a_late_release_never_deletes_the_next_owners_lock() {
    let servers = Servers::start(5);
    let redlock = servers.redlock();
    let first = redlock
        .acquire(&["job"], Duration::from_millis(100))
        .await
        .expect("acquire");
    assert!(eventually(|| servers.on_every_node("job", Option::is_none)).await);
    assert!(first.is_expired());

    let second = redlock
        .acquire(&["job"], TTL)
        .await
        .expect("acquire after expiry");
    // The first owner wakes up and releases: not an error, and the second lock stays.
    first
        .release()
        .await
        .expect("releasing an expired lock is fine");
    // Both calls return at the majority: wait for the last nodes' calls (a key the late
    // release deleted would never come back).
    let held_everywhere =
        || servers.on_every_node("job", |value| value.as_deref() == Some(second.token()));
    assert!(
        eventually(held_everywhere).await,
        "the second owner's key on every node"
    );
    second.release().await.expect("release");
}

#[tokio::test]
async fn only_the_owner_can_extend() {
    let servers = Servers::start(5);
    let redlock = servers.redlock();
    let mut lock = redlock
        .acquire(&["job"], Duration::from_millis(500))
        .await
        .expect("acquire");
    let before = lock.expires_at();
    lock.extend(TTL).await.expect("the owner extends");
    assert!(lock.expires_at() > before + Duration::from_secs(3));
    assert_eq!(lock.ttl(), TTL);
    // A majority was extended before `extend` returned; the stragglers follow.
    assert!((0..5).filter(|&i| servers.pttl(i, "job") > 4_000).count() >= 3);
    assert!(eventually(|| (0..5).all(|i| servers.pttl(i, "job") > 4_000)).await);

    // Another owner took three nodes (as if our keys had expired there): extend refuses and
    // touches none of their keys.
    for i in 0..3 {
        let _: () = servers.cmd(i, &["SET", "job", "someone-else", "PX", "2000"]);
    }
    let err = lock.extend(TTL).await.expect_err("not ours any more");
    assert!(
        // Decided by the first three refusals: at most the two others confirmed in time.
        matches!(
            err,
            Error::LockLost {
                reason: LossReason::NotHeld {
                    confirmed: 0..=2,
                    quorum: 3
                },
                ..
            }
        ),
        "{err:?}"
    );
    for i in 0..3 {
        assert!(
            servers.pttl(i, "job") <= 2_000,
            "node {i}: their TTL was changed"
        );
        assert_eq!(servers.get(i, "job").as_deref(), Some("someone-else"));
    }
    // A failed extension released nothing: our two keys are still there.
    assert_eq!(servers.holders("job", lock.token(), 3..5), vec![3, 4]);
    lock.release().await.expect("release");
    assert_eq!(servers.get(0, "job").as_deref(), Some("someone-else"));
    assert!(
        eventually(|| servers.get(3, "job").is_none() && servers.get(4, "job").is_none()).await
    );
}

#[tokio::test]
async fn an_expired_lock_cannot_be_extended() {
    let servers = Servers::start(3);
    let redlock = servers.redlock();
    let mut lock = redlock
        .acquire(&["job"], Duration::from_millis(50))
        .await
        .expect("acquire");
    assert!(eventually(|| lock.is_expired()).await);
    let err = lock.extend(TTL).await.expect_err("expired");
    assert!(
        matches!(
            err,
            Error::LockLost {
                reason: LossReason::Expired,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_lock_lost());
}

#[tokio::test]
async fn a_dropped_lock_releases_itself() {
    let servers = Servers::start(3);
    let redlock = servers.redlock();
    let lock = redlock.acquire(&["job"], TTL).await.expect("acquire");
    // Held on a majority (the last node may still be on its way).
    assert!(servers.holders("job", lock.token(), 0..3).len() >= 2);
    drop(lock);
    assert!(eventually(|| servers.on_every_node("job", Option::is_none)).await);
}

#[tokio::test]
async fn a_key_of_another_type_is_a_node_error_not_a_panic() {
    let servers = Servers::start(5);
    let redlock = servers.one_attempt(PATIENT);
    // Someone stored a hash at the key on three nodes.
    for i in 0..3 {
        let _: i64 = servers.cmd(i, &["HSET", "job", "field", "value"]);
    }
    let err = redlock
        .acquire(&["other", "job"], TTL)
        .await
        .expect_err("wrong type");
    match &err {
        Error::QuorumUnreachable { errors, .. } => {
            assert_eq!(errors.len(), 3);
            for e in errors {
                assert!(matches!(e.failure, NodeFailure::Reply(_)), "{e}");
                assert!(e.to_string().contains("WRONGTYPE"), "{e}");
            }
        }
        other => panic!("expected QuorumUnreachable, got {other:?}"),
    }
    // Nothing is left locked, and the hashes are intact.
    for i in 0..5 {
        assert_eq!(servers.get(i, "other"), None, "node {i}");
    }
    for i in 0..3 {
        let t: String = servers.cmd(i, &["TYPE", "job"]);
        assert_eq!(t, "hash");
    }

    // With the hash on only two nodes, the other three still make a majority.
    let _: i64 = servers.cmd(2, &["DEL", "job"]);
    let lock = redlock
        .acquire(&["job"], TTL)
        .await
        .expect("majority without the hashes");
    lock.release().await.expect("release tolerates the hashes");
    let t: String = servers.cmd(0, &["TYPE", "job"]);
    assert_eq!(t, "hash");
}

#[tokio::test]
async fn scripts_are_reloaded_after_a_flush() {
    let servers = Servers::start(3);
    let redlock = servers.redlock();
    redlock
        .acquire(&["a"], TTL)
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    for i in 0..3 {
        let _: () = servers.cmd(i, &["SCRIPT", "FLUSH"]);
    }
    let lock = redlock
        .acquire(&["a"], TTL)
        .await
        .expect("acquire after SCRIPT FLUSH");
    lock.release().await.expect("release");
}

#[tokio::test]
async fn an_acquire_given_up_half_way_leaves_nothing_locked() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .node_timeout(Duration::from_secs(2))
        .build()
        .expect("config");
    support::warm_up(&redlock).await;
    // Two of three nodes hang: node 0 grants at once, the attempt waits for a majority, and
    // the caller gives up first.
    servers.pause(1);
    servers.pause(2);
    let gave_up = tokio::time::timeout(
        Duration::from_millis(200),
        redlock.try_acquire(&["job"], Duration::from_secs(60)),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "expected the caller's timeout, got {gave_up:?}"
    );
    servers.resume(1);
    servers.resume(2);
    // Node 0's grant and the writes queued on the two others are all undone.
    assert!(
        eventually(|| servers.on_every_node("job", Option::is_none)).await,
        "left behind: {:?}",
        (0..3).map(|i| servers.get(i, "job")).collect::<Vec<_>>()
    );
}
