//! The counting semaphore: at most K holders of one name, as K slots, each a Redlock mutex.
//!
//! **Why slots.** The obvious design — one set of holders per node, capped at K, a permit
//! granted by a majority — is unsafe: with 3 nodes and K = 2, holders A, B and C can be
//! granted by nodes (1, 2), (2, 3) and (1, 3); each node sees only two holders, yet three
//! hold a permit. Majorities catch a conflict between two holders, not among K + 1. Here a
//! permit is slot `i` of K, granted only when a majority grants *the same slot*: each slot is
//! an ordinary lock (the mutex's scripts, queues, extension and release), so at most one
//! holder per slot, hence at most K holders.
//!
//! **Keys.** For a semaphore `name` (after the key prefix):
//!
//! - `<name>:semaphore:slot:<i>`, `i` in `0..K`: slot `i`'s lock key (and its helper keys
//!   beside it, as for any lock). Its resource name is the same string.
//! - `<name>:semaphore:size`: the number of permits, as decimal digits (see [`size`]).
//! - `<name>:semaphore:line`: in fair mode, the lock whose holder goes round the slots.
//!
//! Do not lock these names as mutexes yourself. A refused try of a slot leaves the slot's
//! waiting mark (`<slot key>:redfence:waiting`, expiring on its own), as any refused lock
//! does, so that its release is announced.
//!
//! **The size key** holds K, written on each node only if absent (`scripts/claim.lua`) and
//! refreshed by every acquisition to live `max(24 h, 2 × ttl)`: a semaphore nobody uses leaves
//! nothing behind after a day. An acquisition hands out a permit only if a majority of nodes
//! store its K (claimed beside its first tries of the slots, not before them); two Ks cannot
//! both have a majority, so while the key lives, clients with another K are refused
//! ([`Error::SemaphoreSize`]), and a slot such a client took meanwhile is released. The key is
//! a guard against misconfiguration, not the safety argument: clients with K1 and K2 share
//! slots 0.., so even after the key expired (a permit held over a day with no acquisition
//! since) at most `max(K1, K2)` could hold.
//!
//! **Redis Cluster voters**: the slot keys and the size key are separate calls, so any name
//! works; [`Semaphore::inspect`] reads all slots in one call, so on a Cluster voter it needs a
//! hash tag in the name (`{jobs}`).
//!
//! **Finding a slot.** An attempt tries every slot once, starting at a random one and going
//! round (one try each, as `try_acquire` makes, outside the slots' fair queues), so that
//! concurrent callers spread over the slots instead of all asking for slot 0; when all are
//! taken it waits the Redlock's retry delay ([`Backoff`](crate::Backoff)) and goes round again,
//! within `retry_count` and `acquire_timeout`. Waiters of one `Redlock` take turns, as a
//! mutex's do: only the head of the process's line for the semaphore goes round. The wait ends
//! early when any slot is released: each refused try marked its slot, so its release is
//! announced (the mutex's notified hand-off, watched for all the slots at once), and a permit
//! of this process released wakes its waiters at once.
//!
//! **Fair mode** ([`RedlockBuilder::fair`](crate::RedlockBuilder::fair)): waiters of every
//! process take turns too, in the order they started waiting. A waiter first takes the
//! semaphore's line, `<name>:semaphore:line`: an ordinary fair lock (the nodes' queue orders
//! its waiters across processes), without a fencing token, kept alive by the lease keeper for
//! as long as its holder goes round. Its holder alone goes round the slots (outside the slots'
//! own queues), and releases the line once it has a permit, or has given up; the next waiter in
//! line is then told. The line is released in the background: the permit is returned without
//! waiting for a slow node's answer. Waiting for the line and going round each have the retry
//! budget (so up to twice `retry_count` retries in all); `acquire_timeout` bounds both
//! together. A `try_acquire` tries the line once, so it is [`Error::Contended`] (on the line's
//! name) while any other acquisition holds the line, even with slots free: it never passes a
//! waiter. The line orders; it is not the safety argument: a holder whose line expired (a
//! stalled process) only costs the order, as each slot is still a Redlock mutex. The line's TTL
//! is the shortest the lease keeper extends well (a second above the extension threshold, about
//! 1.5 s by default), so a process that died holding it holds up the waiters that long; its
//! extensions are not bound by `max_extensions` or `max_hold`. The line is a lock like any
//! other to metrics, tracing and the event hook: its acquisitions and extensions appear under
//! `<name>:semaphore:line`.

mod permit;
mod search;
mod size;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use permit::Permit;

use crate::clock;
use crate::config::Config;
use crate::error::{Error, InvalidInput};
use crate::inner::{MAX_TTL, validate_ttl};
use crate::inspect::Inspection;
use crate::redlock::Redlock;
use crate::using::{self, Signal};

/// The most permits a semaphore may have. An acquisition tries the slots one by one, each a
/// round trip to every node, so its cost grows with K.
pub const MAX_PERMITS: u32 = 256;

/// A TTL used only to validate slot names (long enough to pass any drift factor).
const CHECK_TTL: Duration = Duration::from_secs(60);

/// A counting semaphore: at most [`permits`](Semaphore::permits) holders at one instant,
/// across every client that uses the same name and node set. Get one with
/// [`Redlock::semaphore`]; it is cheap to clone.
///
/// Every client of one semaphore must use the same number of permits: the first acquisition
/// stores it on the nodes, and a client with another number is refused with
/// [`Error::SemaphoreSize`].
///
/// In fair mode ([`RedlockBuilder::fair`](crate::RedlockBuilder::fair)) permits go out in the
/// order the waiters came, across processes: a waiter first takes the semaphore's line,
/// `<name>:semaphore:line`, a fair lock without a fencing token kept alive while its holder
/// alone goes round the slots, and released with the permit. Waiting for the line and going
/// round each have the retry budget; `acquire_timeout` bounds both. A `try_acquire` is
/// refused while another acquisition holds the line. The line only orders: a holder whose
/// line expired costs the order, never the bound of K.
///
/// ```no_run
/// use std::time::Duration;
/// use redfence::{Error, Redlock};
///
/// # async fn run(redlock: Redlock) -> Result<(), Error> {
/// let jobs = redlock.semaphore("jobs", 3)?;
/// jobs.using(Duration::from_secs(10), |signal| async move {
///     // At most 3 of these run at once, whichever process runs them.
///     signal.check()?;
///     Ok::<_, Error>(())
/// })
/// .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    redlock: Redlock,
    name: Arc<str>,
    permits: u32,
    /// The resource name of each slot.
    slots: Arc<[String]>,
    /// Fair mode: the semaphore's line.
    line: Option<Line>,
    /// The size key, with the key prefix.
    size_key: Arc<str>,
}

impl Redlock {
    /// A counting semaphore named `name` with `permits` permits (at most that many holders at
    /// one instant). Nothing is sent until the first acquisition.
    ///
    /// ```no_run
    /// # fn run(redlock: redfence::Redlock) -> Result<(), redfence::Error> {
    /// let jobs = redlock.semaphore("jobs", 3)?;
    /// assert_eq!(jobs.permits(), 3);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`], before any traffic, for zero permits
    /// ([`InvalidInput::ZeroPermits`]), more than [`MAX_PERMITS`]
    /// ([`InvalidInput::TooManyPermits`]), an empty name, or a name whose slot keys a lock
    /// could not use (too long, a reserved ending, not fenceable, or across a Cluster voter's
    /// hash slots); in fair mode also an extension threshold too long for the line's TTL
    /// ([`InvalidInput::TtlTooLong`]).
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore, Error> {
        if permits == 0 {
            return Err(InvalidInput::ZeroPermits.into());
        }
        if permits > MAX_PERMITS {
            return Err(InvalidInput::TooManyPermits {
                permits,
                max: MAX_PERMITS,
            }
            .into());
        }
        if name.is_empty() {
            return Err(InvalidInput::EmptyResource { index: 0 }.into());
        }
        let slots: Arc<[String]> = (0..permits).map(|i| slot_name(name, i)).collect();
        let shared = self.shared();
        // The longest slot name stands for all: they differ only in the number.
        if let Some(longest) = slots.last() {
            shared.target(&[longest], CHECK_TTL)?;
        }
        // The line's name is shorter than the slots' and ends like none of the helper keys.
        let line = if shared.config.fair {
            Some(Line::new(&shared.config, name)?)
        } else {
            None
        };
        let size_name = format!("{name}:semaphore:size");
        let size_key = shared.keys(&[size_name]);
        shared.one_call_each(&size_key)?;
        Ok(Semaphore {
            redlock: self.clone(),
            name: Arc::from(name),
            permits,
            slots,
            line,
            size_key: Arc::from(size_key[0].as_str()),
        })
    }
}

/// A semaphore's line (fair mode): the lock whose holder alone goes round the slots.
#[derive(Clone)]
struct Line {
    /// `<name>:semaphore:line`.
    resource: Arc<str>,
    /// The shortest TTL the lease keeper extends well (a second of validity above the
    /// extension threshold, whatever the drift factor; about 1.5 s by default), whatever the
    /// permits' TTL, so that a process that died holding the line holds up the waiters behind
    /// it no longer than that.
    ttl: Duration,
    /// How the lease keeper extends it while its holder goes round.
    policy: using::Policy,
}

impl Line {
    fn new(config: &Config, name: &str) -> Result<Line, InvalidInput> {
        let least = config
            .extension_threshold
            .saturating_add(Duration::from_millis(1002))
            .as_secs_f64()
            / (1.0 - config.drift_factor);
        let ttl = Duration::try_from_secs_f64(least).unwrap_or(MAX_TTL);
        let ttl = validate_ttl(ttl, config.drift_factor)?;
        Ok(Line {
            resource: Arc::from(format!("{name}:semaphore:line")),
            ttl,
            policy: using::Policy::unbounded(config, ttl)?,
        })
    }
}

/// The resource name of slot `slot` of semaphore `name`.
fn slot_name(name: &str, slot: u32) -> String {
    format!("{name}:semaphore:slot:{slot}")
}

impl Semaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many permits it has (K).
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The resource name of each slot (`<name>:semaphore:slot:<i>`).
    pub fn slots(&self) -> &[String] {
        &self.slots
    }

    /// Who holds which slot: [`Redlock::inspect`] over every slot, in slot order (advisory,
    /// one read per node).
    ///
    /// ```no_run
    /// # async fn run(redlock: redfence::Redlock) -> Result<(), redfence::Error> {
    /// let jobs = redlock.semaphore("jobs", 3)?;
    /// let report = jobs.inspect().await?;
    /// let held = report.views().iter().filter(|slot| slot.owner().is_some()).count();
    /// println!("{held} of 3 permits held");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redlock::inspect`].
    pub async fn inspect(&self) -> Result<Inspection, Error> {
        self.redlock.inspect(&self.slots).await
    }

    /// Acquires a permit for `ttl`, retrying as the Redlock's builder configured
    /// (`retry_count`, the backoff schedule, `acquire_timeout`): each attempt tries every
    /// slot once, from a random one. In fair mode the wait for the semaphore's line comes
    /// first, with a retry budget of its own (see [`Semaphore`]).
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidInput`] for a TTL a lock would refuse; nothing is sent.
    /// - [`Error::SemaphoreSize`] when the nodes store another number of permits.
    /// - [`Error::Contended`] (for the last slot tried) when every slot was still held after
    ///   the last retry; in fair mode also (for `<name>:semaphore:line`) when waiters ahead
    ///   kept the line that long.
    /// - [`Error::QuorumUnreachable`], [`Error::NoValidity`], [`Error::AcquireTimeout`],
    ///   [`Error::Fencing`], [`Error::Closed`] as for [`Redlock::acquire`].
    pub async fn acquire(&self, ttl: Duration) -> Result<Permit, Error> {
        self.acquire_with(ttl, true).await
    }

    /// Makes one attempt: tries every slot once, from a random one, without retries. In fair
    /// mode it first tries the semaphore's line once (see [`Semaphore`]), so that it never
    /// passes a waiter in line.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire); [`Error::Contended`] when every slot is held, or in
    /// fair mode when another acquisition holds the line, free slots or not (naming
    /// `<name>:semaphore:line`).
    pub async fn try_acquire(&self, ttl: Duration) -> Result<Permit, Error> {
        self.acquire_with(ttl, false).await
    }

    async fn acquire_with(&self, ttl: Duration, retry: bool) -> Result<Permit, Error> {
        let shared = self.redlock.shared();
        let config = &shared.config;
        validate_ttl(ttl, config.drift_factor)?;
        let started = clock::now();
        let deadline = crate::acquisition::deadline(config, started);
        // Once per call, beside the search for a slot rather than before it (a round trip
        // less): the size cannot change while a majority stores ours (refreshed here). A
        // client with another number of permits may so hold a slot for a round trip; it never
        // hands that permit out (it releases it and fails), and the K bound counts permits
        // handed out.
        let claim = size::claim(shared, &self.name, &self.size_key, self.permits, ttl);
        let find = self.find(ttl, retry, started, deadline);
        tokio::pin!(claim, find);
        let mut claimed = false;
        let found = loop {
            tokio::select! {
                // Refused: the search is dropped (cancel-safe: its attempts release).
                result = &mut claim, if !claimed => {
                    result?;
                    claimed = true;
                }
                found = &mut find => break found,
            }
        };
        if !claimed && let Err(error) = claim.await {
            if let Ok(permit) = found {
                // Best effort: a release that fails leaves the slot to its TTL.
                let _ = permit.release().await;
            }
            return Err(error);
        }
        found
    }

    /// Runs `routine` while holding a permit: acquires one (with retries), keeps it alive
    /// through the lease keeper as [`Redlock::using`] does, and releases it when the routine
    /// is done. The [`Signal`] aborts when the permit can no longer be guaranteed; its
    /// [`resources`](Signal::resources) name the slot, its [`fence`](Signal::fence) is the
    /// slot's.
    ///
    /// # Errors
    ///
    /// The routine's own result or error, unchanged; errors of the acquisition (as
    /// [`acquire`](Self::acquire)) and TTLs `using()` refuses (as [`Redlock::using`]) go
    /// through `E::from`, and the routine never runs.
    ///
    /// # Panics
    ///
    /// As [`Redlock::using`]: resumes the routine's panic after releasing the permit.
    pub async fn using<T, E, F, Fut>(&self, ttl: Duration, routine: F) -> Result<T, E>
    where
        F: FnOnce(Signal) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        let shared = self.redlock.shared();
        let acquire = async { Ok(self.acquire(ttl).await?.into_lock()) };
        using::acquire_and_scope(&shared.config, &shared.tasks, ttl, acquire, routine).await
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name)
            .field("permits", &self.permits)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_do_not_end_like_helper_keys() {
        let name = slot_name("jobs", 7);
        assert_eq!(name, "jobs:semaphore:slot:7");
        for suffix in crate::helper_keys::RESERVED {
            assert!(!name.ends_with(suffix));
        }
    }
}
