//! Servers restarted without persistence (real redis-server processes): the restart
//! quarantine, extensions that repair a forgotten key, and the lock-delay.

mod support;

use std::time::{Duration, Instant};

use redfence::{Error, Lock, Redlock};
use support::restarted::{hold_on_0_to_2, quarantined};
use support::{PATIENT, Servers, TestRedlock, acquire_within, eventually, warm_up};

const RES: &str = "ledger:restart";

/// A holds `RES` on nodes 0–2 (see `hold_on_0_to_2`); node 2 then restarts without
/// persistence: it forgets A's key, and a majority of free nodes (2, 3, 4) is there for the
/// taking.
async fn hold_on_0_to_2_then_restart_2(servers: &mut Servers, ttl: Duration) -> Lock {
    let lock = hold_on_0_to_2(servers, RES, ttl).await;
    servers.restart(2);
    assert_eq!(servers.holders(RES, lock.token(), 0..5), vec![0, 1]);
    lock
}

/// B, connected before the restart with the default quarantine (a `run_id` change seen while
/// connected), is refused: nodes 2–4 grant, but node 2 just restarted and its grant does not
/// count. Once A's lock ends B gets it, node 2 still quarantined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_is_quarantined_and_cannot_hand_a_lock_out_twice() {
    let mut servers = Servers::start(5);
    let b = servers
        .builder()
        .retry_count(0)
        .node_timeout(PATIENT)
        .build()
        .expect("valid config");
    warm_up(&b).await; // B knows every node's run_id
    let a = hold_on_0_to_2_then_restart_2(&mut servers, Duration::from_secs(30)).await;

    let err = b
        .try_acquire(&[RES], Duration::from_secs(5))
        .await
        .expect_err("node 2 is quarantined: only 2 votes of 5");
    assert_eq!(quarantined(&err), vec![2], "{err}");
    assert!(err.to_string().contains("quarantined"), "{err}");
    assert!(!a.is_expired());
    // B's key on node 2 (written, not counted) and on 3, 4 is released after the failure.
    assert!(
        eventually(|| (2..5).all(|i| servers.get(i, RES).is_none())).await,
        "the failed attempt released its keys"
    );

    let released_at = Instant::now();
    a.release().await.expect("A releases on nodes 0-1");
    // release() returns once a majority answered (nodes 2-4 have no key of A's): wait for
    // nodes 0 and 1 too (a CI run once saw node 0 still releasing when B asked).
    assert!(
        eventually(|| (0..2).all(|i| servers.get(i, RES).is_none())).await,
        "A's keys released on nodes 0-1"
    );
    let lock = b
        .try_acquire(&[RES], Duration::from_secs(5))
        .await
        .expect("A's lock ended: nodes 0, 1, 3, 4 grant (node 2 is still quarantined)");
    assert!(Instant::now() > released_at);
    let holders = servers.holders(RES, lock.token(), 0..5);
    assert!(
        [0, 1, 3, 4].iter().all(|i| holders.contains(i)),
        "{holders:?}"
    );
    lock.release().await.expect("release");
}

/// The same without quarantine: the restarted node's vote makes a second owner while the
/// first still holds a valid lock. This is why the option exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quarantine_a_restart_makes_two_owners() {
    let mut servers = Servers::start(5);
    let c = servers.unquarantined();
    warm_up(&c).await;
    let a = hold_on_0_to_2_then_restart_2(&mut servers, Duration::from_secs(30)).await;

    let second = c
        .try_acquire(&[RES], Duration::from_secs(5))
        .await
        .expect("nodes 2-4 grant: nothing stops a second owner");
    assert!(!a.is_expired() && a.remaining() > Duration::from_secs(10));
    assert_eq!(servers.holders(RES, a.token(), 0..5), vec![0, 1]);
    assert_eq!(servers.holders(RES, second.token(), 0..5), vec![2, 3, 4]);
    second.release().await.expect("release");
    a.release().await.expect("release");
}

/// A lock held (extended) through rolling restarts of one node at a time keeps its majority,
/// and each restarted node gets the key back once its quarantine ends (never before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extensions_repair_keys_through_rolling_restarts() {
    const QUARANTINE: Duration = Duration::from_secs(2);
    const TTL: Duration = Duration::from_secs(3);
    let mut servers = Servers::start(5);
    let redlock = servers
        .builder()
        .restart_quarantine(QUARANTINE)
        .node_timeout(PATIENT)
        .build()
        .expect("valid config");
    let mut lock = acquire_within(
        &redlock,
        &[RES],
        TTL,
        Duration::from_secs(20),
        "fresh servers leave quarantine",
    )
    .await;
    let token = lock.token().to_owned();
    // Granted at the majority: the last grants may still be on their way.
    let everywhere = eventually(|| servers.holders(RES, &token, 0..5) == vec![0, 1, 2, 3, 4]);
    assert!(everywhere.await, "every node granted");
    lock.extend(TTL).await.expect("every node confirms");
    for node in 0..3 {
        servers.restart(node);
        let restarted = Instant::now();
        lock.extend(TTL).await.expect("four nodes confirm");
        assert_eq!(
            servers.get(node, RES),
            None,
            "node {node} is quarantined: no repair yet"
        );
        let deadline = restarted + Duration::from_secs(15);
        while servers.get(node, RES).as_deref() != Some(token.as_str()) {
            assert!(Instant::now() < deadline, "node {node} never repaired");
            tokio::time::sleep(Duration::from_millis(300)).await;
            lock.extend(TTL).await.expect("a majority confirms");
        }
        assert!(
            restarted.elapsed() >= QUARANTINE - Duration::from_secs(1),
            "repaired after {:?}, within the quarantine",
            restarted.elapsed()
        );
        assert!(servers.pttl(node, RES) > 0);
    }
    assert_eq!(servers.holders(RES, &token, 0..5), vec![0, 1, 2, 3, 4]);
    lock.release().await.expect("release");
    assert!(eventually(|| servers.on_every_node(RES, Option::is_none)).await);
}

fn with_delay(servers: &Servers, delay: Duration) -> Redlock {
    servers
        .builder()
        .lock_delay(delay)
        .node_timeout(PATIENT)
        .build()
        .expect("valid config")
}

/// With a lock-delay of 2 s, a lock that ends without a release blocks its resource until
/// 2 s after its expiry; the holder's validity does not include the delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_delay_blocks_after_an_unreleased_expiry() {
    const DELAY: Duration = Duration::from_secs(2);
    const TTL: Duration = Duration::from_secs(1);
    let servers = Servers::start(5);
    let redlock = with_delay(&servers, DELAY);
    warm_up(&redlock).await;
    let mut lock = redlock.acquire(&[RES], TTL).await.expect("acquire");
    assert!(lock.remaining() <= TTL, "validity excludes the delay");
    let pttl = servers.pttl(0, RES);
    assert!(
        pttl > 2_000 && pttl <= 3_000,
        "server TTL is ttl + delay: {pttl}"
    );
    lock.extend(TTL).await.expect("extend");
    assert!(lock.remaining() <= TTL);
    let pttl = servers.pttl(0, RES);
    assert!(pttl > 2_000 && pttl <= 3_000, "after extend: {pttl}");
    let expires_at = lock.expires_at();
    // The holder crashes: no release.
    std::mem::forget(lock);

    let other = with_delay(&servers, DELAY);
    let next = acquire_within(
        &other,
        &[RES],
        TTL,
        Duration::from_secs(20),
        "the resource frees after the delay",
    )
    .await;
    let got_at = Instant::now();
    assert!(
        got_at >= expires_at + DELAY,
        "taken {:?} after the expiry, before the delay ended",
        got_at.saturating_duration_since(expires_at)
    );
    assert!(
        got_at <= expires_at + DELAY + Duration::from_secs(5),
        "taken {:?} after the expiry",
        got_at.saturating_duration_since(expires_at)
    );

    // A clean release frees the resource at once.
    next.release().await.expect("release");
    let again = other
        .try_acquire(&[RES], TTL)
        .await
        .expect("released: free at once");
    again.release().await.expect("release");
}

/// The lock-delay is validated.
#[test]
fn an_absurd_lock_delay_or_quarantine_is_refused() {
    let build = |b: redfence::RedlockBuilder| b.node("redis://127.0.0.1:1").build();
    let err = build(Redlock::builder().lock_delay(Duration::from_secs(86_400)))
        .expect_err("a day of lock-delay");
    assert!(err.to_string().contains("lock_delay"), "{err}");
    let err = build(Redlock::builder().restart_quarantine(Duration::from_secs(864_000)))
        .expect_err("ten days of quarantine");
    assert!(err.to_string().contains("restart_quarantine"), "{err}");
    assert!(build(Redlock::builder().lock_delay(Duration::from_secs(5))).is_ok());
}

/// The batch script's "E" (extend and repair) straight on a server: keys that hold the token
/// are re-armed, missing ones set again, all or nothing, and only a round that set nothing
/// again confirms; another owner's key (or a key of another type) refuses the whole operation
/// and changes nothing. "e" never sets a key.
#[test]
fn extend_and_repair_sets_only_missing_keys_all_or_nothing() {
    const SCRIPT: &str = include_str!("../src/scripts/batch.lua");
    let servers = Servers::start(1);
    let run = |keys: &[&str], args: &[&str]| -> Vec<i64> {
        let mut conn = servers.conn(0);
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(SCRIPT).arg(keys.len()).arg(keys).arg(args);
        cmd.query(&mut conn).expect("batch")
    };
    let _: () = servers.cmd(0, &["SET", "mine", "tok", "PX", "1000"]);
    let _: () = servers.cmd(0, &["SET", "theirs", "other", "PX", "60000"]);
    let _: () = servers.cmd(0, &["HSET", "hash", "f", "v"]);
    // "e" on a missing key: refused, nothing set.
    assert_eq!(run(&["mine", "gone"], &["e", "tok", "60000", "2"]), vec![0]);
    assert_eq!(servers.get(0, "gone"), None);
    // "E": ours re-armed, the missing one set again; a repair is no confirmation (0: this
    // node's vote does not count this round).
    assert_eq!(run(&["mine", "gone"], &["E", "tok", "60000", "2"]), vec![0]);
    assert_eq!(servers.get(0, "gone").as_deref(), Some("tok"));
    assert!(servers.pttl(0, "mine") > 50_000);
    assert!(servers.pttl(0, "gone") > 50_000);
    // The next round finds both holding the token: confirmed.
    assert_eq!(run(&["mine", "gone"], &["E", "tok", "60000", "2"]), vec![2]);
    // Another owner's key, or one of another type: nothing changes.
    let replies = run(
        &["missing1", "theirs", "missing2", "hash"],
        &["E", "tok", "60000", "2", "E", "tok", "60000", "2"],
    );
    assert_eq!(replies, vec![0, 0]);
    assert_eq!(servers.get(0, "missing1"), None);
    assert_eq!(servers.get(0, "missing2"), None);
    assert_eq!(servers.get(0, "theirs").as_deref(), Some("other"));
}

/// `using()` with a lock-delay: the keys carry `ttl + delay` on the servers, while the
/// signal's remaining validity never exceeds the TTL, through the lease keeper's extensions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn using_with_lock_delay_keeps_validity_within_the_ttl() {
    const DELAY: Duration = Duration::from_secs(2);
    const TTL: Duration = Duration::from_secs(1);
    let servers = Servers::start(5);
    let redlock = with_delay(&servers, DELAY);
    warm_up(&redlock).await;
    let servers = &servers;
    redlock
        .using(&[RES], TTL, |signal| async move {
            let until = Instant::now() + TTL * 2;
            let mut max_pttl = 0;
            while Instant::now() < until {
                assert!(signal.remaining() <= TTL, "{:?}", signal.remaining());
                max_pttl = max_pttl.max(servers.pttl(0, RES));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Held past its first TTL: extended, each time to ttl + delay on the servers.
            signal.check()?;
            assert!(max_pttl > 2_000, "server TTL {max_pttl} ms");
            Ok::<(), Error>(())
        })
        .await
        .expect("held through its extensions");
    assert!(
        eventually(|| servers.on_every_node(RES, Option::is_none)).await,
        "released at once"
    );
}
