//! Acquiring a lock: attempts on the configured schedule, each one a quorum round followed by
//! the fencing token, and nothing left locked whatever happens.
//!
//! The one retry loop of every acquisition (a mutex, the fair line, a read-write lock's side,
//! a semaphore's round of its slots) is [`Retries::run`]: attempts on the Redlock's
//! [`Backoff`](crate::Backoff) delays within `acquire_timeout`, each wait cut short by a
//! release the waiter watches for; [`line_up`] is this process's line of waiters, which the
//! mutex and the semaphore wait in first.

mod leave;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;

use crate::config::Config;
use crate::error::Error;
use crate::guard::DropGuard;
use crate::hand_off::{Turn, Watch};
use crate::inner::{Held, Shared, Target};
use crate::metrics::Tries;
use crate::node::{Op, QueueTicket, RwMode, RwOp};
use crate::quorum::{self, Failed};
use crate::random::new_token;
use crate::{clock, fence, trace};

pub(crate) use leave::Leave;

use leave::Place;

/// A lock a majority granted, with its validity and fence: what `Lock` is made of.
pub(crate) struct Acquired {
    pub(crate) held: Held,
    pub(crate) expires_at: Instant,
    pub(crate) fence: Option<u64>,
}

/// Attempts with the configured schedule and deadline until one succeeds, an error is final,
/// the retries run out, or `acquire_timeout` would pass. Counts attempts, contended ones and
/// the time waited between them (in line included) in `tries`.
///
/// Waiters for the same keys in this process take turns (FIFO): only the head of the line
/// polls the nodes. Each retry delay spent in line uses up one retry; when they run out,
/// one last attempt is made out of turn, so that the error says what the nodes answered.
/// Between attempts the head sleeps its retry delay, or less: until a release of its keys
/// reached a majority of nodes, or a lock of this process released them.
///
/// Without `retry` (`try_acquire`): one attempt, and no waiting in line; in fair mode, in
/// turn.
pub(crate) async fn acquire(
    shared: &Arc<Shared>,
    target: &Target,
    tries: &mut Tries,
    retry: bool,
) -> Result<Acquired, Error> {
    shared.check_open()?;
    if !retry {
        let place = Place::take(shared, target)?;
        let mut mutex = Mutex {
            shared,
            target,
            place: &place,
            turn: None,
        };
        return match mutex.attempt(tries).await {
            Ok(acquired) => Ok(place.granted(acquired)),
            Err(Refused::Again(error) | Refused::Final(error)) => Err(error),
        };
    }
    let config = &shared.config;
    let started = clock::now();
    let deadline = deadline(config, started);
    let mut delays = config.backoff.delays();
    let place = Place::take(shared, target)?;
    let in_line = clock::now();
    let (turn, waited_in_line) =
        line_up(shared, &target.keys, &mut delays, deadline, started).await?;
    if waited_in_line {
        tries.backoff = clock::since(in_line);
    }
    let mut watch: Option<Watch> = None;
    // A lock of this process holds the keys: wait for its release (at most one retry delay,
    // not counted as a retry) before polling. Not without retries (the caller wants one
    // answer at once), and not in fair mode (the first attempt takes this waiter's place in
    // the nodes' queues).
    if let Some(turn) = &turn
        && !target.fair
        && turn.held_here()
        && let Some(delay) = config.backoff.delays().next()
    {
        let watch = watch.insert(shared.hand_off.watch(turn, place.waiter()));
        // Released before the watch existed (that release woke nobody): attempt at once.
        if turn.held_here() {
            let waiting = clock::now();
            // Past the deadline: attempt at once instead.
            if !ends_past(delay, deadline) {
                Watch::sleep_or_release(Some(watch), delay).await;
            }
            tries.backoff = tries.backoff.saturating_add(clock::since(waiting));
            shared.check_open()?;
        }
    }
    // A hot resource (subscribed already): watch from the first attempt on, so that a release
    // between its refusal and the watch is not missed (in fair mode the release names the
    // next waiter once; missed, it would sleep a whole retry delay). Otherwise the watch
    // starts after the first refusal, as subscribing costs a command per node.
    if watch.is_none()
        && let Some(turn) = &turn
        && config.backoff.max_retries() > 0
    {
        watch = shared.hand_off.watch_subscribed(turn, place.waiter());
    }
    let retries = Retries {
        started,
        deadline,
        delays,
        retry: turn.is_some(),
        watch,
        recheck: false,
        wait_out_deadline: false,
        open: Some(shared),
    };
    let mut mutex = Mutex {
        shared,
        target,
        place: &place,
        turn: turn.as_ref(),
    };
    retries
        .run(tries, &mut mutex)
        .await
        .map(|acquired| place.granted(acquired))
}

/// A mutex's attempt on the schedule (see [`acquire`]): in turn, in its place in line.
struct Mutex<'a> {
    shared: &'a Arc<Shared>,
    target: &'a Target,
    place: &'a Place,
    turn: Option<&'a Turn>,
}

impl Attempt for Mutex<'_> {
    type Granted = Acquired;

    async fn attempt(&mut self, tries: &mut Tries) -> Result<Acquired, Refused> {
        let attempts = count_attempt(tries);
        attempt(self.shared, self.target, self.place.ticket())
            .await
            .map_err(|failed| Refused::of(failed, tries, &self.target.resources, attempts))
    }

    fn watch(&self) -> Option<Watch> {
        self.turn
            .map(|turn| self.shared.hand_off.watch(turn, self.place.waiter()))
    }
}

/// One attempt: a fresh token, the quorum round, then the fencing token. Cancel-safe: dropped
/// before it returns, it releases on every node in the background.
async fn attempt(
    shared: &Arc<Shared>,
    target: &Target,
    ticket: Option<&Arc<QueueTicket>>,
) -> Result<Acquired, Failed> {
    attempt_as(shared, target, ticket, None).await
}

/// One attempt on a read-write lock's side (`target`: its writer, readers and waiting keys,
/// the writer's first), as [`attempt`] for a mutex: the same round, validity, release of a
/// failed attempt and cancel safety. A writer is fenced on the writer key's name alone; a
/// reader gets no fencing token (it does not write). No hand-off in this process: waiters
/// poll.
pub(crate) async fn attempt_rw(
    shared: &Arc<Shared>,
    target: &Target,
    rw: Arc<RwOp>,
) -> Result<Acquired, Failed> {
    attempt_as(shared, target, None, Some(rw)).await
}

async fn attempt_as(
    shared: &Arc<Shared>,
    target: &Target,
    ticket: Option<&Arc<QueueTicket>>,
    rw: Option<Arc<RwOp>>,
) -> Result<Acquired, Failed> {
    let config = &shared.config;
    let fence_on: Option<&[String]> = match rw.as_deref().map(|rw| rw.mode) {
        _ if !target.fenced => None,
        None => Some(&target.resources),
        Some(RwMode::Write) => Some(&target.resources[..1]),
        Some(RwMode::Read) => None,
    };
    let mutex = rw.is_none();
    let held = Held {
        shared: Arc::clone(shared),
        target: target.clone(),
        token: new_token().map_err(Failed::Other)?,
        hold: None,
        queue: None,
        rw,
        longest_ttl: target.ttl,
    };
    let mut req = held.request(Op::Acquire, target.ttl);
    req.queue = ticket.cloned();
    // Until this attempt has handed out a lock or cleaned up after itself, dropping it (the
    // caller gave up mid-way) releases on every node in the background.
    let mut guard = DropGuard::new(held, Held::release_in_background);
    let start = clock::now();
    let round = quorum::acquire_round(
        &shared.nodes,
        &req,
        target.ttl,
        config.drift_factor,
        &shared.tasks,
    )
    .await;
    let valid_for = match round {
        Ok(granted) => granted,
        Err(failed) => {
            // acquire_round released on every node already.
            guard.disarm();
            return Err(failed);
        }
    };
    let expires_at = start + valid_for;
    let fenced = match fence_on {
        Some(resources) => {
            let counter = config.fencing.as_deref();
            fence::issue_within(counter, config.fencing_timeout, resources, expires_at).await
        }
        None => Ok(None),
    };
    let fence = match fenced {
        Ok(fence) => fence,
        Err(error) => {
            let release = guard.request(Op::Release, target.ttl);
            quorum::release_everywhere(&shared.nodes, &release).await;
            guard.disarm();
            return Err(Failed::Other(error.into()));
        }
    };
    // A read-write lock marks its writer key alone (the key its waiters watch): its release
    // wakes this process's waiters at once.
    let held_keys = if mutex {
        &target.keys[..]
    } else {
        &target.keys[..1]
    };
    guard.hold = Some(Arc::new(shared.hand_off.hold(held_keys)));
    guard.queue = ticket.cloned();
    guard.disarm();
    Ok(Acquired {
        held: (*guard).clone(),
        expires_at,
        fence,
    })
}

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
fn ends_past(delay: Duration, deadline: Option<Instant>) -> bool {
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
mod tests;
