//! Every sign of a restart is heeded (restart quarantine, repair on extend, lock-delay), against
//! real servers: Redis 7.0 (the batch script), Valkey 9.1 and Redis 8.6 (plain commands for
//! one-key locks, which never meet a `NOSCRIPT` after a restart). From an adversarial review
//! that found the advisory-call case below.

mod support;

use std::time::{Duration, Instant};

use redfence::{Error, Redlock};
use support::restarted::{hold_on_0_to_2, quarantined};
use support::{PATIENT, Servers, TestRedlock, eventually, warm_up};

const RES: &str = "ledger:restart-signs";

fn valkey9(n: usize) -> Servers {
    Servers::start_launched(n, &[], |_| support::valkey9())
}

fn redis8(n: usize) -> Servers {
    Servers::start_launched(n, &[], |_| support::redis8())
}

fn one_shot(servers: &Servers) -> Redlock {
    servers
        .builder()
        .retry_count(0)
        .node_timeout(PATIENT)
        .build()
        .expect("valid config")
}

/// the quarantine also holds on servers where a one-key
/// lock goes as plain commands (no NOSCRIPT reveals the restart there): the lost connection
/// does.
async fn restart_is_quarantined_on_plain_commands(mut servers: Servers) {
    let b = one_shot(&servers);
    warm_up(&b).await;
    // Plain acquires only after a release went through on the connection (warm_up did one).
    let a = hold_on_0_to_2(&servers, RES, Duration::from_secs(30)).await;
    servers.restart(2);
    assert_eq!(servers.holders(RES, a.token(), 0..5), vec![0, 1]);
    match b.try_acquire(&[RES], Duration::from_secs(5)).await {
        Ok(second) => panic!(
            "two owners: A holds {:?} (valid for {:?}), B got {:?}",
            servers.holders(RES, a.token(), 0..5),
            a.remaining(),
            servers.holders(RES, second.token(), 0..5)
        ),
        Err(err) => assert_eq!(quarantined(&err), vec![2], "{err}"),
    }
    a.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey9_restart_is_quarantined_on_plain_commands() {
    restart_is_quarantined_on_plain_commands(valkey9(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis8_restart_is_quarantined_on_plain_commands() {
    restart_is_quarantined_on_plain_commands(redis8(5)).await;
}

/// A restart that this very client saw on an *advisory* call (here `Redlock::inspect`, on the
/// same shared connection as the lock calls) is remembered: redis-rs reconnects in the
/// background after the dropped connection, and the next lock call runs on the new connection
/// without error; on a server with plain commands (no `NOSCRIPT`) and within a second of the
/// last identity read, the restarted node's grant would count (a second owner while A's lock
/// is valid) had the lost connection not made the node suspect (it once did not).
async fn restart_seen_by_an_advisory_call(
    mut servers: Servers,
    script_loader: bool,
    advisory: bool,
) {
    let a = hold_on_0_to_2(&servers, RES, Duration::from_secs(30)).await;
    // B, default quarantine, meets every server now (old servers: trusted, run_ids noted).
    let b = one_shot(&servers);
    // Two rounds: the first reads the identities (and loads the script), the release turns
    // plain commands on where the server has them.
    for _ in 0..2 {
        let warm = b
            .try_acquire(&["signs:warm"], Duration::from_secs(5))
            .await
            .expect("warm");
        warm.release().await.expect("release");
    }
    let identity_read = Instant::now();
    servers.restart(2);
    assert_eq!(servers.holders(RES, a.token(), 0..5), vec![0, 1]);
    if script_loader {
        // Another client loads the batch script on the restarted server (any lock call).
        let c = one_shot(&servers);
        let _ = c
            .try_acquire(&["signs:unrelated"], Duration::from_secs(1))
            .await;
    }
    // B looks at the resource first (an operator's `redfence status`, a semaphore's size
    // claim, `Redlock::check`): the call to node 2 meets the dropped connection.
    let seen = if advisory {
        format!("{:?}", b.inspect(&[RES]).await)
    } else {
        "(no inspect: control)".to_owned()
    };
    let result = b.try_acquire(&[RES], Duration::from_secs(5)).await;
    let elapsed = identity_read.elapsed();
    match result {
        Ok(second) => panic!(
            "two owners {elapsed:?} after B's last lock call (its identity reads at most ~1 s before): A holds {:?} (valid for \
             {:?}), B got {:?}; B's inspect saw: {}",
            servers.holders(RES, a.token(), 0..5),
            a.remaining(),
            servers.holders(RES, second.token(), 0..5),
            &seen[..seen.len().min(600)],
        ),
        Err(err) => assert_eq!(quarantined(&err), vec![2], "{err}"),
    }
    a.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey9_restart_seen_by_inspect_is_still_quarantined() {
    restart_seen_by_an_advisory_call(valkey9(5), false, true).await;
}

/// Control: the same without B's `inspect`: B's own lock call meets the
/// dropped connection, suspects a restart and reads node 2's new run_id: quarantined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey9_control_restart_without_inspect_is_quarantined() {
    restart_seen_by_an_advisory_call(valkey9(5), false, false).await;
}

/// Control, Redis 7.0 (the script path), as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis7_control_restart_without_inspect_is_quarantined() {
    restart_seen_by_an_advisory_call(Servers::start(5), true, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis7_restart_seen_by_inspect_is_still_quarantined() {
    restart_seen_by_an_advisory_call(Servers::start(5), true, true).await;
}

/// Over RESP3, redis-rs reconnects as soon as a server closes the connection, between calls:
/// no call of B sees the loss (a restarted server would pass unnoticed until the periodic
/// check). Its disconnection notice makes the server suspect: B's next lock call reads the
/// server's identity first (an `INFO` before it, within the second in which no periodic check
/// is due).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resp3_connection_closed_between_calls_makes_the_server_suspect() {
    let servers = valkey9(3);
    let b = Redlock::builder()
        .nodes(
            servers
                .urls()
                .iter()
                .map(|url| format!("{url}/0?protocol=resp3")),
        )
        .retry_count(0)
        .node_timeout(PATIENT)
        .build()
        .expect("valid config");
    let info_calls = || servers.command_stat(2, "info", "calls");
    let resp3_clients = || {
        servers
            .cmd::<String>(2, &["CLIENT", "LIST"])
            .lines()
            .filter(|line| line.contains("resp=3"))
            .count()
    };
    // A few tries: each must fit in the second after an identity read.
    for _ in 0..5 {
        let warm = b
            .try_acquire(&["signs:warm"], Duration::from_secs(5))
            .await
            .expect("warm");
        warm.release().await.expect("release");
        let read_at = Instant::now();
        let before = info_calls();
        // The server closes B's connection; B reconnects at once, without a call.
        let _: i64 = servers.cmd(2, &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
        assert!(
            eventually(|| resp3_clients() == 1).await,
            "B reconnected in the background"
        );
        let lock = b
            .try_acquire(&["signs:next"], Duration::from_secs(5))
            .await
            .expect("acquire");
        lock.release().await.expect("release");
        if read_at.elapsed() >= Duration::from_millis(900) {
            continue; // a periodic check may have been due: not telling
        }
        // (Reading the count is an `INFO` too: one more than `before` is ours.)
        assert!(
            info_calls() > before + 1,
            "no identity read after the connection was closed between calls"
        );
        return;
    }
    panic!("never within a second of an identity read");
}

/// on plain commands too, an extension does not set
/// the key again on a restarted server while it is quarantined (a refused `SET … IFEQ` runs
/// again as "E" only out of quarantine), and does once the quarantine ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey9_repair_waits_for_the_quarantine() {
    const QUARANTINE: Duration = Duration::from_secs(2);
    const TTL: Duration = Duration::from_secs(3);
    let mut servers = valkey9(5);
    let redlock = servers
        .builder()
        .restart_quarantine(QUARANTINE)
        .node_timeout(PATIENT)
        .build()
        .expect("valid config");
    // Every server out of its (first-contact) quarantine first.
    let uptime = |servers: &Servers, i: usize| -> u64 {
        let info: String = servers.cmd(i, &["INFO", "server"]);
        info.lines()
            .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(0..5).all(|i| uptime(&servers, i) > QUARANTINE.as_secs()) {
        assert!(Instant::now() < deadline, "servers age");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    warm_up(&redlock).await; // plain commands on
    let mut lock = redlock.acquire(&[RES], TTL).await.expect("acquire");
    let token = lock.token().to_owned();
    lock.extend(TTL).await.expect("extend");
    servers.restart(1);
    let restarted = Instant::now();
    lock.extend(TTL).await.expect("four nodes confirm");
    assert_eq!(servers.get(1, RES), None, "quarantined: no repair");
    let deadline = restarted + Duration::from_secs(15);
    while servers.get(1, RES).as_deref() != Some(token.as_str()) {
        assert!(Instant::now() < deadline, "node 1 never repaired");
        tokio::time::sleep(Duration::from_millis(200)).await;
        lock.extend(TTL).await.expect("a majority confirms");
        if servers.get(1, RES).is_some() {
            break;
        }
    }
    assert!(
        restarted.elapsed() >= QUARANTINE - Duration::from_secs(1),
        "repaired {:?} after the restart, inside the quarantine",
        restarted.elapsed()
    );
    assert_eq!(servers.get(1, RES).as_deref(), Some(token.as_str()));
    lock.release().await.expect("release");
}

/// lock-delay on plain commands: server TTL is
/// `ttl + delay`, validity at most `ttl`, also after an extension.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey9_lock_delay_on_plain_commands() {
    const DELAY: Duration = Duration::from_secs(3);
    const TTL: Duration = Duration::from_secs(1);
    let servers = valkey9(3);
    let redlock = servers
        .builder()
        .lock_delay(DELAY)
        .node_timeout(PATIENT)
        .build()
        .expect("valid config");
    warm_up(&redlock).await;
    let mut lock = redlock.acquire(&[RES], TTL).await.expect("acquire");
    assert!(lock.remaining() <= TTL);
    for i in 0..3 {
        let pttl = servers.pttl(i, RES);
        assert!(pttl > 3_000 && pttl <= 4_000, "node {i}: {pttl}");
    }
    lock.extend(TTL).await.expect("extend");
    assert!(lock.remaining() <= TTL);
    for i in 0..3 {
        let pttl = servers.pttl(i, RES);
        assert!(
            pttl > 3_000 && pttl <= 4_000,
            "node {i} after extend: {pttl}"
        );
    }
    lock.release().await.expect("release");
    assert!(eventually(|| servers.on_every_node(RES, Option::is_none)).await);
}

/// a majority of servers restarted under a held
/// `using()` lock: the holder is told (the signal aborts) well before its keys could have
/// been valid elsewhere, since the quarantined servers' refusals count as refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_restart_aborts_the_holder() {
    let mut servers = Servers::start(5);
    let redlock = servers.patient();
    warm_up(&redlock).await;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let servers_ref = &mut servers;
    let scope = redlock.using(&[RES], Duration::from_secs(2), |signal| async move {
        let _ = tx.send(());
        let lost = tokio::time::timeout(Duration::from_secs(10), signal.aborted()).await;
        Ok::<_, Error>(lost.map(|e| e.to_string()))
    });
    let restart = async move {
        rx.await.expect("scope started");
        for i in 0..3 {
            servers_ref.restart(i);
        }
    };
    let (outcome, ()) = tokio::join!(scope, restart);
    let aborted = outcome.expect("scope");
    assert!(aborted.is_ok(), "the signal never aborted");
}
