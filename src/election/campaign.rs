//! [`Election::run`](super::Election::run): campaign, lead one term, step down, and perhaps
//! campaign again.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::builder::{Hook, Inner};
use super::leadership::{Leadership, Tenure};
use super::record::Leader;
use super::renewal::Renewal;
use crate::clock;
use crate::error::{ConfigError, Error, LossReason};
use crate::guard::Finishing;
use crate::lease::{self, Lease, OnLoss, Schedule, StopOnDrop, Times};
use crate::lock::Lock;
use crate::retry::Backoff;

pub(super) async fn run<T, E, F, Fut>(inner: &Arc<Inner>, mut routine: F) -> Result<T, E>
where
    F: FnMut(Leadership) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: From<Error>,
{
    loop {
        let (lock, resigns) = campaign(inner).await?;
        match lead(inner, lock, resigns, &mut routine).await {
            Err(_) if inner.rejoin => {
                tracing::info!(election = %inner.name, "term ended with an error; campaigning again");
                tokio::time::sleep(jittered(inner.timing.retry_period)).await;
            }
            result => return result,
        }
    }
}

/// Tries to take the election's lock once every retry period until it succeeds, or until
/// an error that another attempt cannot fix. With the lock, how many resigns had been asked
/// for when the winning attempt started.
async fn campaign(inner: &Inner) -> Result<(Lock, u64), Error> {
    loop {
        let started = clock::now();
        let resigns = inner.resigns.load(Ordering::SeqCst);
        match inner
            .redlock
            .try_acquire(&[&inner.resource], inner.timing.lease)
            .await
        {
            Ok(lock) => return Ok((lock, resigns)),
            Err(error @ (Error::InvalidInput(_) | Error::Config(_) | Error::Closed)) => {
                return Err(error);
            }
            Err(error) => {
                tracing::debug!(election = %inner.name, %error, "not elected; trying again");
            }
        }
        let next = started + jittered(inner.timing.retry_period);
        tokio::time::sleep_until(tokio::time::Instant::from_std(next)).await;
    }
}

/// A retry period stretched by a random 0–20 % (client-go's jitter factor 1.2): candidates
/// started together drift apart instead of trying at the same instants forever, where each
/// node could see them in a different order and none win a majority (a split vote).
fn jittered(period: Duration) -> Duration {
    // The crate's fixed schedule, centred on 1.1 × period, ± 0.1 × period.
    let half = period.mul_f64(JITTER / 2.0);
    Backoff::fixed(period + half, half)
        .delays()
        .next()
        .unwrap_or(period)
}

/// The largest share of a retry period added as jitter.
const JITTER: f64 = 0.2;

/// Leads one term with `lock`: writes the record, hands the lock to a lease keeper on the
/// election's timing, runs the routine, then stops the keeper (which steps down) and waits
/// for it. `resigns`: the resigns asked for when the winning attempt started; one asked for
/// since makes the term start resigned.
async fn lead<T, E, F, Fut>(
    inner: &Arc<Inner>,
    lock: Lock,
    resigns: u64,
    routine: &mut F,
) -> Result<T, E>
where
    F: FnMut(Leadership) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: From<Error>,
{
    // Built only with a fencing counter, so every lock carries a fence.
    let Some(term) = lock.fence() else {
        return Err(E::from(ConfigError::ElectionWithoutFencing.into()));
    };
    let leader = Leader {
        identity: inner.identity.clone(),
        term,
    };
    let timing = inner.timing;
    let lease = Lease::new(
        lock.expires_at(),
        lock.ttl(),
        inner.shared.config.drift_factor,
    );
    let times = Times {
        deadline: timing.deadline(&lease),
        expires_at: lease.expires_at,
    };
    let tenure = Tenure {
        leader: leader.clone(),
    };
    let state = Arc::new(tenure.lease(inner.resource.clone(), times));
    let renewal = Renewal::new(lock, inner, leader.clone());
    let leadership = Leadership {
        state: Arc::clone(&state).into(),
    };
    // From here on the term counts as led: `on_stopped_leading` runs however it ends, and
    // `Election::resign` finds it, also while the record is being written (the routine then
    // starts with its signal aborted, and the keeper releases the lock at once).
    let _term = Term::start(inner, leadership.clone());
    // A resign asked for while the attempt was in flight (before the term was registered,
    // so that it found nothing to resign): the term starts resigned.
    if inner.resigns.load(Ordering::SeqCst) != resigns {
        state.abort(state.loss(LossReason::Resigned));
        state.stop();
    }
    // Advisory, and cut off at the first renewal: a slow node must not delay the term.
    let written = tokio::time::timeout(timing.retry_period, renewal.write_record())
        .await
        .ok();
    tracing::info!(election = %inner.name, %leader, records = ?written, "elected");
    // Dropped (the routine returned, or the candidate shut down midway), the keeper steps
    // down, and `Redlock::close` waits for it.
    let stop = StopOnDrop(Arc::clone(&state));
    let keeper = lease::keep(renewal, timing, lease, state, OnLoss::Release);
    let task = Finishing::spawn(&inner.shared.tasks, keeper);
    let result = routine(leadership).await;
    drop(stop);
    if let Err(error) = task.join().await {
        tracing::error!(election = %inner.name, ?error, "election lease keeper failed");
    }
    result
}

/// A term this candidate leads: registered for `Election::resign`, announced to
/// `on_started_leading`; on drop, unregistered and announced to `on_stopped_leading`.
struct Term<'a> {
    inner: &'a Inner,
    leader: Leader,
}

impl<'a> Term<'a> {
    fn start(inner: &'a Inner, leadership: Leadership) -> Self {
        let leader = leadership.leader().clone();
        if let Ok(mut current) = inner.current.lock() {
            *current = Some(leadership);
        }
        call(inner.hooks.started.as_ref(), &leader, "on_started_leading");
        Term { inner, leader }
    }
}

impl Drop for Term<'_> {
    fn drop(&mut self) {
        if let Ok(mut current) = self.inner.current.lock() {
            *current = None;
        }
        call(
            self.inner.hooks.stopped.as_ref(),
            &self.leader,
            "on_stopped_leading",
        );
    }
}

/// Runs a hook, catching (and logging) its panic.
fn call(hook: Option<&Hook>, leader: &Leader, name: &str) {
    if let Some(hook) = hook
        && std::panic::catch_unwind(AssertUnwindSafe(|| hook(leader))).is_err()
    {
        tracing::error!(hook = name, %leader, "election callback panicked");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stretches_a_period_by_at_most_a_fifth_and_varies() {
        let period = Duration::from_secs(1);
        let samples: Vec<Duration> = (0..200).map(|_| jittered(period)).collect();
        assert!(
            samples
                .iter()
                .all(|d| *d >= period && *d <= period.mul_f64(1.0 + JITTER)),
            "{samples:?}"
        );
        assert!(samples.iter().any(|d| *d != samples[0]), "not random");
    }
}
