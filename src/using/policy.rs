//! When the lease keeper of a `using()` lock extends, retries and gives up: the lock's
//! [`Schedule`], a pure function of the lease and an instant, so every decision is tested
//! without a clock.

use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::{InvalidInput, RenewalLimit};
use crate::lease::{Cause, Lease, Schedule, Step};
use crate::quorum;

/// The shortest pause between two extension rounds after a failed one.
const MIN_RETRY_INTERVAL: Duration = Duration::from_millis(1);

/// How the lease keeper of a `using()` lock schedules its rounds. Pure: every decision is a
/// function of the lease and an instant, so it is tested without a clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Policy {
    /// The TTL every extension renews the lock to.
    pub(super) ttl: Duration,
    /// Abort when less validity than this is left and no extension has confirmed the lock.
    pub(super) threshold: Duration,
    /// How long before the threshold extension rounds start.
    pub(super) lead: Duration,
    /// The pause after a failed round before the next one.
    pub(super) retry_interval: Duration,
    pub(super) max_extensions: Option<u32>,
    pub(super) max_hold: Option<Duration>,
}

impl Policy {
    /// The policy for a `using()` lock of `ttl`, the TTL checked first as any lock's
    /// ([`validate_ttl`](crate::inner::validate_ttl)): what every `using()` starts with.
    pub(crate) fn checked(config: &Config, ttl: Duration) -> Result<Policy, InvalidInput> {
        crate::inner::validate_ttl(ttl, config.drift_factor)
            .and_then(|ttl| Policy::new(config, ttl))
    }

    /// The policy for a `using()` lock of `ttl` (already validated by `Redlock::target`).
    pub(crate) fn new(config: &Config, ttl: Duration) -> Result<Policy, InvalidInput> {
        let policy = Policy::unbounded(config, ttl)?;
        // A first lease longer than max_hold would outlive the bound before any extension.
        if let Some(max_hold) = config.max_hold
            && ttl > max_hold
        {
            return Err(InvalidInput::TtlAboveMaxHold { ttl, max_hold });
        }
        Ok(Policy {
            max_extensions: config.max_extensions,
            max_hold: config.max_hold,
            ..policy
        })
    }

    /// The same policy without the builder's renewal bounds (`max_extensions`, `max_hold`):
    /// for a lock that a primitive holds for its own bookkeeping and bounds itself (a
    /// semaphore's line, held while its waiter's retries last).
    pub(crate) fn unbounded(config: &Config, ttl: Duration) -> Result<Policy, InvalidInput> {
        let threshold = config.extension_threshold;
        let drift = quorum::drift(ttl, config.drift_factor);
        // The most validity a lock of this TTL can have; it must leave room above the
        // threshold, or the signal would abort as soon as the routine starts.
        let best = ttl.saturating_sub(drift);
        if best <= threshold {
            return Err(InvalidInput::TtlNotAboveThreshold {
                ttl,
                threshold,
                drift,
            });
        }
        Ok(Policy {
            ttl,
            threshold,
            // At most half the time above the threshold, so that short TTLs are not
            // extended back to back.
            lead: threshold.min((best - threshold) / 2),
            retry_interval: (threshold / 5)
                .min(config.node_timeout)
                .max(MIN_RETRY_INTERVAL),
            max_extensions: None,
            max_hold: None,
        })
    }
}

impl Schedule for Policy {
    /// The next step for `lease`, seen at `now`. A step whose instant is not after `now` is
    /// due; asking again after sleeping until it returns it as due.
    fn step(&self, now: Instant, lease: &Lease) -> Step {
        let expires_at = lease.expires_at;
        if now >= expires_at {
            return Step::Abort {
                at: now,
                cause: Cause::Expired,
            };
        }
        // Without an extension confirmed by here, ownership is no longer guaranteed.
        let confirm_by = expires_at.checked_sub(self.threshold).unwrap_or(now);
        let give_up_at = confirm_by.max(now);
        if let Some(max) = self.max_extensions
            && lease.extensions >= max
        {
            return Step::Abort {
                at: give_up_at,
                cause: Cause::Limit(RenewalLimit::Extensions(max)),
            };
        }
        let at = match lease.failed_round {
            None => confirm_by.checked_sub(self.lead).unwrap_or(confirm_by),
            // Retries start `retry_interval` apart: a round that already took that long (a
            // node timed out) is followed at once.
            Some(started) => started.checked_add(self.retry_interval).unwrap_or(started),
        }
        .max(now);
        if let Some(max) = self.max_hold
            && let Some(hold_ends) = lease.acquired_at.checked_add(max)
            && at.checked_add(self.ttl).is_none_or(|ends| ends > hold_ends)
        {
            return Step::Abort {
                at: give_up_at,
                cause: Cause::Limit(RenewalLimit::Hold(max)),
            };
        }
        match lease.failed_round {
            // Rounds failed and no retry can start before the threshold: give up there.
            Some(_) if at >= confirm_by => Step::Abort {
                at: give_up_at,
                cause: Cause::Unconfirmed,
            },
            // Woken too late (a starved runtime) with nothing failed yet: one last round,
            // for as long as the validity lasts.
            None if at >= confirm_by => Step::Extend { at, by: expires_at },
            _ => Step::Extend { at, by: confirm_by },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn config(threshold: Duration) -> Config {
        Config {
            extension_threshold: threshold,
            ..Config::default()
        }
    }

    fn policy(ttl: Duration) -> Policy {
        Policy::new(&config(500 * MS), ttl).expect("valid ttl")
    }

    fn lease(t0: Instant, valid_for: Duration) -> Lease {
        Lease {
            acquired_at: t0,
            renewed_at: t0,
            expires_at: t0 + valid_for,
            extensions: 0,
            failed_round: None,
        }
    }

    #[test]
    fn ttl_must_leave_room_above_the_threshold() {
        // ttl - (ttl * 0.01 + 2 ms) > 500 ms needs ttl > 507.07 ms.
        let c = config(500 * MS);
        for ttl in [100 * MS, 500 * MS, 502 * MS, 507 * MS] {
            let e = Policy::new(&c, ttl).expect_err("too short");
            assert!(
                matches!(e, InvalidInput::TtlNotAboveThreshold { ttl: t, threshold, .. }
                    if t == ttl && threshold == 500 * MS),
                "{e:?}"
            );
        }
        assert!(Policy::new(&c, 508 * MS).is_ok());
    }

    #[test]
    fn a_first_lease_longer_than_max_hold_is_refused() {
        let c = Config {
            max_hold: Some(200 * MS),
            ..config(100 * MS)
        };
        let e = Policy::new(&c, Duration::from_secs(3)).expect_err("ttl above max_hold");
        assert_eq!(
            e,
            InvalidInput::TtlAboveMaxHold {
                ttl: Duration::from_secs(3),
                max_hold: 200 * MS
            }
        );
        assert!(Policy::new(&c, 200 * MS).is_ok());
    }

    #[test]
    fn lead_and_retry_interval() {
        // Long TTL: the lead is the whole threshold; retries every min(threshold/5, node_timeout).
        let p = policy(Duration::from_secs(5));
        assert_eq!(p.lead, 500 * MS);
        assert_eq!(p.retry_interval, 50 * MS); // node_timeout 50 ms < 100 ms
        // Short TTL: half the room above the threshold (1 s - 12 ms drift - 500 ms) / 2.
        assert_eq!(policy(Duration::from_secs(1)).lead, 244 * MS);
        let p = Policy::new(
            &Config {
                node_timeout: Duration::from_secs(1),
                ..config(200 * MS)
            },
            Duration::from_secs(5),
        )
        .expect("valid");
        assert_eq!(p.retry_interval, 40 * MS);
    }

    #[test]
    fn first_round_starts_a_lead_before_the_threshold() {
        let p = policy(Duration::from_secs(5));
        let t0 = Instant::now();
        let l = lease(t0, 4_900 * MS);
        let step = p.step(t0, &l);
        assert_eq!(
            step,
            Step::Extend {
                at: t0 + 3_900 * MS,
                by: t0 + 4_400 * MS
            }
        );
        // Asked again at the planned instant, the same round is due now.
        assert_eq!(
            p.step(t0 + 3_900 * MS, &l),
            Step::Extend {
                at: t0 + 3_900 * MS,
                by: t0 + 4_400 * MS
            }
        );
    }

    /// Runs the policy over simulated time; `round(k, start)` says how the k-th round goes:
    /// `Some(true)` succeeds, `Some(false)` fails, `None` outlives its deadline. Returns the
    /// rounds' start instants and the final abort (instant, cause, lease).
    fn simulate(
        p: &Policy,
        t0: Instant,
        valid_for: Duration,
        round_time: Duration,
        mut round: impl FnMut(usize, Instant) -> Option<bool>,
    ) -> (Vec<Instant>, Instant, Cause, Lease) {
        let mut l = lease(t0, valid_for);
        let mut now = t0;
        let mut starts = Vec::new();
        for _ in 0..10_000 {
            match p.step(now, &l) {
                Step::Abort { at, cause } if at <= now => return (starts, now, cause, l),
                Step::Extend { at, by } if at <= now => {
                    starts.push(now);
                    let k = starts.len() - 1;
                    match round(k, now) {
                        Some(true) if now + round_time <= by => {
                            // Validity counts from the round's start, as in `Lock::extend`.
                            l.expires_at = now + p.ttl - quorum::drift(p.ttl, 0.01);
                            l.extensions += 1;
                            l.failed_round = None;
                            now += round_time;
                        }
                        Some(false) if now + round_time <= by => {
                            l.failed_round = Some(now);
                            now += round_time;
                        }
                        _ => return (starts, by, Cause::Unconfirmed, l),
                    }
                }
                Step::Extend { at, .. } | Step::Abort { at, .. } => {
                    assert!(at > now, "a step in the past must be due");
                    now = at;
                }
            }
        }
        panic!("the policy never gave up");
    }

    #[test]
    fn failing_rounds_are_retried_then_abort_exactly_at_the_threshold() {
        let p = policy(Duration::from_secs(5));
        let t0 = Instant::now();
        let valid = 4_900 * MS;
        // Every round fails quickly (nodes refuse connections).
        let (starts, at, cause, _) = simulate(&p, t0, valid, 2 * MS, |_, _| Some(false));
        assert_eq!(cause, Cause::Unconfirmed);
        assert_eq!(
            at,
            t0 + valid - p.threshold,
            "aborts as the threshold is crossed"
        );
        assert_eq!(starts[0], t0 + valid - p.threshold - p.lead);
        // Retried every retry_interval (start to start), all before the threshold.
        for pair in starts.windows(2) {
            assert_eq!(pair[1] - pair[0], p.retry_interval);
        }
        assert_eq!(starts.len(), 10);
        assert!(starts.iter().all(|s| *s < at));

        // Rounds that time out at the node timeout (50 ms = the interval): as many rounds.
        let (starts, at, cause, _) = simulate(&p, t0, valid, 50 * MS, |_, _| Some(false));
        assert_eq!((at, cause), (t0 + valid - p.threshold, Cause::Unconfirmed));
        assert_eq!(starts.len(), 10);

        // Rounds slower than the interval are followed at once; the last one is cut short.
        let (starts, at, cause, _) = simulate(&p, t0, valid, 120 * MS, |_, _| Some(false));
        assert_eq!((at, cause), (t0 + valid - p.threshold, Cause::Unconfirmed));
        for pair in starts.windows(2) {
            assert_eq!(pair[1] - pair[0], 120 * MS);
        }
        assert_eq!(starts.len(), 5);
    }

    #[test]
    fn a_success_after_failures_resumes_the_normal_schedule() {
        let p = policy(Duration::from_secs(5));
        let t0 = Instant::now();
        // Rounds 0-2 fail, 3 succeeds, then the nodes are gone for good.
        let (starts, at, cause, l) = simulate(&p, t0, 4_900 * MS, 2 * MS, |k, _| Some(k == 3));
        assert_eq!(cause, Cause::Unconfirmed);
        assert_eq!(l.extensions, 1);
        // The round after the success waits for the new lease's extension point.
        let renewed = starts[3] + p.ttl - quorum::drift(p.ttl, 0.01);
        assert_eq!(starts[4], renewed - p.threshold - p.lead);
        assert_eq!(at, renewed - p.threshold);
    }

    #[test]
    fn healthy_rounds_keep_the_lock_forever_without_a_limit() {
        let p = policy(Duration::from_secs(1));
        let t0 = Instant::now();
        let mut l = lease(t0, 988 * MS);
        let mut now = t0;
        for _ in 0..1_000 {
            match p.step(now, &l) {
                Step::Extend { at, by } => {
                    assert!(by - at >= p.lead, "no retry window");
                    now = at + 5 * MS;
                    assert!(l.expires_at - now > p.threshold);
                    l.expires_at = at + 988 * MS;
                    l.extensions += 1;
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(now - t0 > Duration::from_secs(200));
    }

    #[test]
    fn max_extensions_aborts_when_the_next_extension_is_needed() {
        let p = Policy {
            max_extensions: Some(2),
            ..policy(Duration::from_secs(1))
        };
        let t0 = Instant::now();
        let (starts, at, cause, l) = simulate(&p, t0, 988 * MS, 3 * MS, |_, _| Some(true));
        assert_eq!(starts.len(), 2);
        assert_eq!(l.extensions, 2);
        assert_eq!(cause, Cause::Limit(RenewalLimit::Extensions(2)));
        assert_eq!(at, l.expires_at - p.threshold);
        // Zero: never extended, aborted at the first threshold.
        let p = Policy {
            max_extensions: Some(0),
            ..p
        };
        let (starts, at, cause, _) = simulate(&p, t0, 988 * MS, 3 * MS, |_, _| Some(true));
        assert!(starts.is_empty());
        assert_eq!(cause, Cause::Limit(RenewalLimit::Extensions(0)));
        assert_eq!(at, t0 + 488 * MS);
    }

    #[test]
    fn max_hold_bounds_the_life_of_the_lock() {
        let max = Duration::from_millis(2_500);
        let p = Policy {
            max_hold: Some(max),
            ..policy(Duration::from_secs(1))
        };
        let t0 = Instant::now();
        let (starts, at, cause, l) = simulate(&p, t0, 988 * MS, 3 * MS, |_, _| Some(true));
        assert_eq!(cause, Cause::Limit(RenewalLimit::Hold(max)));
        assert!(!starts.is_empty());
        // No extension lets the keys outlive max_hold; the signal aborts a threshold early.
        assert!(starts.iter().all(|s| *s + p.ttl <= t0 + max));
        assert!(l.expires_at <= t0 + max);
        assert_eq!(at, l.expires_at - p.threshold);
        // A max_hold that overflows an Instant is no limit.
        let p = Policy {
            max_hold: Some(Duration::MAX),
            ..p
        };
        let l = lease(t0, 988 * MS);
        assert!(matches!(p.step(t0, &l), Step::Extend { .. }));
    }

    #[test]
    fn a_late_wake_up_gets_one_last_round_then_gives_up() {
        let p = policy(Duration::from_secs(5));
        let t0 = Instant::now();
        let mut l = lease(t0, 4_900 * MS);
        // Starved past the threshold, nothing failed yet: one round, until the expiry.
        let late = t0 + 4_700 * MS;
        assert_eq!(
            p.step(late, &l),
            Step::Extend {
                at: late,
                by: l.expires_at
            }
        );
        // It failed: abort now.
        l.failed_round = Some(late);
        assert_eq!(
            p.step(late + 10 * MS, &l),
            Step::Abort {
                at: late + 10 * MS,
                cause: Cause::Unconfirmed
            }
        );
        // Past the expiry: expired, whatever else.
        assert_eq!(
            p.step(l.expires_at, &l),
            Step::Abort {
                at: l.expires_at,
                cause: Cause::Expired
            }
        );
    }
}
