//! An election's [`Timing`] — lease, renew deadline, retry period — checked against
//! client-go's rule, and the leader's renewals as a [`Schedule`] of the lease keeper: a round
//! every retry period, each (and every retry) due by the renew deadline.

use std::time::{Duration, Instant};

use crate::error::{ConfigError, Error};
use crate::inner::validate_ttl;
use crate::lease::{Cause, Lease, Schedule, Step};
use crate::quorum;

/// An election's timing, validated by [`Timing::validate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Timing {
    pub(super) lease: Duration,
    pub(super) renew_deadline: Duration,
    pub(super) retry_period: Duration,
    /// How long before the end of the lock's validity the renew deadline falls:
    /// `lease − drift(lease) − renew_deadline`, positive once validated.
    pub(super) margin: Duration,
}

impl Timing {
    /// Checks client-go's rule, `lease > renew_deadline > 1.2 × retry_period > 0`, and that
    /// the renew deadline falls within the lease's validity (`lease − drift`), so that the
    /// signal always fires before the lease can run out.
    pub(super) fn validate(
        lease: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
        drift_factor: f64,
    ) -> Result<Timing, Error> {
        let lease = validate_ttl(lease, drift_factor)?;
        let bad = ConfigError::ElectionTiming {
            lease,
            renew_deadline,
            retry_period,
        };
        // 1.2 × retry_period, without float overflow: 6/5 of it.
        let jittered = retry_period.checked_mul(6).map(|d| d / 5);
        let validity = lease.saturating_sub(quorum::drift(lease, drift_factor));
        match jittered {
            Some(jittered)
                if !retry_period.is_zero()
                    && renew_deadline > jittered
                    && lease > renew_deadline
                    && validity > renew_deadline =>
            {
                Ok(Timing {
                    lease,
                    renew_deadline,
                    retry_period,
                    margin: validity - renew_deadline,
                })
            }
            _ => Err(bad.into()),
        }
    }
}

impl Schedule for Timing {
    /// A round `retry_period` after the start of the last one (successful or not), due by
    /// the renew deadline; giving up at the deadline when no round can start before it.
    fn step(&self, now: Instant, lease: &Lease) -> Step {
        let deadline = self.deadline(lease);
        if now >= deadline {
            let cause = if now >= lease.expires_at {
                Cause::Expired
            } else {
                Cause::Unconfirmed
            };
            return Step::Abort { at: now, cause };
        }
        let last = lease.failed_round.unwrap_or(lease.renewed_at);
        let at = last
            .checked_add(self.retry_period)
            .unwrap_or(deadline)
            .max(now);
        if at >= deadline {
            Step::Abort {
                at: deadline,
                cause: Cause::Unconfirmed,
            }
        } else {
            Step::Extend { at, by: deadline }
        }
    }

    /// The renew deadline: the start of the last successful round plus `renew_deadline`,
    /// which is `margin` before the lock's validity ends.
    fn deadline(&self, lease: &Lease) -> Instant {
        lease
            .expires_at
            .checked_sub(self.margin)
            .unwrap_or(lease.renewed_at)
    }

    /// Off the grid: one lease per election, its rounds seconds apart, on client-go's
    /// instants.
    fn on_grid(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);

    fn timing() -> Timing {
        Timing::validate(15 * S, 10 * S, 2 * S, 0.01).expect("client-go's defaults")
    }

    /// A lease elected at `t0`: 15 s minus 152 ms of drift.
    fn elected(t: &Timing, t0: Instant) -> Lease {
        Lease::new(t0 + 14_848 * MS, t.lease, 0.01)
    }

    #[test]
    fn renewals_every_retry_period_due_by_the_renew_deadline() {
        let t = timing();
        let t0 = Instant::now();
        let mut lease = elected(&t, t0);
        assert_eq!(t.deadline(&lease), t0 + 10 * S);
        assert_eq!(
            t.step(t0, &lease),
            Step::Extend {
                at: t0 + 2 * S,
                by: t0 + 10 * S
            }
        );
        // Renewed at 2 s: the next round at 4 s, the deadline at 12 s.
        lease.renewed(t0 + 2 * S, t0 + 2 * S + 14_848 * MS);
        assert_eq!(t.deadline(&lease), t0 + 12 * S);
        assert_eq!(
            t.step(t0 + 2 * S, &lease),
            Step::Extend {
                at: t0 + 4 * S,
                by: t0 + 12 * S
            }
        );
    }

    #[test]
    fn failed_rounds_are_retried_every_period_then_give_up_at_the_deadline() {
        let t = timing();
        let t0 = Instant::now();
        let mut lease = elected(&t, t0);
        let mut starts = Vec::new();
        let mut now = t0;
        let (at, cause) = loop {
            match t.step(now, &lease) {
                Step::Extend { at, by } if at <= now => {
                    assert_eq!(by, t0 + 10 * S);
                    starts.push(now);
                    lease.failed_round = Some(now);
                    now += 100 * MS; // the round fails after 100 ms
                }
                Step::Abort { at, cause } if at <= now => break (at, cause),
                step => now = step.at(),
            }
        };
        let ms = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(starts, [ms(2), ms(4), ms(6), ms(8)]);
        assert_eq!((at, cause), (t0 + 10 * S, Cause::Unconfirmed));
        // Past the validity: expired.
        let late = lease.expires_at;
        assert_eq!(
            t.step(late, &lease),
            Step::Abort {
                at: late,
                cause: Cause::Expired
            }
        );
    }

    #[test]
    fn timing_stays_off_the_grid() {
        assert!(!timing().on_grid());
    }
}
