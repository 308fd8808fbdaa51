//! The abort signal: a majority killed or paused mid-routine aborts before the lock
//! expires, and the lock is free for another owner afterwards.

use std::time::{Duration, Instant};

use redfence::{Error, Event, LossReason};

use crate::support::{Servers, TestRedlock, eventually};
use crate::{MS, PATIENT, abort_of, recorded};

#[tokio::test]
async fn killing_a_majority_aborts_before_the_lock_expires() {
    let mut servers = Servers::start(5);
    let (events, redlock) = recorded(servers.builder().node_timeout(200 * MS));
    let ttl = Duration::from_secs(2);
    let watch = events.clone();
    let killer = &mut servers;
    let (err, remaining, checked) = redlock
        .using(&["job"], ttl, |signal| async move {
            // Mid-routine, after the lock was renewed once.
            assert!(eventually(|| watch.extended() >= 1).await);
            for i in 0..3 {
                killer.kill(i);
            }
            let (err, remaining) = abort_of(&signal).await;
            Ok::<_, Error>((err, remaining, signal.check()))
        })
        .await
        .expect("using returns the routine's result");

    // Aborted while validity was left, with that validity in the reason: early, not late.
    assert!(remaining > Duration::ZERO, "aborted only after expiry");
    match &err {
        Error::LockLost {
            reason: LossReason::Unconfirmed {
                remaining: at_abort,
            },
            resources,
        } => {
            assert!(
                *at_abort > Duration::ZERO && *at_abort <= 500 * MS,
                "{at_abort:?}"
            );
            assert!(remaining <= *at_abort);
            assert_eq!(resources, &["job".to_string()]);
        }
        other => panic!("expected LockLost(Unconfirmed), got {other:?}"),
    }
    assert!(
        matches!(checked, Err(Error::LockLost { .. })),
        "{checked:?}"
    );

    // Every failed round reached the hook with the three dead nodes' errors.
    let failures: Vec<_> = events
        .all()
        .into_iter()
        .filter_map(|e| match e {
            Event::ExtensionFailed {
                error, remaining, ..
            } => Some((error, remaining)),
            _ => None,
        })
        .collect();
    let mut with_node_errors = 0;
    for (error, remaining) in &failures {
        match error {
            Error::QuorumUnreachable { errors, .. } => {
                let mut dead: Vec<_> = errors.iter().map(|e| e.index).collect();
                dead.sort();
                assert_eq!(dead, vec![0, 1, 2], "{error}");
                with_node_errors += 1;
            }
            // A round still running at the threshold is cut short (no node errors yet).
            Error::LockLost {
                reason: LossReason::Unconfirmed { .. },
                ..
            } => {}
            other => panic!("expected QuorumUnreachable, got {other:?}"),
        }
        assert!(*remaining > Duration::ZERO);
    }
    assert!(with_node_errors >= 1, "{failures:?}");
    assert_eq!(events.aborted(), 1);
    // The release reached only two nodes: reported, without hiding the routine's result.
    assert_eq!(
        events.count(|e| matches!(e, Event::ReleaseFailed { .. })),
        1
    );
    assert!(servers.keys(3).is_empty() && servers.keys(4).is_empty());
}

#[tokio::test]
async fn pausing_a_majority_longer_than_the_ttl_aborts_and_frees_the_lock() {
    let servers = Servers::start(5);
    let redlock = servers
        .builder()
        .node_timeout(200 * MS)
        .build()
        .expect("config");
    let ttl = Duration::from_secs(1);
    let pauser = &servers;
    let (err, remaining, paused_at) = redlock
        .using(&["job"], ttl, |signal| async move {
            for i in 0..3 {
                pauser.pause(i);
            }
            let paused_at = Instant::now();
            let (err, remaining) = abort_of(&signal).await;
            Ok::<_, Error>((err, remaining, paused_at))
        })
        .await
        .expect("using returns");
    assert!(
        matches!(
            err,
            Error::LockLost {
                reason: LossReason::Unconfirmed { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(remaining > Duration::ZERO);

    // Keep the majority paused for longer than the TTL, then resume it.
    tokio::time::sleep_until((paused_at + ttl + 200 * MS).into()).await;
    for i in 0..3 {
        servers.resume(i);
    }
    let other = servers
        .builder()
        .node_timeout(PATIENT)
        .retry_count(100)
        .build()
        .expect("config");
    let lock = other
        .acquire(&["job"], ttl)
        .await
        .expect("another owner acquires");
    assert!(servers.holders("job", lock.token(), 0..5).len() >= 3);
    lock.release().await.expect("release");
}

#[tokio::test]
async fn failed_rounds_are_retried_a_retry_interval_apart() {
    let mut servers = Servers::start(3);
    // Retries every min(threshold / 5, node_timeout) = 20 ms: below the 25 ms grid that first
    // rounds are aligned to. (Node calls themselves get a timeout a loaded machine meets.)
    let retry_interval = 20 * MS;
    let failed_at = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
    let sink = failed_at.clone();
    let redlock = servers
        .builder()
        .node_timeout(PATIENT)
        .automatic_extension_threshold(retry_interval * 5)
        .on_event(move |e: &Event| {
            if matches!(e, Event::ExtensionFailed { .. }) {
                sink.lock().expect("failures").push(Instant::now());
            }
        })
        .build()
        .expect("config");
    let killer = &mut servers;
    let killed = redlock
        .using(&["job"], Duration::from_secs(2), |signal| async move {
            // Refused connections: every round fails at once.
            killer.kill(0);
            killer.kill(1);
            let killed = Instant::now();
            abort_of(&signal).await;
            Ok::<_, Error>(killed)
        })
        .await
        .expect("using returns the routine's result");

    let failed: Vec<Instant> = failed_at
        .lock()
        .expect("failures")
        .iter()
        .copied()
        .filter(|at| *at >= killed)
        .collect();
    let (Some(first), Some(last)) = (failed.first(), failed.last()) else {
        panic!("no failed round after the majority died");
    };
    // Round starts are at least a retry interval apart, and each ends within a node timeout
    // of its start: n rounds span at least (n - 2) intervals.
    let span = last.duration_since(*first);
    let most = span.as_millis() / retry_interval.as_millis() + 2;
    assert!(
        failed.len() as u128 <= most,
        "{} failed rounds in {span:?}: retried faster than every {retry_interval:?}",
        failed.len()
    );
}
