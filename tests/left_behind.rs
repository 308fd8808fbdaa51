//! Nothing a holder or a writer's wait leaves on the nodes outlives it (from an adversarial
//! review of the read-write lock and fair mode), against real redis-server processes.

#[path = "support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use redfence::{Backoff, Error};
use support::{PATIENT, Servers, TestRedlock, eventually, warm_up};

const WRITER: &str = "cfg:rwlock:writer";
const READERS: &str = "cfg:rwlock:readers";
const WAITING: &str = "cfg:rwlock:writer_waiting";

/// Server `i`'s clock, in ms.
fn server_ms(servers: &Servers, i: usize) -> u64 {
    let t: Vec<String> = servers.cmd(i, &["TIME"]);
    t[0].parse::<u64>().expect("seconds") * 1000 + t[1].parse::<u64>().expect("micros") / 1000
}

/// A writer granted on its first attempt while one node (a minority) refused it takes away the
/// waiting mark it left on that node. (Its leave was once sent only after a failed attempt:
/// new readers were then refused there for the mark's whole life, 3 × the longest retry delay
/// + node timeout, up to 60 s, long after the writer released.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_granted_at_once_takes_its_waiting_mark_away() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .node_timeout(PATIENT)
        .backoff(Backoff::fixed(Duration::from_secs(5), Duration::ZERO).retries(3))
        .build()
        .expect("config");
    warm_up(&redlock).await;
    let lock = redlock.rwlock("cfg").expect("rwlock");

    // A reader entry on node 2 alone (e.g. a failed read attempt whose release has not
    // landed yet), live for 600 ms by node 2's clock.
    let until = server_ms(&servers, 2) + 600;
    let _: i64 = servers.cmd(2, &["ZADD", READERS, &until.to_string(), "ghost"]);

    let started = Instant::now();
    let write = lock
        .acquire_write(Duration::from_secs(1))
        .await
        .expect("writer granted by nodes 0 and 1");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "granted on the first attempt"
    );
    // Node 2 refused it (a refused writer marks the lock there; the mark may be gone by now).
    assert!(
        eventually(|| servers.get(0, WRITER).is_some() && servers.get(1, WRITER).is_some()).await,
        "granted by nodes 0 and 1"
    );
    assert!(
        servers.get(2, WRITER).is_none(),
        "node 2 refused the writer"
    );
    write.release().await.expect("release");
    let released = Instant::now();
    assert!(
        eventually(|| servers.on_every_node(WRITER, Option::is_none)).await,
        "released everywhere"
    );
    // Past the ghost reader's end and the writer's TTL (1 s), with margin.
    let deadline = released + Duration::from_secs(3);
    while Instant::now() < deadline && servers.get(2, WAITING).is_some() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left = servers.pttl(2, WAITING);

    // The impact: with node 0 down, nothing held at all, a reader is still refused.
    servers.pause(0);
    let read = lock.try_acquire_read(Duration::from_secs(1)).await;
    servers.resume(0);
    let read_ok = read.is_ok();
    if let Ok(read) = read {
        read.release().await.ok();
    }
    assert!(
        left < 0 && read_ok,
        "3 s after the writer's release (TTL 1 s) node 2 still holds its waiting mark \
         (PTTL {left} ms); a reader with node 0 down then got: {}",
        if read_ok {
            "granted".to_string()
        } else {
            "refused".to_string()
        }
    );
}

/// A fair holder that vanishes without a release (a crash) stays at the head of the keys'
/// queues no longer than its lock's TTL. (It once stayed until its waiter lease ended, 3 × the
/// longest retry delay + node timeout, up to a day: every fair waiter was refused long after
/// the lock expired.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_fair_holder_blocks_the_line_no_longer_than_its_ttl() {
    let servers = Servers::start(3);
    // Lease: 3 × 2 s + 500 ms = 6.5 s.
    let holder = servers.fair(Duration::from_secs(2));
    let other = servers.fair(Duration::from_secs(2));
    warm_up(&holder).await;
    warm_up(&other).await;
    let lock = holder
        .try_acquire(&["fair-res"], Duration::from_millis(500))
        .await
        .expect("holder");
    let granted = Instant::now();
    // The holder's process dies: no release.
    std::mem::forget(lock);
    assert!(
        eventually(|| servers.on_every_node("fair-res", Option::is_none)).await,
        "the lock expires"
    );
    let expired = Instant::now();
    let mut last: Option<Error> = None;
    let mut got = false;
    while expired.elapsed() < Duration::from_secs(2) {
        match other
            .try_acquire(&["fair-res"], Duration::from_secs(1))
            .await
        {
            Ok(lock) => {
                lock.release().await.ok();
                got = true;
                break;
            }
            Err(err) => last = Some(err),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        got,
        "2 s after the 500 ms lock expired ({:?} after its grant), fair waiters are still \
         refused: {last:?}; queue on node 0: {:?}",
        granted.elapsed(),
        servers.cmd::<Vec<String>>(0, &["ZRANGE", "fair-res:redfence:queue", "0", "-1"])
    );
}
