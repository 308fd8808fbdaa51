//! The keeper and its state on a paused clock, with a fake holding: a loss is set and
//! announced once, views see it with the right reason, a lost lease is released when the
//! holder chose, a cut-off round loses the lease, and a dropped keeper still closes it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::clock;
use crate::error::{Error, LossReason, RenewalLimit};

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

/// How a fake round goes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Round {
    /// Renewed for the holding's TTL from the round's start.
    Renew,
    /// Fails (nodes unreachable).
    Fail,
    /// A majority says the keys are not ours.
    NotHeld,
    /// Never answers.
    Hang,
}

/// What a fake holding saw.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub(crate) rounds: Vec<Instant>,
    pub(crate) renewed: usize,
    pub(crate) failed: Vec<Error>,
    pub(crate) lost: usize,
    pub(crate) released: Option<Instant>,
}

/// A holding whose rounds go as scripted (then renew), each taking `round_time`.
pub(crate) struct FakeHolding {
    pub(crate) expires_at: Instant,
    pub(crate) ttl: Duration,
    pub(crate) round_time: Duration,
    pub(crate) script: VecDeque<Round>,
    pub(crate) seen: Arc<Mutex<Seen>>,
}

impl FakeHolding {
    pub(crate) fn new(ttl: Duration, script: &[Round]) -> (Self, Arc<Mutex<Seen>>) {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let holding = FakeHolding {
            expires_at: clock::now() + ttl,
            ttl,
            round_time: MS,
            script: script.iter().copied().collect(),
            seen: Arc::clone(&seen),
        };
        (holding, seen)
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().expect("seen")
    }
}

impl Holding for FakeHolding {
    fn expires_at(&self) -> Instant {
        self.expires_at
    }

    async fn extend(&mut self) -> Result<(), Error> {
        let started = clock::now();
        self.seen().rounds.push(started);
        let round = self.script.pop_front().unwrap_or(Round::Renew);
        if let Round::Hang = round {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(self.round_time).await;
        let lost = |reason| Error::LockLost {
            resources: vec!["r".into()],
            reason,
        };
        match round {
            Round::Renew => {
                self.expires_at = started + self.ttl;
                Ok(())
            }
            Round::NotHeld => Err(lost(LossReason::NotHeld {
                confirmed: 1,
                quorum: 2,
            })),
            Round::Fail | Round::Hang => Err(Error::Closed),
        }
    }

    async fn renewed(&mut self, _lease: &Lease, _next: Instant) {
        self.seen().renewed += 1;
    }

    fn failed(&mut self, error: &Error) {
        self.seen().failed.push(error.clone());
    }

    fn lost(&mut self) {
        self.seen().lost += 1;
    }

    async fn release(self, _resources: &[String]) {
        self.seen().released = Some(clock::now());
    }
}

/// A round `period` after the last one, due by the expiry; a renewal bound after `max`
/// extensions.
struct Every {
    period: Duration,
    max: Option<u32>,
}

impl Schedule for Every {
    fn step(&self, now: Instant, lease: &Lease) -> Step {
        if now >= lease.expires_at {
            return Step::Abort {
                at: now,
                cause: Cause::Expired,
            };
        }
        if let Some(max) = self.max
            && lease.extensions >= max
        {
            // A second before the expiry (the state itself gives up at the expiry).
            let at = lease.expires_at.checked_sub(S).unwrap_or(now).max(now);
            return Step::Abort {
                at,
                cause: Cause::Limit(RenewalLimit::Extensions(max)),
            };
        }
        let last = lease.failed_round.unwrap_or(lease.renewed_at);
        let at = (last + self.period).max(now);
        if at >= lease.expires_at {
            Step::Abort {
                at: lease.expires_at,
                cause: Cause::Unconfirmed,
            }
        } else {
            Step::Extend {
                at,
                by: lease.expires_at,
            }
        }
    }

    fn on_grid(&self) -> bool {
        false
    }
}

/// A subject that counts its announcements.
#[derive(Default)]
pub(crate) struct Counted(pub(crate) Mutex<Vec<Error>>);

impl Subject for Counted {
    fn announce(&self, _resources: &[String], error: &Error) {
        if let Ok(mut seen) = self.0.lock() {
            seen.push(error.clone());
        }
    }
}

impl Counted {
    pub(crate) fn count(&self) -> usize {
        self.0.lock().map(|v| v.len()).unwrap_or(0)
    }
}

pub(crate) fn state(
    valid_for: Duration,
    deadline: Duration,
    announce: bool,
) -> Arc<LeaseState<Counted>> {
    let now = clock::now();
    let closing = Closing {
        reason: LossReason::Released,
        announce,
    };
    let times = Times {
        deadline: now + deadline,
        expires_at: now + valid_for,
    };
    Arc::new(LeaseState::new(
        Arc::from(vec!["r".to_string()]),
        Counted::default(),
        closing,
        times,
    ))
}

fn reason(error: &Error) -> Option<&LossReason> {
    match error {
        Error::LockLost { reason, .. } => Some(reason),
        _ => None,
    }
}

#[tokio::test(start_paused = true)]
async fn a_loss_is_set_and_announced_once_and_wakes_every_view() {
    let s = state(60 * S, 60 * S, false);
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let s = Arc::clone(&s);
            tokio::spawn(async move { s.lost().await })
        })
        .collect();
    tokio::task::yield_now().await;
    let t = clock::now();
    s.abort(s.loss(LossReason::NotHeld {
        confirmed: 0,
        quorum: 2,
    }));
    s.abort(s.loss(LossReason::Expired));
    s.close();
    for waiter in waiters {
        let error = waiter.await.expect("waiter");
        assert!(
            matches!(reason(&error), Some(LossReason::NotHeld { .. })),
            "{error:?}"
        );
    }
    assert_eq!(clock::now(), t, "woken without waiting");
    assert_eq!(s.subject().count(), 1, "one announcement");
    assert!(matches!(
        s.error().and_then(reason),
        Some(LossReason::NotHeld { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn closing_is_announced_only_when_asked_and_never_after_a_loss() {
    let quiet = state(60 * S, 60 * S, false);
    quiet.close();
    assert_eq!(quiet.error().and_then(reason), Some(&LossReason::Released));
    assert_eq!(quiet.subject().count(), 0);
    let loud = state(60 * S, 60 * S, true);
    loud.close();
    assert_eq!(loud.subject().count(), 1);
    // Renewals after the end change nothing.
    let later = clock::now() + 600 * S;
    loud.renewed(Times {
        deadline: later,
        expires_at: later,
    });
    assert!(loud.deadline() < later);
}

#[tokio::test(start_paused = true)]
async fn past_the_deadline_the_state_loses_the_lease_on_its_own() {
    // Deadline at 10 s, validity to 15 s: Unconfirmed with 5 s left.
    let s = state(15 * S, 10 * S, false);
    let t0 = clock::now();
    let error = s.lost().await;
    assert_eq!(clock::now(), t0 + 10 * S);
    assert_eq!(
        reason(&error),
        Some(&LossReason::Unconfirmed { remaining: 5 * S })
    );
    assert_eq!(s.subject().count(), 1);
    // Deadline at the expiry: Expired.
    let s = state(5 * S, 5 * S, false);
    tokio::time::sleep(5 * S).await;
    assert_eq!(s.error().and_then(reason), Some(&LossReason::Expired));
}

/// Runs a keeper of `holding` on `Every { period: 1 s }` over `state`.
fn spawn_keeper(
    holding: FakeHolding,
    max: Option<u32>,
    state: &Arc<LeaseState<Counted>>,
    on_loss: OnLoss,
) -> tokio::task::JoinHandle<()> {
    let lease = Lease {
        acquired_at: clock::now(),
        renewed_at: clock::now(),
        expires_at: holding.expires_at,
        extensions: 0,
        failed_round: None,
    };
    let schedule = Every { period: S, max };
    tokio::spawn(keep(holding, schedule, lease, Arc::clone(state), on_loss))
}

#[tokio::test(start_paused = true)]
async fn the_keeper_renews_on_schedule_and_releases_when_stopped() {
    let t0 = clock::now();
    let (holding, seen) = FakeHolding::new(3 * S, &[Round::Renew, Round::Fail]);
    let s = state(3 * S, 3 * S, false);
    let keeper = spawn_keeper(holding, None, &s, OnLoss::HoldUntilStopped);
    tokio::time::sleep(5_500 * MS).await;
    {
        let seen = seen.lock().expect("seen");
        // 1 s renews; 2 s fails, retried at 3 s; then 4 s, 5 s.
        let rounds: Vec<_> = seen.rounds.iter().map(|r| *r - t0).collect();
        assert_eq!(rounds, [S, 2 * S, 3 * S, 4 * S, 5 * S]);
        assert_eq!((seen.renewed, seen.failed.len()), (4, 1));
        assert!(seen.released.is_none());
    }
    assert!(s.error().is_none());
    assert_eq!(s.expires_at(), t0 + 5 * S + 3 * S);
    s.stop();
    s.ended().await;
    keeper.await.expect("keeper");
    let seen = seen.lock().expect("seen");
    assert_eq!(seen.released, Some(t0 + 5_500 * MS));
    assert_eq!(seen.lost, 0);
    assert_eq!(s.error().and_then(reason), Some(&LossReason::Released));
    assert_eq!(s.subject().count(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_is_held_until_stopped_or_released_at_once() {
    for on_loss in [OnLoss::HoldUntilStopped, OnLoss::Release] {
        let t0 = clock::now();
        let (holding, seen) = FakeHolding::new(3 * S, &[Round::Renew, Round::NotHeld]);
        let s = state(3 * S, 3 * S, false);
        let keeper = spawn_keeper(holding, None, &s, on_loss);
        let error = s.lost().await;
        assert_eq!(clock::now(), t0 + 2 * S + MS);
        assert!(matches!(reason(&error), Some(LossReason::NotHeld { .. })));
        tokio::time::sleep(10 * S).await;
        {
            let seen = seen.lock().expect("seen");
            assert_eq!(
                (seen.rounds.len(), seen.lost),
                (2, 1),
                "no round after a loss"
            );
            match on_loss {
                OnLoss::Release => assert_eq!(seen.released, Some(t0 + 2 * S + MS)),
                OnLoss::HoldUntilStopped => assert_eq!(seen.released, None),
            }
        }
        s.stop();
        keeper.await.expect("keeper");
        assert!(seen.lock().expect("seen").released.is_some());
        assert!(matches!(
            s.error().and_then(reason),
            Some(LossReason::NotHeld { .. })
        ));
        assert_eq!(s.subject().count(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_round_that_outlives_its_deadline_loses_the_lease() {
    let t0 = clock::now();
    let (holding, seen) = FakeHolding::new(3 * S, &[Round::Hang]);
    let s = state(3 * S, 3 * S, false);
    let keeper = spawn_keeper(holding, None, &s, OnLoss::Release);
    keeper.await.expect("keeper");
    // The round started at 1 s and was cut off at the expiry, 3 s.
    assert_eq!(clock::now(), t0 + 3 * S);
    assert_eq!(s.error().and_then(reason), Some(&LossReason::Expired));
    let seen = seen.lock().expect("seen");
    assert_eq!(seen.failed.len(), 1, "the cut-off round is reported");
    assert_eq!(s.subject().count(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_renewal_bound_gives_up_with_renewal_limit() {
    let t0 = clock::now();
    let (holding, seen) = FakeHolding::new(3 * S, &[]);
    let s = state(3 * S, 3 * S, false);
    let keeper = spawn_keeper(holding, Some(2), &s, OnLoss::Release);
    keeper.await.expect("keeper");
    // Renewed at 1 s and 2 s (until 5 s), then the bound: aborted a second before.
    assert_eq!(clock::now(), t0 + 4 * S);
    assert!(matches!(
        s.error(),
        Some(Error::RenewalLimit {
            limit: RenewalLimit::Extensions(2),
            ..
        })
    ));
    assert_eq!(seen.lock().expect("seen").rounds.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_keeper_still_closes_its_lease() {
    let (holding, _seen) = FakeHolding::new(3 * S, &[]);
    let s = state(3 * S, 3 * S, false);
    let keeper = spawn_keeper(holding, None, &s, OnLoss::Release);
    tokio::time::sleep(1_500 * MS).await;
    keeper.abort();
    let _ = keeper.await;
    assert_eq!(s.error().and_then(reason), Some(&LossReason::Released));
    // `ended` resolves: a resign waiting for the step-down is not left hanging.
    tokio::time::timeout(S, s.ended()).await.expect("ended");
}
