//! Clock faults: nodes whose clocks run fast or jump forward (libfaketime on Valkey, see
//! `testkit/src/faketime.rs`).
//!
//! Redlock assumes every node expires a key after about the same real time; `drift_factor`
//! pays for rates a few percent apart, not for a node 4× fast or stepped forward. With a
//! minority of such nodes mutual exclusion still holds: a second owner cannot reach a
//! majority while the first lock is valid. With a majority it does not, and a second owner
//! gets in: these tests show exactly that, and that fencing then rejects every write of the
//! stale owner.
//!
//! Skipped, with a message that names the missing piece, where libfaketime or a libc-malloc
//! Valkey is absent (`scripts/setup.sh` installs both).

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redfence::{Error, Lock, MemoryCounter, Redlock};
use support::eventually;
use support::faketime::{Clocks, Pieces, server_ahead};
use support::{Servers, TestRedlock};

const TTL: Duration = Duration::from_secs(6);
const RATE: f64 = 4.0;

/// Five Valkey nodes with clocks of their own, or `None` (after saying what is missing).
fn start(test: &str) -> Option<(Servers, Clocks)> {
    match Pieces::find() {
        Ok(pieces) => Some(Clocks::start(&pieces, 5, &[])),
        Err(missing) => {
            eprintln!("skipping {test}: missing {missing}");
            None
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum ClockFault {
    /// The node's clock runs at [`RATE`] × real time from before the lock is taken.
    Fast,
    /// The node's clock steps forward by a TTL right after the lock is taken.
    Jump,
}

/// A patient node timeout: a call that times out before it was even written is never sent,
/// and these tests check that every write lands.
fn redlock(servers: &Servers, counter: &Arc<MemoryCounter>) -> Redlock {
    servers
        .builder()
        .retry_count(0)
        .node_timeout(Duration::from_millis(500))
        .fencing(Arc::clone(counter))
        .build()
        .expect("config")
}

/// Takes `job` with `fault` on `nodes`, and waits until those nodes have dropped the key while
/// the lock is still valid (the fault bit). Returns the lock.
async fn take_under_fault(
    servers: &Servers,
    clocks: &Clocks,
    redlock: &Redlock,
    fault: ClockFault,
    nodes: &[usize],
) -> Lock {
    support::warm_up(redlock).await;
    if let ClockFault::Fast = fault {
        for &i in nodes {
            clocks.set_rate(i, RATE);
            // No step when the rate changes (the offset makes up for the time since spawn).
            let ahead = server_ahead(servers, i);
            assert!(ahead.abs() < 0.5, "node {i} stepped {ahead:.3} s");
        }
        // The servers say so: their clocks already gain on real time.
        assert!(
            eventually(|| nodes.iter().all(|&i| server_ahead(servers, i) > 0.2)).await,
            "{fault:?}: the clocks of {nodes:?} do not run fast"
        );
    }
    let lock = redlock.acquire(&["job"], TTL).await.expect("first owner");
    let token = lock.token().to_owned();
    // The write reaches every node (stragglers too) before the fault is judged.
    assert!(
        eventually(|| {
            (0..5).all(|i| {
                servers.get(i, "job").as_deref() == Some(token.as_str()) || nodes.contains(&i)
            })
        })
        .await
    );
    if let ClockFault::Jump = fault {
        for &i in nodes {
            clocks.jump(i, TTL);
        }
    }
    assert!(
        eventually(|| nodes.iter().all(|&i| servers.get(i, "job").is_none())).await,
        "{fault:?}: nodes {nodes:?} kept the key"
    );
    let others: Vec<usize> = (0..5).filter(|i| !nodes.contains(i)).collect();
    assert_eq!(
        servers.holders("job", &token, others.iter().copied()),
        others,
        "{fault:?}: the nodes with true clocks lost the key"
    );
    assert!(
        !lock.is_expired(),
        "{fault:?}: the fault took too long to bite ({:?} left)",
        lock.remaining()
    );
    lock
}

/// Two of five nodes lose the key early: a second client is refused for as long as the
/// first lock is valid, and gets in only after it expired.
async fn minority(fault: ClockFault) {
    let Some((servers, clocks)) = start(&format!("minority clock fault {fault:?}")) else {
        return;
    };
    let counter = Arc::new(MemoryCounter::new());
    let (a, b) = (redlock(&servers, &counter), redlock(&servers, &counter));
    let first = take_under_fault(&servers, &clocks, &a, fault, &[0, 1]).await;
    support::warm_up(&b).await;

    let mut refused = 0;
    // Keep a margin before the end of the first lease, so that a refusal is never owed to it.
    while first.remaining() > Duration::from_millis(500) {
        match b.try_acquire(&["job"], TTL).await {
            Err(Error::Contended { .. }) => refused += 1,
            // A node slow to answer on a loaded machine: still no second owner.
            Err(Error::QuorumUnreachable { .. }) => {}
            other => panic!(
                "{fault:?}: a second owner got in with {:?} of the first lease left: {other:?}",
                first.remaining()
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused > 5, "{fault:?}: only {refused} attempts were made");

    // After the first lease, the second client does get in (not before: checked on success).
    let deadline = Instant::now() + TTL + support::DEADLINE;
    let second = loop {
        match b.try_acquire(&["job"], TTL).await {
            Ok(lock) => break lock,
            Err(Error::Contended { .. } | Error::QuorumUnreachable { .. })
                if Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("{fault:?}: the second owner never got in: {e}"),
        }
    };
    assert!(
        first.is_expired(),
        "{fault:?}: the second owner got in with {:?} of the first lease left",
        first.remaining()
    );
    assert!(second.fence() > first.fence());
    second.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_with_fast_clocks_keeps_mutual_exclusion() {
    minority(ClockFault::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_with_clock_jump_keeps_mutual_exclusion() {
    minority(ClockFault::Jump).await;
}

/// The protected storage of the examples: accepts a write whose fence is not below the last
/// one it accepted (the owner may write again with its own token).
#[derive(Default)]
struct FencedStore {
    last: Mutex<HashMap<&'static str, u64>>,
}

impl FencedStore {
    fn write(&self, row: &'static str, fence: u64) -> bool {
        let mut last = self.last.lock().expect("store");
        let accepted = fence >= last.get(row).copied().unwrap_or(0);
        if accepted {
            last.insert(row, fence);
        }
        accepted
    }
}

/// Three of five nodes lose the key early: Redlock's assumption is broken and a second owner
/// gets in while the first lock is still valid. Fencing is what keeps the data safe: from the
/// new owner's first write on, every write of the stale one is rejected.
///
/// The second owner runs with the restart quarantine off: a client that reads a server's
/// clock before and after the fault quarantines it (`tests/memory_quarantine.rs`), but one
/// that has not read it since (up to a second), or a fault slower than the drift bound, lets
/// the second owner in just the same.
async fn majority(fault: ClockFault) {
    let Some((servers, clocks)) = start(&format!("majority clock fault {fault:?}")) else {
        return;
    };
    let counter = Arc::new(MemoryCounter::new());
    let a = redlock(&servers, &counter);
    let b = servers
        .builder()
        .retry_count(0)
        .node_timeout(Duration::from_millis(500))
        .fencing(Arc::clone(&counter))
        .restart_quarantine(Duration::ZERO)
        .build()
        .expect("config");
    support::warm_up(&b).await;
    let store = FencedStore::default();
    let first = take_under_fault(&servers, &clocks, &a, fault, &[0, 2, 4]).await;
    let old = first.fence().expect("a fence");
    assert!(store.write("row", old), "the first owner's first write");

    let second = b.try_acquire(&["job"], TTL).await;
    assert!(
        second.is_ok() && !first.is_expired(),
        "{fault:?}: expected a majority of broken clocks to let a second owner in while the \
         first lock is valid ({:?} left): {second:?}",
        first.remaining()
    );
    let second = second.expect("second owner");
    let new = second.fence().expect("a fence");
    assert!(new > old, "{fault:?}: fences {old} then {new}");
    eprintln!(
        "{fault:?}: as documented, clocks broken on 3 of 5 nodes let a second owner in with \
         {:?} of the first lease left",
        first.remaining()
    );

    for write in 0..3 {
        assert!(
            store.write("row", new),
            "{fault:?}: the new owner's write {write}"
        );
        assert!(
            !first.is_expired(),
            "{fault:?}: the stale owner still believes it holds the lock"
        );
        assert!(
            !store.write("row", old),
            "{fault:?}: a write of the stale owner was accepted"
        );
    }
    second.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_with_fast_clocks_lets_a_second_owner_in_and_fencing_rejects_the_first() {
    majority(ClockFault::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_with_clock_jump_lets_a_second_owner_in_and_fencing_rejects_the_first() {
    majority(ClockFault::Jump).await;
}
