//! The per-node request path with plain commands (Valkey 9: `DELIFEQ`, `SET … IFEQ`):
//! a lock's release must never be overtaken, on one node, by an earlier request of the same
//! lock that the plain path runs again in the script after the batch's plain commands.
//!
//! Each scenario queues two requests of one lock behind a call in flight to a paused node, so
//! that they share the next batch, then resumes the node and checks that nothing of the lock
//! is left on it. Each runs with plain commands (the path under test) and with the script
//! only (`native_commands(false)`, the control, which keeps the order).

mod support;

use std::time::Duration;

use redfence::Redlock;
use support::{Servers, valkey9};

const TTL: Duration = Duration::from_secs(30);
/// Far longer than any pause below: no call here times out.
const NODE_TIMEOUT: Duration = Duration::from_secs(5);

fn start(n: usize) -> Servers {
    Servers::start_launched(n, &[], |_| valkey9())
}

fn redlock(servers: &Servers, native: bool) -> Redlock {
    Redlock::builder()
        .nodes(servers.urls())
        .retry_count(0)
        .node_timeout(NODE_TIMEOUT)
        .native_commands(native)
        .build()
        .expect("config")
}

/// (Found by an adversarial review, fixed since.) An acquire that goes in the script (before the connection's first
/// release, acquires are not plain) and its own release (plain `DELIFEQ`) share a batch; the
/// server has lost the script (`SCRIPT FLUSH` here; a restart in production, after which
/// `support.released` is false again and the script cache empty). The plain release runs
/// first, the script piece answers `NOSCRIPT`; the acquire must not then run again in the
/// script *after* its release (server_link.rs `again`), which would leave the key set with the
/// failed attempt's token until its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_not_overtaken_by_its_acquire_run_again_after_noscript() {
    for native in [false, true] {
        let servers = start(3);
        let redlock = redlock(&servers, native);
        // First contact on every node (connection, COMMAND INFO, the script loaded), with no
        // release: acquires still go in the script on the plain path.
        let mut other = redlock
            .acquire(&["other"], TTL)
            .await
            .expect("acquire other");
        // The script is gone from node 0.
        let _: () = servers.cmd(0, &["SCRIPT", "FLUSH"]);
        // The key is held by someone else on nodes 1 and 2: the attempt below is refused there.
        for i in 1..3 {
            let _: () = servers.cmd(i, &["SET", "k", "someone-else", "PX", "60000"]);
        }
        servers.pause(0);
        // A call in flight on node 0 (a plain extend: no script), answered by nodes 1 and 2.
        other.extend(TTL).await.expect("extend on a majority");
        // Queued behind it on node 0: the attempt's acquire. Refused on a majority, the
        // attempt waits for node 0's answer; given up by its caller there (dropped), it
        // releases on every node in the background: on node 0, queued behind its acquire.
        let attempt =
            tokio::time::timeout(Duration::from_millis(300), redlock.try_acquire(&["k"], TTL))
                .await;
        assert!(
            attempt.is_err(),
            "native {native}: the attempt waits for node 0"
        );
        // Let the background release reach node 0's queue.
        tokio::time::sleep(Duration::from_millis(200)).await;
        servers.resume(0);
        redlock.close().await;
        let left = servers.get(0, "k");
        assert_eq!(
            left,
            None,
            "native {native}: node 0 keeps the failed attempt's key (PTTL {} ms) after its release",
            servers.pttl(0, "k")
        );
    }
}

/// (Found by an adversarial review, fixed since.) An extension and then the release of the same lock share a batch on a
/// node where the key is gone (expired there, or lost in a restart). The plain extend answers
/// 0, the plain release deletes nothing; the extension must not then run again as "E" (repair:
/// set the missing key again) *after* the release (server_link.rs, the `repair` loop), which
/// would set the released lock's key again for its TTL. The script alone sends
/// `[E, r]` in order and leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_not_overtaken_by_its_extension_repaired_after_it() {
    for native in [false, true] {
        let servers = start(3);
        let redlock = redlock(&servers, native);
        let mut other = redlock
            .acquire(&["other"], TTL)
            .await
            .expect("acquire other");
        let mut lock = redlock.acquire(&["k"], TTL).await.expect("acquire k");
        // The key is gone from node 0 (as after its TTL ran out there).
        let _: i64 = servers.cmd(0, &["DEL", "k"]);
        servers.pause(0);
        // A call in flight on node 0, answered by nodes 1 and 2.
        other.extend(TTL).await.expect("extend other on a majority");
        // Queued behind it on node 0: the lock's extension, then its release.
        lock.extend(TTL).await.expect("extend k on a majority");
        let token = lock.token().to_owned();
        let _ = tokio::time::timeout(Duration::from_secs(2), lock.release()).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        servers.resume(0);
        redlock.close().await;
        let left = servers.get(0, "k");
        assert_eq!(
            left,
            None,
            "native {native}: node 0 set the released lock's key again (ours: {}, PTTL {} ms)",
            left.as_deref() == Some(token.as_str()),
            servers.pttl(0, "k")
        );
        for i in 1..3 {
            assert_eq!(servers.get(i, "k"), None, "native {native}: node {i}");
        }
    }
}

/// (Found by an adversarial review, fixed since.) Fair mode: the same reordering as
/// `a_release_is_not_overtaken_by_its_acquire_run_again_after_noscript`, at any time in fair
/// mode (not only before a connection's first release): a fair acquire ("f") always goes in
/// the script, while the release of a failed or dropped attempt is a plain `DELIFEQ` (its
/// request has no queue). Here the script is flushed while node 0 is paused, after the call in
/// flight there, so that the next batch `[r x, l x, f k, r k, l k]` meets `NOSCRIPT`: the plain
/// `r k` runs, and `f k` must not run again after it (it would set `k` for the dropped
/// attempt). (Whether the server runs the flush before or after the call in flight is up to
/// its event loop: a round where it ran first cannot show the reordering, so each run makes
/// up to five rounds.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_a_dropped_attempts_release_is_not_overtaken_by_its_acquire() {
    for native in [false, true] {
        let servers = start(3);
        let redlock = Redlock::builder()
            .nodes(servers.urls())
            .fair(true)
            .retry_count(0)
            .node_timeout(NODE_TIMEOUT)
            .native_commands(native)
            .build()
            .expect("config");
        // A lock taken and released: acquires may go plain from now on (not fair ones).
        redlock
            .using(&["prime"], TTL, |_| async { Ok::<_, redfence::Error>(()) })
            .await
            .expect("prime");
        for round in 0..5 {
            let (x, k) = (format!("x{round}"), format!("k{round}"));
            fair_round(&servers, &redlock, &x, &k).await;
            assert_eq!(
                servers.get(0, &k),
                None,
                "native {native}, round {round}: node 0 keeps the dropped fair attempt's key \
                 (PTTL {} ms)",
                servers.pttl(0, &k)
            );
        }
        redlock.close().await;
    }
}

/// One round of `fair_a_dropped_attempts_release_is_not_overtaken_by_its_acquire` on keys
/// `x` and `k`; returns once everything queued for node 0 has run.
async fn fair_round(servers: &Servers, redlock: &Redlock, x: &str, k: &str) {
    use std::io::{Read, Write};
    for i in 1..3 {
        for key in [x, k] {
            let _: () = servers.cmd(i, &["SET", key, "someone-else", "PX", "60000"]);
        }
    }
    servers.pause(0);
    // In flight on node 0: x's fair acquire (the attempt waits for node 0: refused on the
    // others). Dropped: its release and leave queue behind it.
    let dropped =
        tokio::time::timeout(Duration::from_millis(300), redlock.try_acquire(&[x], TTL)).await;
    assert!(dropped.is_err(), "{x} waits for node 0");
    // The script is flushed once node 0 wakes, (most often) after the call in flight.
    let mut flush = std::net::TcpStream::connect(("127.0.0.1", servers.port(0))).expect("connect");
    flush.write_all(b"SCRIPT FLUSH\r\n").expect("SCRIPT FLUSH");
    let dropped =
        tokio::time::timeout(Duration::from_millis(300), redlock.try_acquire(&[k], TTL)).await;
    assert!(dropped.is_err(), "{k} waits for node 0");
    tokio::time::sleep(Duration::from_millis(200)).await;
    servers.resume(0);
    let mut ok = [0_u8; 5];
    flush.read_exact(&mut ok).expect("+OK");
    // Whatever is queued for node 0 has run: a lock on a key of its own, through using(),
    // whose release waits for every node, queued behind everything above.
    let witness = format!("{k}:witness");
    redlock
        .using(&[witness.as_str()], TTL, |_| async {
            Ok::<_, redfence::Error>(())
        })
        .await
        .expect("witness");
}
