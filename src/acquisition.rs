//! Acquiring a lock: attempts on the configured schedule, each one a quorum round followed by
//! the fencing token, and nothing left locked whatever happens.

use std::sync::Arc;

use futures::FutureExt;
use rand::TryRngCore;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::clock;
use crate::error::{Error, FencingError};
use crate::guard::DropGuard;
use crate::hand_off::{Turn, Watch};
use crate::inner::{Held, Shared, Target};
use crate::metrics::Tries;
use crate::node::{Op, QueueTicket, Request, RwMode, RwOp};
use crate::quorum::{self, Failed};
use crate::trace;

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
pub(crate) async fn acquire(
    shared: &Arc<Shared>,
    target: &Target,
    tries: &mut Tries,
) -> Result<Acquired, Error> {
    shared.check_open()?;
    let config = &shared.config;
    let started = clock::now();
    let deadline = config.acquire_timeout.and_then(|t| started.checked_add(t));
    let mut delays = config.backoff.delays();
    let mut attempts: u32 = 0;
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
            tokio::select! {
                // Past the deadline: attempt at once instead.
                _ = sleep_before(delay, deadline) => {}
                () = watch.released() => {}
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
    loop {
        if let Some(watch) = &watch {
            watch.reset();
        }
        attempts = attempts.saturating_add(1);
        tries.attempts = attempts;
        trace::attempts(attempts);
        let failed = match attempt(shared, target, place.ticket()).await {
            Ok(acquired) => return Ok(place.granted(acquired)),
            Err(failed) if !failed.is_retryable() => {
                return Err(failed.into_error(&target.resources, attempts));
            }
            Err(failed) => failed,
        };
        tries.failed(&failed);
        // Out of turn (the line took the whole budget): that was the last attempt.
        let (Some(turn), Some(delay)) = (&turn, delays.next()) else {
            return Err(failed.into_error(&target.resources, attempts));
        };
        if ends_past(delay, deadline) {
            return Err(Error::AcquireTimeout {
                waited: clock::since(started),
                attempts,
                last: Some(Box::new(failed.into_error(&target.resources, attempts))),
            });
        }
        tracing::trace!(?delay, attempts, "lock attempt failed; retrying");
        let watch = watch.get_or_insert_with(|| shared.hand_off.watch(turn, place.waiter()));
        let waiting = clock::now();
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = watch.released() => tracing::trace!("woken by a release"),
        }
        tries.backoff = tries.backoff.saturating_add(clock::since(waiting));
        shared.check_open()?;
    }
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
pub(crate) fn ends_past(delay: Duration, deadline: Option<Instant>) -> bool {
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

/// One attempt and no retry (`try_acquire`); in fair mode, in turn.
pub(crate) async fn try_once(
    shared: &Arc<Shared>,
    target: &Target,
    tries: &mut Tries,
) -> Result<Acquired, Error> {
    shared.check_open()?;
    trace::attempts(1);
    tries.attempts = 1;
    let place = Place::take(shared, target)?;
    attempt(shared, target, place.ticket())
        .await
        .map(|acquired| place.granted(acquired))
        .map_err(|failed| {
            tries.failed(&failed);
            failed.into_error(&target.resources, 1)
        })
}

/// The longest a node keeps a fair waiter in line without hearing from it, however long
/// the retry delays and the node timeout are.
const LONGEST_LEASE: Duration = Duration::from_secs(24 * 60 * 60);

/// An acquisition's place in the fair queue of its keys on every node (fair mode): left on
/// every node when dropped (the acquisition failed or was cancelled), or handed to the lock
/// once granted, whose release leaves it.
struct Place {
    ticket: Option<Arc<QueueTicket>>,
    shared: Arc<Shared>,
    keys: Arc<[String]>,
}

impl Place {
    /// The place of an acquisition of `target` (none outside fair mode).
    ///
    /// # Errors
    ///
    /// [`Error::Entropy`] when no waiter id can be made.
    fn take(shared: &Arc<Shared>, target: &Target) -> Result<Place, Error> {
        let config = &shared.config;
        let waiter = if target.fair {
            Some(new_token()?)
        } else {
            None
        };
        let ticket = waiter.map(|waiter| {
            let lease = config
                .backoff
                .longest_delay()
                .saturating_mul(3)
                .saturating_add(config.node_timeout)
                .max(Duration::from_secs(1))
                // Within what the nodes take as an integer (Lua numbers, PEXPIRE).
                .min(LONGEST_LEASE);
            let since_epoch = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            Arc::new(QueueTicket {
                waiter,
                ticket: u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX),
                lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            })
        });
        Ok(Place {
            ticket,
            shared: Arc::clone(shared),
            keys: Arc::clone(&target.keys),
        })
    }

    fn ticket(&self) -> Option<&Arc<QueueTicket>> {
        self.ticket.as_ref()
    }

    /// The lock now holds the place (its release leaves the queues).
    fn granted(mut self, acquired: Acquired) -> Acquired {
        self.ticket = None;
        acquired
    }

    fn waiter(&self) -> Option<Arc<str>> {
        self.ticket.as_ref().map(|t| Arc::clone(&t.waiter))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        if self.keys.is_empty() || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let leave = Request {
            op: Op::Leave,
            keys: Arc::clone(&self.keys),
            token: Arc::clone(&ticket.waiter),
            ttl_ms: 0,
            queue: Some(ticket),
            rw: None,
        };
        for node in &self.shared.nodes {
            // Queued now, after this acquisition's last call; the node bounds it, and a leave
            // that never lands ends with its lease.
            let call = node.call(&leave);
            self.shared.tasks.spawn(async move {
                let _ = call.await;
            });
        }
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
        Some(resources) => fence(shared, resources, expires_at).await,
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

/// Asks the fencing counter, if any, for a token, within the lock's validity.
async fn fence(
    shared: &Shared,
    resources: &[String],
    expires_at: Instant,
) -> Result<Option<u64>, FencingError> {
    let config = &shared.config;
    let Some(counter) = &config.fencing else {
        return Ok(None);
    };
    let remaining = expires_at.saturating_duration_since(clock::now());
    let limit = config.fencing_timeout.min(remaining);
    match tokio::time::timeout(limit, counter.next_fence(resources)).await {
        Ok(Ok(_)) | Err(_) if clock::now() >= expires_at => Err(FencingError::LockExpired),
        // The storage helpers refuse 0 (`lock.fence().unwrap_or(0)` without a counter), and
        // a check against a fresh row's 0 would accept it: not a token.
        Ok(Ok(0)) => Err(FencingError::counter(
            "the counter returned 0, which is not a token (tokens start at 1)",
        )),
        Ok(Ok(token)) => Ok(Some(token)),
        Ok(Err(error)) => Err(FencingError::counter(error)),
        Err(_) => Err(FencingError::Timeout(limit)),
    }
}

/// A fresh owner token (and a fair or writing waiter's): 128 bits straight from the operating
/// system's generator (rand's `OsRng`: `getrandom(2)` on Linux), as 32 hex digits. Not from a
/// generator in this process: rand's thread generator is not reseeded on `fork`, so a forked
/// child, or a VM restored twice from one snapshot, could mint its twin's tokens and release
/// or extend its locks. One system call per token.
///
/// # Errors
///
/// [`Error::Entropy`] when the operating system's generator fails, which it does not on a
/// working system (Linux's `getrandom(2)` blocks until it is seeded and is retried on
/// `EINTR`; without it, `/dev/urandom` is read): only a sandbox that denies both can make it
/// fail, and no lock could be told apart from another's then.
pub(crate) fn new_token() -> Result<Arc<str>, Error> {
    os_token().map_err(|err| Error::Entropy(Arc::new(std::io::Error::other(err))))
}

/// [`new_token`], or why the operating system's generator could not give one.
fn os_token() -> Result<Arc<str>, rand::rand_core::OsError> {
    let mut bytes = [0u8; 16];
    rand::rngs::OsRng.try_fill_bytes(&mut bytes)?;
    let bits = u128::from_be_bytes(bytes);
    Ok(Arc::from(format!("{bits:032x}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fresh_128_bit_hex() {
        let a = new_token().expect("a token");
        let b = new_token().expect("a token");
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    /// The tokens come from the operating system's generator, which answers here; a thousand
    /// of them are distinct and use every hex digit in every place (not a counter, not a
    /// constant part).
    #[test]
    fn tokens_come_from_the_operating_systems_generator() {
        let tokens: Vec<Arc<str>> = (0..1_000)
            .map(|_| os_token().expect("the OS generator answers"))
            .collect();
        let distinct: std::collections::HashSet<&str> = tokens.iter().map(|t| &**t).collect();
        assert_eq!(distinct.len(), tokens.len());
        for place in 0..32 {
            let digits: std::collections::HashSet<u8> =
                tokens.iter().map(|t| t.as_bytes()[place]).collect();
            assert_eq!(digits.len(), 16, "hex digit #{place} takes every value");
        }
    }
}
