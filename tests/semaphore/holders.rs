//! Never more than K holders: a slot per permit, each granted by a majority of the nodes
//! (where a set of holders per node would let a third in), under contention in both modes,
//! and with a minority of the nodes down.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redfence::Error;

use crate::TTL;
use crate::support::{self, PATIENT, Servers, TestRedlock, eventually};

/// The interleaving that breaks a "set of holders per node, capped at K" design: 3 nodes,
/// K = 2, holder A on nodes {0, 1} and holder B on nodes {1, 2}. Nodes 0 and 2 each see one
/// holder, so a set-based design would grant C there (a majority with room): three holders.
/// With slots, A holds slot 0 and B slot 1 on those nodes; C finds no slot free on a
/// majority and is refused.
#[tokio::test]
async fn a_third_holder_is_refused_where_a_set_per_node_would_have_room() {
    let servers = Servers::start(3);
    let redlock = servers.patient();
    let sem = redlock.semaphore("jobs", 2).expect("semaphore");
    let slot0 = &sem.slots()[0];
    let slot1 = &sem.slots()[1];
    for node in [0, 1] {
        let _: () = servers.cmd(node, &["SET", slot0, "token-a", "PX", "30000"]);
    }
    for node in [1, 2] {
        let _: () = servers.cmd(node, &["SET", slot1, "token-b", "PX", "30000"]);
    }
    // Each of nodes 0 and 2 holds a single holder's key: room for one more "in a set sense".
    for node in [0, 2] {
        let held = servers
            .keys(node)
            .into_iter()
            .filter(|k| k.contains(":semaphore:slot:"))
            .count();
        assert_eq!(held, 1, "node {node} sees one holder");
    }
    match sem.try_acquire(TTL).await {
        Err(Error::Contended { .. }) => {}
        other => panic!("C must be refused while A and B hold, got {other:?}"),
    }
    // C left nothing behind: each slot key is still A's or B's where it was, absent elsewhere.
    assert_eq!(servers.get(0, slot0).as_deref(), Some("token-a"));
    assert_eq!(servers.get(2, slot1).as_deref(), Some("token-b"));
    assert!(
        eventually(|| servers.get(0, slot1).is_none() && servers.get(2, slot0).is_none()).await
    );

    // Two real holders the same way: the third is refused, the first release lets it in.
    // (The keys go, not the servers' memory: a flush would quarantine them.)
    for i in 0..3 {
        for key in servers.keys(i) {
            let _: () = servers.cmd(i, &["DEL", &key]);
        }
    }
    let a = sem.acquire(TTL).await.expect("A");
    let b = sem.acquire(TTL).await.expect("B");
    assert_ne!(a.slot(), b.slot());
    assert!(matches!(
        sem.try_acquire(TTL).await,
        Err(Error::Contended { .. })
    ));
    let freed = a.slot();
    a.release().await.expect("release A");
    let c = sem.try_acquire(TTL).await.expect("C after A's release");
    assert_eq!(c.slot(), freed);
    drop((b, c));
}

/// 16 tasks, K = 3: each records the window in which its permit was valid, from when the
/// acquisition returned to the earlier of its validity's end and the start of its release.
/// No instant is inside more than K windows, and every task got its permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_k_valid_permits_at_one_instant() {
    at_most_k_permits(false).await;
}

/// The same in fair mode, where the waiters take turns through the semaphore's line and its
/// holder alone goes round the slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_k_valid_permits_in_fair_mode() {
    at_most_k_permits(true).await;
}

async fn at_most_k_permits(fair: bool) {
    const K: u32 = 3;
    const ROUNDS: usize = 5;
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .fair(fair)
        .node_timeout(PATIENT)
        .retry_count(10_000)
        .retry_delay(Duration::from_millis(2))
        .retry_jitter(Duration::from_millis(2))
        .build()
        .expect("config");
    let sem = redlock.semaphore("workers", K).expect("semaphore");
    let windows: Arc<Mutex<Vec<(Instant, Instant, u32)>>> = Arc::default();
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (sem, windows) = (sem.clone(), Arc::clone(&windows));
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let permit = sem.acquire(TTL).await.expect("acquire");
                    let start = Instant::now();
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    let end = Instant::now().min(permit.expires_at());
                    windows
                        .lock()
                        .expect("windows")
                        .push((start, end, permit.slot()));
                    permit.release().await.expect("release");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let windows = windows.lock().expect("windows").clone();
    assert_eq!(windows.len(), 16 * ROUNDS, "every task got every permit");
    let most = support::most_at_once(windows.iter().map(|&(start, end, _)| (start, end)));
    assert!(most <= K as usize, "{most} permits valid at one instant");
    assert!(
        most >= 2,
        "the test never ran permits side by side ({most})"
    );
    // Two windows on one slot never overlap.
    for (i, a) in windows.iter().enumerate() {
        for b in &windows[i + 1..] {
            if a.2 == b.2 {
                assert!(a.1 <= b.0 || b.1 <= a.0, "slot {} held twice at once", a.2);
            }
        }
    }
}

/// A permit is granted with one node down (a majority is enough), and the size check too.
#[tokio::test]
async fn a_permit_is_granted_with_a_minority_down() {
    let mut servers = Servers::start(3);
    servers.kill(2);
    let redlock = servers.patient();
    let sem = redlock.semaphore("pool", 2).expect("semaphore");
    let permit = sem.acquire(TTL).await.expect("a majority is up");
    let key = format!("pool:semaphore:slot:{}", permit.slot());
    assert!((0..2).all(|i| servers.get(i, &key).as_deref() == Some(permit.token())));
    permit.release().await.expect("release");
}
