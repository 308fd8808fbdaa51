//! `using()`'s schedule on the lease keeper, over a fake holding on a paused clock: the
//! max-hold bound ends renewal before the keys could outlive it, and the lock is kept until
//! the scope ends.

use std::sync::Arc;
use std::time::Duration;

use super::Policy;
use crate::clock;
use crate::config::Config;
use crate::error::{Error, RenewalLimit};
use crate::lease::tests::{FakeHolding, state};
use crate::lease::{Lease, OnLoss, keep};

const MS: Duration = Duration::from_millis(1);

#[tokio::test(start_paused = true)]
async fn the_keeper_stops_at_max_hold_and_keeps_the_lock_until_the_scope_ends() {
    let max = 2_500 * MS;
    let config = Config {
        extension_threshold: 500 * MS,
        max_hold: Some(max),
        ..Config::default()
    };
    let ttl = Duration::from_secs(1);
    let policy = Policy::new(&config, ttl).expect("valid");
    let t0 = clock::now();
    // 1 s minus 12 ms of drift.
    let (holding, seen) = FakeHolding::new(988 * MS, &[]);
    let lease = Lease::new(holding.expires_at, ttl, config.drift_factor);
    let s = state(988 * MS, 988 * MS, false);
    let keeper = tokio::spawn(keep(
        holding,
        policy,
        lease,
        Arc::clone(&s),
        OnLoss::HoldUntilStopped,
    ));
    let error = s.lost().await;
    assert!(
        matches!(
            error,
            Error::RenewalLimit {
                limit: RenewalLimit::Hold(m),
                ..
            } if m == max
        ),
        "{error:?}"
    );
    let lost_at = clock::now();
    let rounds = {
        let seen = seen.lock().expect("seen");
        assert!(!seen.rounds.is_empty());
        // No round could let the keys outlive max_hold, and the loss comes a threshold
        // before the validity ends.
        assert!(seen.rounds.iter().all(|r| *r + ttl <= t0 + max), "{seen:?}");
        assert_eq!(lost_at, s.expires_at() - 500 * MS);
        assert_eq!(seen.lost, 1);
        assert!(seen.released.is_none(), "kept until the scope ends");
        seen.rounds.len()
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = seen.lock().expect("seen").rounds.len();
    assert_eq!(after, rounds, "no round after the bound");
    s.stop();
    keeper.await.expect("keeper");
    assert!(seen.lock().expect("seen").released.is_some());
}
