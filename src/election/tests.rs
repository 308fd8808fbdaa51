//! Elections over fake nodes on a paused clock: client-go's timing rule, the record, the
//! callbacks that fire only for a candidate that led, and the signal firing at the renew
//! deadline, before the lease. The real-server suite is `tests/election.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::timing::Timing;
use super::*;
use crate::error::{ConfigError, LossReason};
use crate::node::Op;
use crate::testing::fake::{Fake, FakeNode};
use crate::{MemoryCounter, Redlock, RedlockBuilder};

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

fn over(n: usize, builder: RedlockBuilder) -> (Vec<Arc<FakeNode>>, Redlock) {
    builder.build_over_fakes(n)
}

fn fenced(n: usize) -> (Vec<Arc<FakeNode>>, Redlock) {
    over(n, RedlockBuilder::new().fencing(MemoryCounter::new()))
}

#[test]
fn timing_follows_client_go() {
    let ms = Duration::from_millis;
    let ok = |l, d, r| Timing::validate(ms(l), ms(d), ms(r), 0.01).is_ok();
    assert!(ok(15_000, 10_000, 2_000));
    assert!(ok(2_000, 1_500, 500));
    // lease must exceed the renew deadline, and by the drift allowance (15 s: 152 ms).
    assert!(!ok(10_000, 10_000, 2_000));
    assert!(!ok(10_100, 10_000, 2_000));
    assert!(ok(10_200, 10_000, 2_000));
    // renew deadline must exceed 1.2 x retry period.
    assert!(!ok(15_000, 2_400, 2_000));
    assert!(ok(15_000, 2_401, 2_000));
    // a zero retry period, a zero lease, an overflowing retry period.
    assert!(!ok(15_000, 10_000, 0));
    assert!(Timing::validate(Duration::ZERO, S, MS, 0.01).is_err());
    assert!(Timing::validate(15 * S, 10 * S, Duration::MAX, 0.01).is_err());
    let err = Timing::validate(S, 2 * S, 100 * MS, 0.01).expect_err("deadline above lease");
    assert!(matches!(
        err,
        Error::Config(ConfigError::ElectionTiming { .. })
    ));
}

#[tokio::test]
async fn build_checks_fencing_name_and_identity_before_any_traffic() {
    let (fakes, plain) = over(3, RedlockBuilder::new());
    let err = plain.election("e", None).build().expect_err("no counter");
    assert!(matches!(
        err,
        Error::Config(ConfigError::ElectionWithoutFencing)
    ));
    let (_, redlock) = fenced(3);
    for (name, identity) in [("", None), ("e", Some(""))] {
        let err = redlock.election(name, identity).build().expect_err("empty");
        assert!(matches!(err, Error::Config(ConfigError::BadOption { .. })));
    }
    let err = redlock
        .election("e", None)
        .renew_deadline(20 * S)
        .build()
        .expect_err("renew deadline above the lease");
    assert!(matches!(
        err,
        Error::Config(ConfigError::ElectionTiming { .. })
    ));
    assert!(fakes.iter().all(|f| f.calls().is_empty()));

    let election = redlock.election("e", None).build().expect("defaults");
    assert_eq!(election.lock_key(), "election:{e}");
    assert_eq!(election.record_key(), "election:{e}:leader");
    assert_eq!(
        (
            election.lease(),
            election.renew_deadline(),
            election.retry_period()
        ),
        (15 * S, 10 * S, 2 * S)
    );
    // Host name, a dash, a UUID (36 characters).
    let identity = election.identity();
    assert!(identity.len() > 37, "{identity}");
    assert!(uuid::Uuid::parse_str(&identity[identity.len() - 36..]).is_ok());
    assert_ne!(default_identity(), default_identity());
}

#[test]
fn records_round_trip_and_reject_garbage() {
    let leader = Leader {
        identity: "host a-1".into(),
        term: 42,
    };
    let value = record::encode(&leader, "tok");
    assert_eq!(value, "42 tok host a-1");
    assert_eq!(record::decode(&value), Some((leader, "tok")));
    for bad in ["", "42", "42 tok", "x tok id", "42  id"] {
        assert_eq!(record::decode(bad), None, "{bad:?}");
    }
}

/// Counts the callbacks of an election.
#[derive(Default)]
struct Calls {
    started: AtomicUsize,
    stopped: AtomicUsize,
}

fn counted(builder: ElectionBuilder, calls: &Arc<Calls>) -> ElectionBuilder {
    let (a, b) = (Arc::clone(calls), Arc::clone(calls));
    builder
        .on_started_leading(move |_| {
            a.started.fetch_add(1, Ordering::SeqCst);
        })
        .on_stopped_leading(move |_| {
            b.stopped.fetch_add(1, Ordering::SeqCst);
        })
}

#[tokio::test(start_paused = true)]
async fn a_candidate_that_never_led_gets_no_callback() {
    let (fakes, redlock) = fenced(3);
    for f in &fakes {
        f.put("election:{e}", "someone else", 3600 * S);
    }
    let calls = Arc::new(Calls::default());
    let election = counted(redlock.election("e", Some("me")), &calls)
        .build()
        .expect("config");
    let campaign = election.run(|_| async { Ok::<(), Error>(()) });
    // Campaigns for 9 s, then is cancelled (client-go #1187 fired OnStoppedLeading here).
    assert!(tokio::time::timeout(9 * S, campaign).await.is_err());
    let attempts = fakes[0]
        .calls()
        .iter()
        .filter(|op| **op == Op::Acquire)
        .count();
    // Every 2 s stretched by up to 20 % (jitter): at 0, 2–2.4, 4–4.8, 6–7.2, 8–9.6 s.
    assert!((4..=5).contains(&attempts), "{attempts} attempts in 9 s");
    assert_eq!(calls.started.load(Ordering::SeqCst), 0);
    assert_eq!(calls.stopped.load(Ordering::SeqCst), 0);
    assert_eq!(election.leader().await.expect("read"), None);
}

#[tokio::test(start_paused = true)]
async fn the_signal_fires_at_the_renew_deadline_before_the_lease_ends() {
    let (fakes, redlock) = fenced(3);
    let calls = Arc::new(Calls::default());
    let election = counted(
        redlock
            .election("e", Some("me"))
            .lease(15 * S)
            .renew_deadline(10 * S)
            .retry_period(2 * S),
        &calls,
    )
    .build()
    .expect("config");
    let t0 = Instant::now();
    let (term, fired, reason, seen) = election
        .run(|leadership| {
            let (watcher, fakes_in) = (election.clone(), fakes.clone());
            async move {
                let leader = watcher.leader().await.expect("read");
                assert_eq!(leader.as_ref(), Some(leadership.leader()));
                // Renewals succeed for 5 s, then every node fails them.
                tokio::time::sleep(5 * S).await;
                assert!(!leadership.is_lost());
                let last_success = t0 + 4 * S; // rounds at 2 s and 4 s
                for f in &fakes_in {
                    f.set(Op::Extend, Fake::Fail);
                }
                let error = leadership.lost().await;
                let fired = Instant::now();
                assert_eq!(fired, last_success + 10 * S);
                // The keys still hold the lock: the lease (from 4 s, 15 s) has 5 s left.
                assert!(fakes_in.iter().all(|f| f.holder("election:{e}").is_some()));
                Ok::<_, Error>((leadership.term(), fired, error, leadership.remaining()))
            }
        })
        .await
        .expect("one term");
    assert_eq!(term, 1);
    assert!(fired < t0 + 4 * S + 15 * S);
    assert!(matches!(
        reason,
        Error::LockLost {
            reason: LossReason::Unconfirmed { .. },
            ..
        }
    ));
    assert_eq!(seen, Duration::ZERO);
    assert_eq!(calls.started.load(Ordering::SeqCst), 1);
    assert_eq!(calls.stopped.load(Ordering::SeqCst), 1);
    // Stepped down: the record and the lock are gone.
    assert!(fakes.iter().all(|f| f.holder("election:{e}").is_none()));
    assert!(
        fakes
            .iter()
            .all(|f| f.holder("election:{e}:leader").is_none())
    );
    assert_eq!(election.leader().await.expect("read"), None);
}

#[tokio::test(start_paused = true)]
async fn resign_releases_at_once_and_rejoin_campaigns_again() {
    let (fakes, redlock) = fenced(3);
    let election = redlock
        .election("e", Some("me"))
        .rejoin(true)
        .build()
        .expect("config");
    let terms = Arc::new(AtomicUsize::new(0));
    let result = election
        .run(|leadership| {
            let (handle, count, fakes_in) = (election.clone(), Arc::clone(&terms), fakes.clone());
            async move {
                if count.fetch_add(1, Ordering::SeqCst) == 1 {
                    return Ok(leadership.term()); // second term: done
                }
                let t = Instant::now();
                handle.resign().await;
                assert!(t.elapsed() < 100 * MS, "resign waits for the release only");
                assert!(fakes_in.iter().all(|f| f.holder("election:{e}").is_none()));
                Err(leadership.lost().await)
            }
        })
        .await
        .expect("the second term ends run");
    assert_eq!(result, 2, "terms increase");
    assert_eq!(terms.load(Ordering::SeqCst), 2);
}

/// A node that never answers the record's write, with a node timeout near the renew
/// deadline: the write is advisory and cut off at the next renewal, so renewals stay on time
/// and leadership holds. (Waiting out the node timeout pushed the next renewal past the
/// deadline.)
#[tokio::test(start_paused = true)]
async fn a_hung_record_write_does_not_delay_the_next_renewal() {
    let (fakes, redlock) = over(
        3,
        RedlockBuilder::new()
            .fencing(MemoryCounter::new())
            .node_timeout(11 * S),
    );
    fakes[0].hang_writes();
    let election = redlock
        .election("e", Some("me"))
        .lease(15 * S)
        .renew_deadline(10 * S)
        .retry_period(2 * S)
        .build()
        .expect("config");
    let held = election
        .run(|leadership| async move {
            tokio::time::sleep(30 * S).await;
            Ok::<_, Error>(!leadership.is_lost())
        })
        .await
        .expect("one term");
    assert!(held, "leadership was lost to a hung record write");
}
