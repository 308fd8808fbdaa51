//! An election's [`Timing`] — lease, renew deadline, retry period — checked against
//! client-go's rule.

use std::time::Duration;

use crate::error::{ConfigError, Error};
use crate::inner::validate_ttl;
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
