//! Retry schedules: how long to wait between acquire attempts, as an iterator of durations.

use std::time::Duration;

use rand::Rng;

/// How long `acquire` waits between attempts.
///
/// A schedule is just an iterator of delays ([`Backoff::delays`]), so it is easy to test and
/// to reason about. Jitter desynchronises clients that lost the same race, so that they do
/// not all retry at the same instant.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Backoff {
    /// node-redlock's schedule: `delay` plus or minus a uniformly random `jitter`
    /// (never below zero) before every retry.
    Fixed {
        /// The base delay.
        delay: Duration,
        /// The largest random deviation from `delay`, either way.
        jitter: Duration,
    },
    /// Exponential backoff with "full jitter": before retry `k` (from 0) wait a uniformly
    /// random time in `[0, min(max, base * 2^k)]`. Spreads a thundering herd best.
    Exponential {
        /// The cap of the first retry's delay.
        base: Duration,
        /// The largest delay ever waited.
        max: Duration,
    },
}

impl Backoff {
    /// node-redlock's defaults: 200 ms ± 100 ms.
    pub const DEFAULT: Backoff = Backoff::Fixed {
        delay: Duration::from_millis(200),
        jitter: Duration::from_millis(100),
    };

    /// An exponential full-jitter schedule starting at `base` and capped at `max`.
    pub fn exponential(base: Duration, max: Duration) -> Self {
        Backoff::Exponential { base, max }
    }

    /// The delays before each retry, in order: an endless iterator; `retry_count` bounds it.
    pub fn delays(self) -> impl Iterator<Item = Duration> {
        (0u32..).map(move |k| self.delay(k, &mut rand::rng()))
    }

    fn delay(self, retry: u32, rng: &mut impl Rng) -> Duration {
        match self {
            Backoff::Fixed { delay, jitter } => {
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
            Backoff::Exponential { base, max } => {
                let factor = 1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX);
                let cap = base.checked_mul(factor).unwrap_or(max).min(max);
                let cap_ns = saturating_nanos(cap);
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

fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn fixed_stays_within_jitter() {
        let b = Backoff::Fixed {
            delay: 200 * MS,
            jitter: 100 * MS,
        };
        let delays: Vec<_> = b.delays().take(500).collect();
        assert!(delays.iter().all(|d| (100 * MS..=300 * MS).contains(d)));
        // Jitter actually varies the delays.
        assert!(delays.iter().any(|d| *d < 150 * MS));
        assert!(delays.iter().any(|d| *d > 250 * MS));
    }

    #[test]
    fn fixed_never_negative() {
        let b = Backoff::Fixed {
            delay: 10 * MS,
            jitter: 100 * MS,
        };
        assert!(b.delays().take(200).all(|d| d <= 110 * MS));
    }

    #[test]
    fn fixed_without_jitter_is_exact() {
        let b = Backoff::Fixed {
            delay: 50 * MS,
            jitter: Duration::ZERO,
        };
        assert!(b.delays().take(10).all(|d| d == 50 * MS));
    }

    #[test]
    fn huge_values_never_collapse_into_short_delays() {
        // Before: delay + offset saturated at u64::MAX nanoseconds, minus the jitter: 0 ms.
        let b = Backoff::Fixed {
            delay: Duration::MAX,
            jitter: Duration::MAX,
        };
        let hour = Duration::from_secs(3_600);
        let long = b.delays().take(200).filter(|d| *d > hour).count();
        assert!(long > 150, "only {long} of 200 delays above an hour");
        let b = Backoff::Fixed {
            delay: Duration::MAX,
            jitter: Duration::from_secs(1),
        };
        assert!(b.delays().take(50).all(|d| d > hour));
    }

    #[test]
    fn exponential_caps_grow_then_saturate() {
        let b = Backoff::exponential(10 * MS, 80 * MS);
        let mut rng = rand::rng();
        for k in 0..40 {
            let cap = (10 * MS * 2u32.saturating_pow(k.min(20))).min(80 * MS);
            for _ in 0..50 {
                assert!(b.delay(k, &mut rng) <= cap, "retry {k}");
            }
        }
        // Full jitter: late retries spread over the whole [0, max] range.
        let late: Vec<_> = (0..400).map(|_| b.delay(30, &mut rng)).collect();
        assert!(late.iter().any(|d| *d < 20 * MS));
        assert!(late.iter().any(|d| *d > 60 * MS));
    }
}
