//! Lease keeping (`Lock::extend`, the lease keeper, `Signal`, election) against real
//! redis-server processes, from an adversarial review: each test failed before its fix.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redfence::{Error, FencingCounter, LossReason, MemoryCounter, Redlock};
use support::proxy::{Mode, Proxy};
use support::{DEADLINE, Servers, TestRedlock, eventually, warm_up};
use tokio::sync::mpsc;

const MS: Duration = Duration::from_millis(1);

/// A Redlock over a proxy in front of each server (all passing traffic for now), with node
/// calls patient enough for the delays the tests add.
async fn proxied(servers: &Servers) -> (Vec<Proxy>, Redlock) {
    let proxies = Proxy::in_front_of_each(&servers.urls(), Mode::Pass).await;
    let redlock = Redlock::builder()
        .nodes(proxies.iter().map(Proxy::url))
        .node_timeout(Duration::from_secs(3))
        .retry_count(0)
        .build()
        .expect("config");
    warm_up(&redlock).await;
    (proxies, redlock)
}

/// An extension never revives a lock that expired: a round that starts while the lock is
/// valid but lands after its keys expired on the nodes finds them gone, and setting them
/// again there ("E", a repair) is no confirmation: the answer is `NotHeld`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_confirmed_after_the_local_expiry_does_not_revive_the_lock() {
    let servers = Servers::start(3);
    let (proxies, redlock) = proxied(&servers).await;
    // Every chunk, both ways, 200 ms late: a round trip takes 400 ms.
    let delay = 200 * MS;
    for proxy in &proxies {
        proxy.set(Mode::Delay(delay));
    }
    let ttl = Duration::from_millis(1_500);
    let mut lock = redlock.acquire(&["job"], ttl).await.expect("acquired");
    let old_expiry = lock.expires_at();
    // Start the round 100 ms before the validity ends: its answers come 400 ms later.
    tokio::time::sleep_until(tokio::time::Instant::from_std(old_expiry - 100 * MS)).await;
    assert!(
        !lock.is_expired(),
        "setup: the round starts while the lock is valid"
    );
    let result = lock.extend(ttl).await;
    let confirmed = Instant::now();
    assert!(
        confirmed > old_expiry,
        "setup: the answers came before the old expiry"
    );
    assert!(
        result.is_err(),
        "the majority answered {:?} after the lock's validity had ended, yet the extension \
         succeeded ({result:?}) and the lock is valid again for {:?}",
        confirmed - old_expiry,
        lock.remaining()
    );
}

/// The signal's `remaining()` reports no validity for a lock that is gone: once the scope
/// released it, a kept clone is aborted (`Released`) and reports zero (it once reported the
/// old validity).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_kept_after_the_scope_reports_no_validity() {
    let servers = Servers::start(3);
    let redlock = servers.patient();
    warm_up(&redlock).await;
    let kept = redlock
        .using(&["job"], Duration::from_secs(5), |signal| async move {
            Ok::<_, Error>(signal.clone())
        })
        .await
        .expect("using");
    assert!(
        eventually(|| (0..3).all(|i| servers.get(i, "job").is_none())).await,
        "released"
    );
    assert!(matches!(
        kept.error(),
        Some(Error::LockLost {
            reason: LossReason::Released,
            ..
        })
    ));
    assert_eq!(
        kept.remaining(),
        Duration::ZERO,
        "the lock is released on every node, yet the signal reports validity left"
    );
}

/// Same, when a majority answered that the keys are no longer ours (NotHeld: another owner
/// holds them): the signal is aborted and `remaining()` is zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_aborted_by_not_held_reports_no_validity() {
    let servers = Servers::start(3);
    let redlock = servers.patient();
    let other = servers.patient();
    warm_up(&redlock).await;
    warm_up(&other).await;
    let nodes = &servers;
    let other = &other;
    let (error, remaining, _b) = redlock
        .using(
            &["job"],
            Duration::from_millis(3_000),
            |signal| async move {
                held_on_every_node(nodes, signal.token()).await;
                for i in 0..3 {
                    let _: i64 = nodes.cmd(i, &["DEL", "job"]);
                }
                // Another owner takes the lock and keeps it.
                let b = other
                    .acquire(&["job"], Duration::from_secs(30))
                    .await
                    .expect("B acquires: A's keys are gone");
                let error = tokio::time::timeout(DEADLINE, signal.aborted())
                    .await
                    .expect("aborted");
                Ok::<_, Error>((error, signal.remaining(), b))
            },
        )
        .await
        .expect("using");
    assert!(
        matches!(
            error,
            Error::LockLost {
                reason: LossReason::NotHeld { .. },
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        remaining,
        Duration::ZERO,
        "a majority said the keys are another owner's, yet the signal reports validity left"
    );
}

async fn held_on_every_node(servers: &Servers, token: &str) {
    assert!(
        eventually(|| (0..servers.len()).all(|i| servers.get(i, "job").as_deref() == Some(token)))
            .await,
        "held on every node"
    );
}

/// Once A's keys are gone from every node (force release, eviction, early expiry on the
/// servers) and another owner B has taken the lock and released it, A's keeper reports the
/// loss (NotHeld) instead of setting A's keys again and keeping A's signal un-aborted as if A
/// had held the lock throughout B's tenure: extensions still repair missing keys ("E",
/// scripts/batch.lua extend_repair), but a repaired key no longer counts as a confirmation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keeper_does_not_revive_a_lock_another_owner_took_and_released() {
    let servers = Servers::start(3);
    let redlock = servers.patient();
    let other = servers.patient();
    warm_up(&redlock).await;
    warm_up(&other).await;
    let nodes = &servers;
    let other = &other;
    let (aborted_while_b_held, b_token, outcome) = redlock
        .using(
            &["job"],
            Duration::from_millis(2_000),
            |signal| async move {
                held_on_every_node(nodes, signal.token()).await;
                for i in 0..3 {
                    let _: i64 = nodes.cmd(i, &["DEL", "job"]);
                }
                let b = other
                    .acquire(&["job"], Duration::from_secs(5))
                    .await
                    .expect("B acquires: A's keys are gone");
                let b_token = b.token().to_owned();
                let aborted_while_b_held = signal.is_aborted();
                tokio::time::sleep(200 * MS).await;
                b.release().await.expect("B releases");
                // A learns of the loss at its next round. (That round may set A's keys again
                // where they are missing, a repair that does not count as a confirmation;
                // the scope's release takes them away.)
                let outcome = tokio::time::timeout(DEADLINE, signal.aborted()).await;
                Ok::<_, Error>((aborted_while_b_held, b_token, outcome))
            },
        )
        .await
        .expect("using");
    let _ = (aborted_while_b_held, b_token);
    match outcome {
        Ok(error) => assert!(
            matches!(
                error,
                Error::LockLost {
                    reason: LossReason::NotHeld { .. },
                    ..
                }
            ),
            "{error:?}"
        ),
        Err(_) => panic!(
            "B held and released the lock while A's signal was un-aborted, and A's next rounds \
             went on: A never learns that someone else owned the lock meanwhile"
        ),
    }
    // Nothing of A is left once its scope ended.
    assert!(
        eventually(|| servers.on_every_node("job", Option::is_none)).await,
        "A's keys set again by its last round outlived its scope"
    );
}

/// The same with a plain `Lock`: an extension that starts while A's lock is valid but is held
/// up in the network while A's keys expire and B acquires and releases, lands afterwards,
/// sets A's keys again and returns Ok: A's lock is then valid from the round's start, across
/// B's whole tenure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_extension_does_not_set_again_a_lock_another_owner_held_meanwhile() {
    let servers = Servers::start(3);
    let (proxies, redlock) = proxied(&servers).await;
    let other = servers.patient();
    warm_up(&other).await;
    let mut lock = redlock
        .acquire(&["job"], Duration::from_millis(1_000))
        .await
        .expect("A acquires");
    let a_expiry = lock.expires_at();
    tokio::time::sleep_until(tokio::time::Instant::from_std(a_expiry - 100 * MS)).await;
    for proxy in &proxies {
        proxy.set(Mode::Blackhole);
    }
    let round_started = Instant::now();
    let extension = tokio::spawn(async move {
        let result = lock.extend(Duration::from_secs(10)).await;
        (result, lock)
    });
    // A's keys expire on the servers; B takes the lock, works, releases.
    let b = loop {
        match other.try_acquire(&["job"], Duration::from_secs(5)).await {
            Ok(b) => break b,
            Err(_) if Instant::now() < round_started + DEADLINE => {
                tokio::time::sleep(20 * MS).await;
            }
            Err(err) => panic!("B never got the lock: {err}"),
        }
    };
    let b_held = (Instant::now(), b.token().to_owned());
    tokio::time::sleep(100 * MS).await;
    b.release().await.expect("B releases");
    let b_released = Instant::now();
    for proxy in &proxies {
        proxy.set(Mode::Pass);
    }
    let (result, lock) = extension.await.expect("task");
    let a_valid_from = round_started;
    assert!(
        result.is_err(),
        "A's extension started at {:?}, B held the lock from {:?} to {:?} (token {}), yet A's \
         extension returned {result:?}: A's lock is valid again for {:?}, i.e. A owned it \
         throughout B's tenure",
        Duration::ZERO,
        b_held.0 - a_valid_from,
        b_released - a_valid_from,
        &b_held.1[..8],
        lock.remaining()
    );
}

/// Resign really releases: a candidate that holds the election's lock (its acquisition
/// answering, or its record being written) does not go on to lead after `resign()` returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resign_while_the_record_is_written_is_not_ignored() {
    let servers = Servers::start(3);
    let proxies = Proxy::in_front_of_each(&servers.urls(), Mode::Pass).await;
    let counter: Arc<dyn FencingCounter> = Arc::new(MemoryCounter::new());
    let redlock = Redlock::builder()
        .nodes(proxies.iter().map(Proxy::url))
        .node_timeout(Duration::from_secs(2))
        .fencing(Arc::clone(&counter))
        .build()
        .expect("config");
    warm_up(&redlock).await;
    let election = redlock
        .election("resign-race", Some("candidate-0"))
        .lease(Duration::from_secs(3))
        .renew_deadline(Duration::from_millis(1_500))
        .retry_period(Duration::from_millis(400))
        .build()
        .expect("election");
    let lock_key = election.lock_key().to_owned();
    // Round trips of 300 ms: the record write after the win takes that long.
    for proxy in &proxies {
        proxy.set(Mode::Delay(150 * MS));
    }
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let runner = election.clone();
    let run = tokio::spawn(async move {
        runner
            .run(|leadership| {
                let started_tx = started_tx.clone();
                async move {
                    let _ = started_tx.send((Instant::now(), leadership.is_lost()));
                    let error = leadership.lost().await;
                    Err::<(), Error>(error)
                }
            })
            .await
    });
    // The candidate has won once its token is on a majority of nodes.
    assert!(
        eventually(|| (0..3)
            .filter(|&i| servers.get(i, &lock_key).is_some())
            .count()
            >= 2)
        .await,
        "elected"
    );
    election.resign().await;
    let resigned = Instant::now();
    if let Ok(Some((at, lost))) = tokio::time::timeout(Duration::from_secs(2), started.recv()).await
    {
        let held = (0..3)
            .filter(|&i| servers.get(i, &lock_key).is_some())
            .count();
        assert!(
            lost,
            "resign() returned while this candidate held the lock, yet {:?} later its routine \
             started with an un-aborted Leadership (lock still on {held} nodes)",
            at.saturating_duration_since(resigned)
        );
    }
    run.abort();
}
