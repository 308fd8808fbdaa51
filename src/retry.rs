//! Retry schedules: how often and how long `acquire` waits between attempts, as a finite
//! iterator of durations.

use std::time::Duration;

use rand::Rng;

/// How many times `acquire` retries, and how long it waits before each retry.
///
/// A schedule is just a finite iterator of delays ([`Backoff::delays`]): one delay per retry,
/// so it is easy to test and to reason about. Jitter desynchronises clients that lost the
/// same race, so that they do not all retry at the same instant.
///
/// ```
/// use std::time::Duration;
/// use redfence::Backoff;
///
/// let backoff = Backoff::exponential(Duration::from_millis(10), Duration::from_secs(1)).retries(5);
/// assert_eq!(backoff.delays().count(), 5);
/// assert!(backoff.delays().all(|d| d <= Duration::from_secs(1)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    schedule: Schedule,
    retries: u32,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Schedule {
    /// `delay` plus or minus a uniformly random `jitter` (never below zero).
    Fixed { delay: Duration, jitter: Duration },
    /// Before retry `k` (from 0), a uniformly random time in `[0, min(max, base * 2^k)]`.
    Exponential { base: Duration, max: Duration },
}

/// node-redlock's retry count.
const DEFAULT_RETRIES: u32 = 10;
/// node-redlock's delay between attempts.
const DEFAULT_DELAY: Duration = Duration::from_millis(200);
/// node-redlock's jitter either way of the delay.
const DEFAULT_JITTER: Duration = Duration::from_millis(100);

impl Backoff {
    /// node-redlock's defaults: 10 retries, each after 200 ms ± 100 ms.
    pub const DEFAULT: Backoff = Backoff {
        schedule: Schedule::Fixed {
            delay: DEFAULT_DELAY,
            jitter: DEFAULT_JITTER,
        },
        retries: DEFAULT_RETRIES,
    };

    /// node-redlock's schedule: `delay` plus or minus a uniformly random `jitter` (never below
    /// zero) before every retry; 10 retries unless [`retries`](Self::retries) says otherwise.
    pub fn fixed(delay: Duration, jitter: Duration) -> Self {
        Backoff {
            schedule: Schedule::Fixed { delay, jitter },
            retries: DEFAULT_RETRIES,
        }
    }

    /// Exponential backoff with "full jitter": before retry `k` (from 0), a uniformly random
    /// time in `[0, min(max, base * 2^k)]`. Spreads a thundering herd best. 10 retries unless
    /// [`retries`](Self::retries) says otherwise. `base` must not exceed `max`
    /// (`build()` checks it).
    pub fn exponential(base: Duration, max: Duration) -> Self {
        Backoff {
            schedule: Schedule::Exponential { base, max },
            retries: DEFAULT_RETRIES,
        }
    }

    /// The same schedule with `retries` retries after the first attempt (so up to
    /// `retries + 1` attempts).
    #[must_use]
    pub fn retries(self, retries: u32) -> Self {
        Backoff { retries, ..self }
    }

    /// How many retries follow a failed first attempt.
    pub fn max_retries(&self) -> u32 {
        self.retries
    }

    /// The delays before each retry, in order: exactly [`max_retries`](Self::max_retries) of
    /// them.
    pub fn delays(&self) -> impl Iterator<Item = Duration> + use<> {
        let schedule = self.schedule;
        (0..self.retries).map(move |k| crate::random::with(|rng| schedule.delay(k, rng)))
    }

    /// The fixed schedule with base `delay`, keeping this one's jitter if it is fixed (the
    /// default jitter otherwise) and its retry count.
    pub(crate) fn with_delay(self, delay: Duration) -> Self {
        let (_, jitter) = self.fixed_parts();
        self.fixed_with(delay, jitter)
    }

    /// The fixed schedule with `jitter`, keeping this one's delay if it is fixed (the default
    /// delay otherwise) and its retry count.
    pub(crate) fn with_jitter(self, jitter: Duration) -> Self {
        let (delay, _) = self.fixed_parts();
        self.fixed_with(delay, jitter)
    }

    /// The delay and jitter of this schedule if it is fixed, the default's otherwise.
    fn fixed_parts(self) -> (Duration, Duration) {
        match self.schedule {
            Schedule::Fixed { delay, jitter } => (delay, jitter),
            Schedule::Exponential { .. } => (DEFAULT_DELAY, DEFAULT_JITTER),
        }
    }

    /// The fixed schedule of `delay` and `jitter`, with this one's retry count.
    fn fixed_with(self, delay: Duration, jitter: Duration) -> Self {
        Backoff {
            schedule: Schedule::Fixed { delay, jitter },
            ..self
        }
    }

    /// The longest delay this schedule can wait before a retry.
    pub(crate) fn longest_delay(&self) -> Duration {
        match self.schedule {
            Schedule::Fixed { delay, jitter } => delay.saturating_add(jitter),
            Schedule::Exponential { max, .. } => max,
        }
    }

    /// Why this schedule cannot work, if it cannot.
    pub(crate) fn check(&self) -> Result<(), String> {
        match self.schedule {
            Schedule::Exponential { base, max } if base > max => Err(format!(
                "the base delay {base:?} exceeds the maximum {max:?}"
            )),
            _ => Ok(()),
        }
    }
}

impl Schedule {
    fn delay(self, retry: u32, rng: &mut (impl Rng + ?Sized)) -> Duration {
        match self {
            Schedule::Fixed { delay, jitter } => {
                // In u128 nanoseconds, so that no sum or product saturates into a shorter
                // delay: `delay ± jitter`, clamped to [0, the longest u64 of nanoseconds].
                let jitter_ns = jitter.as_nanos();
                if jitter_ns == 0 {
                    return delay;
                }
                let offset = rng.random_range(0..=jitter_ns.saturating_mul(2));
                let ns = (delay.as_nanos() + offset).saturating_sub(jitter_ns);
                Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
            }
            Schedule::Exponential { base, max } => {
                let factor = 1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX);
                let cap = base.checked_mul(factor).unwrap_or(max).min(max);
                let cap_ns = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
                Duration::from_nanos(rng.random_range(0..=cap_ns))
            }
        }
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn endless(b: Backoff) -> impl Iterator<Item = Duration> {
        b.retries(u32::MAX).delays()
    }

    #[test]
    fn fixed_stays_within_jitter() {
        let delays: Vec<_> = endless(Backoff::fixed(200 * MS, 100 * MS))
            .take(500)
            .collect();
        assert!(delays.iter().all(|d| (100 * MS..=300 * MS).contains(d)));
        // Jitter actually varies the delays.
        assert!(delays.iter().any(|d| *d < 150 * MS));
        assert!(delays.iter().any(|d| *d > 250 * MS));
    }

    #[test]
    fn fixed_never_negative() {
        let b = Backoff::fixed(10 * MS, 100 * MS);
        assert!(endless(b).take(200).all(|d| d <= 110 * MS));
    }

    #[test]
    fn fixed_without_jitter_is_exact() {
        let b = Backoff::fixed(50 * MS, Duration::ZERO);
        assert!(endless(b).take(10).all(|d| d == 50 * MS));
    }

    #[test]
    fn the_schedule_owns_its_retry_count() {
        assert_eq!(Backoff::DEFAULT.delays().count(), 10);
        assert_eq!(Backoff::DEFAULT.retries(0).delays().count(), 0);
        let b = Backoff::DEFAULT
            .retries(3)
            .with_delay(30 * MS)
            .with_jitter(5 * MS);
        assert_eq!(b, Backoff::fixed(30 * MS, 5 * MS).retries(3));
        // From an exponential schedule, a delay alone keeps the default jitter.
        let b = Backoff::exponential(MS, 2 * MS).with_delay(30 * MS);
        assert_eq!(b, Backoff::fixed(30 * MS, 100 * MS));
    }

    #[test]
    fn huge_values_never_collapse_into_short_delays() {
        // Before: delay + offset saturated at u64::MAX nanoseconds, minus the jitter: 0 ms.
        let b = Backoff::fixed(Duration::MAX, Duration::MAX);
        let hour = Duration::from_secs(3_600);
        let long = endless(b).take(200).filter(|d| *d > hour).count();
        assert!(long > 150, "only {long} of 200 delays above an hour");
        let b = Backoff::fixed(Duration::MAX, Duration::from_secs(1));
        assert!(endless(b).take(50).all(|d| d > hour));
    }

    #[test]
    fn exponential_caps_grow_then_saturate() {
        let s = Schedule::Exponential {
            base: 10 * MS,
            max: 80 * MS,
        };
        let mut rng = rand::rng();
        for k in 0..40 {
            let cap = (10 * MS * 2u32.saturating_pow(k.min(20))).min(80 * MS);
            for _ in 0..50 {
                assert!(s.delay(k, &mut rng) <= cap, "retry {k}");
            }
        }
        // Full jitter: late retries spread over the whole [0, max] range.
        let late: Vec<_> = (0..400).map(|_| s.delay(30, &mut rng)).collect();
        assert!(late.iter().any(|d| *d < 20 * MS));
        assert!(late.iter().any(|d| *d > 60 * MS));
    }

    #[test]
    fn a_base_above_the_max_is_refused() {
        assert!(Backoff::exponential(2 * MS, MS).check().is_err());
        assert!(Backoff::exponential(MS, 2 * MS).check().is_ok());
    }
}
