//! When the keeper renews: a [`Schedule`] is a pure function from the [`Lease`] (as the
//! keeper tracks it) and an instant to the next [`Step`] — a renewal round, due at some
//! instant and with a deadline, or giving up at some instant. `using()`'s
//! [`Policy`](crate::using::Policy) and election's timing are the two schedules; being pure,
//! both are tested without a clock.
//!
//! First rounds may be moved back to a 25 ms grid (counted from a process-wide origin), so
//! that the rounds of many leases that fall due within the same 25 ms start together and
//! share each node's batched call.

use std::time::{Duration, Instant};

use crate::clock;
use crate::error::RenewalLimit;
use crate::quorum;

/// When a keeper renews, retries and gives up. Pure: every decision is a function of the
/// lease and an instant.
pub(crate) trait Schedule: Send + 'static {
    /// The next step for `lease`, seen at `now`. A step whose instant is not after `now` is
    /// due; asking again after sleeping until it returns it as due.
    fn step(&self, now: Instant, lease: &Lease) -> Step;

    /// Until when `lease` is guaranteed without another renewal: past it, its views report
    /// the loss on their own, even if the keeper could not run. The validity end unless the
    /// schedule guarantees less (election's renew deadline).
    fn deadline(&self, lease: &Lease) -> Instant {
        lease.expires_at
    }

    /// Whether first rounds (not retries) start on the 25 ms grid, shared with other leases.
    fn on_grid(&self) -> bool {
        true
    }
}

/// Where a lease stands, as the keeper tracks it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Lease {
    /// The start of the winning acquire round.
    pub(crate) acquired_at: Instant,
    /// The start of the last successful round (the acquire round before the first renewal):
    /// the validity counts from it.
    pub(crate) renewed_at: Instant,
    /// The end of the validity.
    pub(crate) expires_at: Instant,
    /// Successful renewals so far.
    pub(crate) extensions: u32,
    /// When the last failed round started, if none has succeeded since.
    pub(crate) failed_round: Option<Instant>,
}

impl Lease {
    /// A lease just acquired with `ttl`, valid until `expires_at` (the start of the winning
    /// round plus `ttl` minus the drift allowance).
    pub(crate) fn new(expires_at: Instant, ttl: Duration, drift_factor: f64) -> Self {
        let valid_for = ttl.saturating_sub(quorum::drift(ttl, drift_factor));
        let acquired_at = expires_at.checked_sub(valid_for).unwrap_or(expires_at);
        Lease {
            acquired_at,
            renewed_at: acquired_at,
            expires_at,
            extensions: 0,
            failed_round: None,
        }
    }

    /// A round started at `started` renewed the lease until `expires_at`.
    pub(crate) fn renewed(&mut self, started: Instant, expires_at: Instant) {
        self.renewed_at = started;
        self.expires_at = expires_at;
        self.extensions = self.extensions.saturating_add(1);
        self.failed_round = None;
    }
}

/// What the keeper does next.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Step {
    /// At `at`, make a renewal round that must succeed by `by`.
    Extend {
        /// When to start the round.
        at: Instant,
        /// The round's deadline: past it, ownership can no longer be guaranteed.
        by: Instant,
    },
    /// At `at`, lose the lease and stop renewing.
    Abort {
        /// When to give up.
        at: Instant,
        /// Why.
        cause: Cause,
    },
}

impl Step {
    /// When the step is due.
    pub(crate) fn at(&self) -> Instant {
        match *self {
            Step::Extend { at, .. } | Step::Abort { at, .. } => at,
        }
    }
}

/// Why the keeper gives up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Cause {
    /// The validity ran out.
    Expired,
    /// Rounds failed until ownership could no longer be guaranteed.
    Unconfirmed,
    /// A renewal bound was reached.
    Limit(RenewalLimit),
}

/// The grid first renewal rounds are aligned to.
const GRID: Duration = Duration::from_millis(25);

/// When a round planned for `at` starts: a first round on the grid (when the schedule
/// shares it), a retry at `at`.
pub(crate) fn start_of(at: Instant, lease: &Lease, on_grid: bool) -> Instant {
    if on_grid && lease.failed_round.is_none() {
        grid(at)
    } else {
        at
    }
}

/// `at`, moved back to the previous multiple of [`GRID`] (counted from a process-wide
/// origin): rounds of many leases that fall due within the same 25 ms then wake at the same
/// instant, start together, and their requests go to each node in one batched call. Never
/// later than `at`, so the schedule's deadlines hold.
fn grid(at: Instant) -> Instant {
    let origin = clock::origin();
    match at.checked_duration_since(origin) {
        Some(since) => {
            let back = since.as_nanos() % GRID.as_nanos();
            at - Duration::from_nanos(u64::try_from(back).unwrap_or(0))
        }
        None => at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn first_rounds_move_back_to_the_grid_and_retries_do_not() {
        let origin = clock::origin();
        let mut lease = Lease::new(origin + 5_000 * MS, Duration::from_secs(5), 0.01);
        for (at, start) in [
            (1_000, 1_000),
            (1_024, 1_000),
            (1_025, 1_025),
            (1_049, 1_025),
        ] {
            assert_eq!(
                start_of(origin + at * MS, &lease, true),
                origin + start * MS
            );
            // A schedule off the grid, and a retry, start when planned.
            assert_eq!(start_of(origin + at * MS, &lease, false), origin + at * MS);
        }
        lease.failed_round = Some(origin);
        assert_eq!(
            start_of(origin + 1_049 * MS, &lease, true),
            origin + 1_049 * MS
        );
    }

    #[test]
    fn a_new_lease_counts_from_its_winning_round() {
        let t0 = clock::now();
        // 5 s at drift factor 0.01: 52 ms of drift.
        let lease = Lease::new(t0 + 4_948 * MS, Duration::from_secs(5), 0.01);
        assert_eq!((lease.acquired_at, lease.renewed_at), (t0, t0));
        let mut renewed = lease;
        renewed.failed_round = Some(t0 + MS);
        renewed.renewed(t0 + 2 * MS, t0 + 9 * MS);
        assert_eq!(renewed.renewed_at, t0 + 2 * MS);
        assert_eq!(renewed.expires_at, t0 + 9 * MS);
        assert_eq!(renewed.extensions, 1);
        assert_eq!(renewed.failed_round, None);
        assert_eq!(renewed.acquired_at, t0);
    }
}
