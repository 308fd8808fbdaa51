//! The one retry loop of every acquisition (a mutex, the fair line, a read-write lock's side,
//! a semaphore's round of its slots): attempts on the Redlock's [`Backoff`](crate::Backoff)
//! delays within `acquire_timeout`, each wait cut short by a release the waiter watches for;
//! and this process's line of waiters, which the mutex and the semaphore wait in first.

use std::future::Future;
use std::time::{Duration, Instant};

use futures::FutureExt;

use crate::clock;
use crate::config::Config;
use crate::error::Error;
use crate::hand_off::{Turn, Watch};
use crate::inner::Shared;
use crate::metrics::Tries;
use crate::quorum::Failed;
use crate::trace;

/// Why an attempt did not acquire.
pub(crate) enum Refused {
    /// Another attempt could succeed: retried on the schedule, or the caller's error once
    /// the schedule ends.
    Again(Error),
    /// Final: the acquisition ends with this error.
    Final(Error),
}

impl Refused {
    /// A failed quorum round, after `attempts` attempts on `resources`; a retryable one is
    /// counted in `tries` (contended or not).
    pub(crate) fn of(
        failed: Failed,
        tries: &mut Tries,
        resources: &[String],
        attempts: u32,
    ) -> Self {
        if !failed.is_retryable() {
            return Refused::Final(failed.into_error(resources, attempts));
        }
        tries.failed(&failed);
        Refused::Again(failed.into_error(resources, attempts))
    }
}

/// One acquisition's attempt, made again on its schedule by [`Retries::run`]: a mutex's
/// quorum round, a read-write lock side's, a semaphore's round of its slots.
pub(crate) trait Attempt: Send {
    /// What a successful attempt gives.
    type Granted;

    /// One attempt; it counts itself in `tries.attempts` (and its refusals as it sees fit).
    fn attempt<'s>(
        &'s mut self,
        tries: &'s mut Tries,
    ) -> impl Future<Output = Result<Self::Granted, Refused>> + Send + 's;

    /// A watch for the releases that end a wait early, made when the engine first needs one
    /// (`None`: nothing to watch).
    fn watch(&self) -> Option<Watch>;
}

/// Counts one more attempt in `tries` and in the current span; returns the count.
pub(crate) fn count_attempt(tries: &mut Tries) -> u32 {
    tries.attempts = tries.attempts.saturating_add(1);
    trace::attempts(tries.attempts);
    tries.attempts
}

/// The schedule of one acquisition, and how its waiter is woken: the engine's settings.
pub(crate) struct Retries<'a, D> {
    /// When the acquisition started: `AcquireTimeout` says how long it waited since.
    pub(crate) started: Instant,
    /// `acquire_timeout` after the start, if any: no wait ends past it.
    pub(crate) deadline: Option<Instant>,
    /// The retry delays left (the line may have used some up).
    pub(crate) delays: D,
    /// Whether a refusal may be retried at all: not for a `try_acquire`, nor out of turn (the
    /// line took the whole budget), when the first refusal is the caller's error.
    pub(crate) retry: bool,
    /// The watch for the releases that end a wait early, if it is watching already.
    pub(crate) watch: Option<Watch>,
    /// On the first refusal, not watching yet: start watching and attempt again at once (a
    /// release between the attempt and the watch would have woken nobody). Otherwise the
    /// watch starts before the first wait.
    pub(crate) recheck: bool,
    /// A delay that would end past the deadline: sleep until the deadline before giving up
    /// (a semaphore's search), rather than give up at once.
    pub(crate) wait_out_deadline: bool,
    /// Checked after every wait: a closed Redlock ends the acquisition. `None` where each
    /// attempt checks it itself (a semaphore's tries of its slots).
    pub(crate) open: Option<&'a Shared>,
}

impl<D: Iterator<Item = Duration>> Retries<'_, D> {
    /// Attempts until one succeeds or is refused for good, the retries run out, or the next
    /// delay would end past the deadline ([`Error::AcquireTimeout`], naming the last refusal).
    /// Between attempts it sleeps the next delay, or less: until a watch (made by
    /// [`Attempt::watch`] when first needed) sees a release. `tries` counts the time waited;
    /// each attempt counts itself in `tries.attempts`.
    pub(crate) async fn run<A: Attempt>(
        mut self,
        tries: &mut Tries,
        attempt: &mut A,
    ) -> Result<A::Granted, Error> {
        let mut watch = self.watch.take();
        loop {
            if let Some(watch) = &watch {
                watch.reset();
            }
            let refused = match attempt.attempt(tries).await {
                Ok(granted) => return Ok(granted),
                Err(Refused::Final(error)) => return Err(error),
                Err(Refused::Again(error)) => error,
            };
            if self.retry && self.recheck && watch.is_none() {
                watch = attempt.watch();
                if watch.is_some() {
                    continue;
                }
            }
            // Out of turn, or without retries: that was the last attempt.
            let delay = match self.delays.next() {
                Some(delay) if self.retry => delay,
                _ => return Err(refused),
            };
            if ends_past(delay, self.deadline) {
                if self.wait_out_deadline
                    && let Some(deadline) = self.deadline
                {
                    tokio::time::sleep_until(deadline.into()).await;
                }
                return Err(Error::AcquireTimeout {
                    waited: clock::since(self.started),
                    attempts: tries.attempts,
                    last: Some(Box::new(refused)),
                });
            }
            tracing::trace!(
                ?delay,
                attempts = tries.attempts,
                "lock attempt failed; retrying"
            );
            if watch.is_none() {
                watch = attempt.watch();
            }
            let waiting = clock::now();
            Watch::sleep_or_release(watch.as_ref(), delay).await;
            tries.backoff = tries.backoff.saturating_add(clock::since(waiting));
            if let Some(shared) = self.open {
                shared.check_open()?;
            }
        }
    }
}

/// The deadline of an acquisition that started at `started`: `acquire_timeout` later, if
/// set (none if that is past what an `Instant` holds).
pub(crate) fn deadline(config: &Config, started: Instant) -> Option<Instant> {
    config.acquire_timeout.and_then(|t| started.checked_add(t))
}

/// Waits for the head of the line of `keys` in this process (FIFO; see
/// [`HandOff::turn`](crate::hand_off::HandOff::turn)), and says whether it had to wait at
/// all. Each retry delay spent in line uses up one of `delays` (nobody ahead, the usual case,
/// uses up none); `None` when they ran out in line (one last attempt is then made out of
/// turn). Fails with [`Error::AcquireTimeout`] (no attempt made, waited since `started`) when
/// the next delay would end past the deadline.
pub(crate) async fn line_up(
    shared: &Shared,
    keys: &[String],
    delays: &mut impl Iterator<Item = Duration>,
    deadline: Option<Instant>,
    started: Instant,
) -> Result<(Option<Turn>, bool), Error> {
    let line = shared.hand_off.turn(keys);
    tokio::pin!(line);
    if let Some(turn) = (&mut line).now_or_never() {
        return Ok((Some(turn), false));
    }
    loop {
        let delay = delays.next();
        let wait = async {
            match delay {
                Some(delay) => sleep_before(delay, deadline).await,
                None => Wake::Budget,
            }
        };
        tokio::select! {
            biased;
            turn = &mut line => return Ok((Some(turn), true)),
            wake = wait => match wake {
                Wake::Slept => continue,
                Wake::Budget => return Ok((None, true)),
                Wake::Deadline => {
                    return Err(Error::AcquireTimeout {
                        waited: clock::since(started),
                        attempts: 0,
                        last: None,
                    });
                }
            },
        }
    }
}

/// How a wait in line ended.
#[derive(Debug, PartialEq, Eq)]
enum Wake {
    /// The retry delay passed.
    Slept,
    /// No retry delay is left.
    Budget,
    /// The delay would end past `acquire_timeout`: at once, without sleeping.
    Deadline,
}

/// Whether a wait of `delay` from now would end past the deadline (a delay too long for an
/// `Instant` certainly does).
pub(super) fn ends_past(delay: Duration, deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|deadline| {
        clock::now()
            .checked_add(delay)
            .is_none_or(|wake| wake >= deadline)
    })
}

/// Sleeps `delay`, unless it would end past the deadline.
async fn sleep_before(delay: Duration, deadline: Option<Instant>) -> Wake {
    if ends_past(delay, deadline) {
        return Wake::Deadline;
    }
    tokio::time::sleep(delay).await;
    Wake::Slept
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FencingError;
    use crate::retry::Backoff;

    /// Refused `refusals` times (again, or for good), then granted; nothing to watch.
    struct Fake {
        refusals: u32,
        last: fn() -> Refused,
        at: Vec<Duration>,
        start: Instant,
    }

    impl Attempt for Fake {
        type Granted = u32;

        async fn attempt(&mut self, tries: &mut Tries) -> Result<u32, Refused> {
            let n = count_attempt(tries);
            self.at.push(clock::since(self.start));
            if n > self.refusals {
                return Ok(n);
            }
            Err((self.last)())
        }

        fn watch(&self) -> Option<Watch> {
            None
        }
    }

    fn again() -> Refused {
        Refused::Again(Error::Closed)
    }

    fn fake(refusals: u32, last: fn() -> Refused) -> Fake {
        Fake {
            refusals,
            last,
            at: Vec::new(),
            start: clock::now(),
        }
    }

    /// Three retries 100 ms apart, `acquire_timeout` if any, `retry`; recheck on.
    fn retries(
        timeout: Option<Duration>,
        retry: bool,
        wait_out_deadline: bool,
    ) -> Retries<'static, impl Iterator<Item = Duration>> {
        let started = clock::now();
        Retries {
            started,
            deadline: timeout.and_then(|t| started.checked_add(t)),
            delays: Backoff::fixed(Duration::from_millis(100), Duration::ZERO)
                .retries(3)
                .delays(),
            retry,
            watch: None,
            recheck: true,
            wait_out_deadline,
            open: None,
        }
    }

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn attempts_on_the_schedule_until_granted_or_out_of_retries() {
        let mut tries = Tries::default();
        let mut granted = fake(2, again);
        let got = retries(None, true, false)
            .run(&mut tries, &mut granted)
            .await;
        assert_eq!(got.ok(), Some(3));
        // Nothing to watch: no recheck at once, the delays in full.
        assert_eq!(granted.at, [Duration::ZERO, 100 * MS, 200 * MS]);
        assert_eq!(tries.backoff, 200 * MS);

        let mut tries = Tries::default();
        let mut refused = fake(10, again);
        let got = retries(None, true, false)
            .run(&mut tries, &mut refused)
            .await;
        assert!(matches!(got, Err(Error::Closed)), "{got:?}");
        assert_eq!(tries.attempts, 4, "the first attempt and three retries");
    }

    #[tokio::test(start_paused = true)]
    async fn no_retry_and_final_refusals_end_at_once() {
        let mut tries = Tries::default();
        let mut once = fake(10, again);
        let got = retries(None, false, false).run(&mut tries, &mut once).await;
        assert!(matches!(got, Err(Error::Closed)), "{got:?}");
        assert_eq!(once.at, [Duration::ZERO]);

        let mut tries = Tries::default();
        let mut last = fake(10, || {
            Refused::Final(Error::Fencing(FencingError::LockExpired))
        });
        let got = retries(None, true, false).run(&mut tries, &mut last).await;
        assert!(matches!(got, Err(Error::Fencing(_))), "{got:?}");
        assert_eq!(last.at, [Duration::ZERO]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_delay_past_the_deadline_times_out_at_once_or_at_the_deadline() {
        for wait_out in [false, true] {
            let mut tries = Tries::default();
            let mut refused = fake(10, again);
            let start = clock::now();
            let got = retries(Some(150 * MS), true, wait_out)
                .run(&mut tries, &mut refused)
                .await;
            let Err(Error::AcquireTimeout {
                waited,
                attempts,
                last,
            }) = got
            else {
                panic!("{got:?}");
            };
            assert_eq!(attempts, 2);
            assert!(matches!(last.as_deref(), Some(Error::Closed)));
            let ended = if wait_out { 150 * MS } else { 100 * MS };
            assert_eq!(clock::since(start), ended);
            assert_eq!(waited, ended);
        }
    }
}
