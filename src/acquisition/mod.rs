//! Acquiring a lock: attempts on the configured schedule, each one a quorum round followed by
//! the fencing token, and nothing left locked whatever happens.

mod engine;
mod leave;

use std::sync::Arc;
use std::time::Instant;

use crate::clock;
use crate::error::{Error, FencingError};
use crate::guard::DropGuard;
use crate::hand_off::{Turn, Watch};
use crate::inner::{Held, Shared, Target};
use crate::metrics::Tries;
use crate::node::{Op, QueueTicket, RwMode, RwOp};
use crate::quorum::{self, Failed};

pub(crate) use engine::{Attempt, Refused, Retries, count_attempt, deadline, line_up};
pub(crate) use leave::Leave;

use engine::ends_past;
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
    crate::random::fill_secret(&mut bytes)?;
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
