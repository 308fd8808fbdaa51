//! The read-write lock: any number of readers, or one writer, over a majority of nodes.
//!
//! **Why a majority suffices here** (unlike a counting semaphore's K + 1 holders): every
//! conflict of a read-write lock is between two parties — a writer and a reader, or two
//! writers. Any two majorities share a node, and that node refuses the second party while
//! the first holds there; so two conflicting holders are never granted at one instant, by
//! the same argument (and the same validity arithmetic) as a Redlock mutex.
//!
//! **Per node**, for a lock `name` (after the key prefix):
//!
//! - `<name>:rwlock:writer`: the writer's token (a string, expiring at its TTL);
//! - `<name>:rwlock:readers`: the readers, a sorted set of tokens scored by the server time
//!   (ms) their hold ends; expired members are pruned by every operation on the lock. The
//!   same set keeps the waiting readers' places in line (`?` and the acquisition's waiter
//!   id, scored below zero: never counted as readers);
//! - `<name>:rwlock:writer_waiting`: a writer is waiting (its id, with a short expiry).
//!
//! **Phase-fair: neither side starves the other.** Each node alternates write phases and
//! read phases on its own:
//!
//! - A write is granted when there is no writer, no live reader and no *admitted* reader
//!   (below). A refused writer sets (or refreshes) the waiting mark on each attempt.
//! - A read is granted when there is no writer and either no waiting mark or the reader is
//!   admitted. A refused reader takes a place in line on that node (or renews it).
//! - A writer's release admits every reader in line at that moment: those readers get in
//!   before any writer waiting then, and that writer waits until they leave. A reader that
//!   comes after the release, while a writer waits, queues behind that writer and is
//!   admitted by its release.
//!
//! So a reader waits for at most one write phase (the one it met, or the one of the writer
//! it found waiting), and a writer for the readers that were in line before it: two writers
//! that keep each other's mark up no longer keep readers out. Among writers, the first to try
//! after the readers leave gets in (no order among writers); among readers, all admitted go
//! together. The mark and a place in line live a little over the waiter's longest retry
//! delay (three of them and a node timeout, 1 s to 60 s): a writer that vanishes blocks new
//! readers, and an admitted reader that vanishes blocks writers, for no longer than that.
//! A writer takes its mark away once granted or given up; a reader's place goes with its
//! grant on that node, its release everywhere, or its leave once it gives up.
//! `try_acquire_write` and `try_acquire_read` leave no mark and take no place (they do not
//! wait). Each node decides alone, so the policy holds per node; the lock's safety (never a
//! writer beside a reader or another writer on a majority) rests only on the writer key and
//! the live readers, as before, and every operation may be repeated (a repeat of a granted
//! read or write is granted again, a repeated release finds nothing and admits nobody).
//! Clients of an earlier version on the same lock drop the places in line (they prune every
//! score below the server time): the lock stays safe and works as before for them, readers
//! then waiting behind any mark.
//!
//! **Where it runs**: new kinds of operation in the node's batch script
//! (`scripts/batch.lua`, made only inside its `lib()`, so the one-key mutex path is
//! unchanged), sent through the node's one ordered queue like any lock's calls; never as
//! Valkey 9's plain commands. Acquisition is the mutex's: one attempt is
//! [`acquisition`](crate::acquisition)'s round (parallel to every node, majority, validity
//! = TTL − elapsed − drift, a failed attempt released on every node that did not refuse,
//! restart quarantine counted by the tally), retried on the Redlock's [`Backoff`](crate::Backoff)
//! within `retry_count` and `acquire_timeout`. A waiter sleeps its retry delay or less: a
//! writer's release, and the last reader's while a writer waits, are announced on the writer
//! key's release channel (as a mutex's release is; not on a Cluster voter), and a guard of
//! this process released wakes its waiters at once. Fair mode (the nodes' FIFO queues) does
//! not apply: among writers, and among readers, the first to try after a release gets in.
//!
//! **Fencing**: a writer gets a token from the Redlock's fencing counter, on the resource
//! `<name>:rwlock:writer`, as a mutex does. Readers get none: they must not write, and
//! storage needs to order only writers (a reader beside a writer is what the lock prevents).
//!
//! **No upgrade**: a reader cannot become the writer. Release the read and acquire the
//! write (another writer may come first); a writer that asks while it still reads waits for
//! itself until its read expires.
//!
//! **After a restart** a node's votes do not count for the restart quarantine, as for a
//! mutex; an extension does not set again a reader or writer a restarted node forgot.
//!
//! **Redis Cluster voters**: the three keys of one lock go in one script call, so they must
//! share a hash slot: use a hash tag in the name (`{orders}`). Otherwise
//! [`Redlock::rwlock`] refuses the name ([`InvalidInput::KeysAcrossSlots`]) before any traffic.

mod acquire;
mod guard;
mod inspect;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use guard::{ReadGuard, WriteGuard};
pub use inspect::{RwHolder, RwInspection, RwNodeState};

use crate::error::{Error, InvalidInput};
use crate::inner::Target;
use crate::node::RwMode;
use crate::redlock::Redlock;
use crate::using::{self, Signal};

/// A TTL used only to validate the key names (long enough to pass any drift factor).
const CHECK_TTL: Duration = Duration::from_secs(60);

/// A read-write lock: any number of readers at one instant, or one writer, across every
/// client that uses the same name and node set. Get one with [`Redlock::rwlock`]; it is
/// cheap to clone.
///
/// ```no_run
/// use std::time::Duration;
/// use redfence::{Error, Redlock};
///
/// # async fn run(redlock: Redlock) -> Result<(), Error> {
/// let config = redlock.rwlock("config")?;
/// // Many readers at once...
/// let read = config.acquire_read(Duration::from_secs(10)).await?;
/// read.release().await?;
/// // ...or one writer, with a fencing token if a counter is configured.
/// let write = config.acquire_write(Duration::from_secs(10)).await?;
/// println!("writing with fence {:?}", write.fence());
/// write.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RwLock {
    redlock: Redlock,
    name: Arc<str>,
    /// The writer, readers and waiting keys (in this order), validated.
    target: Target,
}

impl Redlock {
    /// A read-write lock named `name`. Nothing is sent until the first acquisition.
    ///
    /// ```no_run
    /// # fn run(redlock: redfence::Redlock) -> Result<(), redfence::Error> {
    /// let config = redlock.rwlock("config")?;
    /// assert_eq!(config.name(), "config");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`], before any traffic: an empty name
    /// ([`InvalidInput::EmptyResource`]), or a name whose keys a lock could not use (too long,
    /// not fenceable, or across a Cluster voter's hash slots).
    pub fn rwlock(&self, name: &str) -> Result<RwLock, Error> {
        if name.is_empty() {
            return Err(InvalidInput::EmptyResource { index: 0 }.into());
        }
        let names = key_names(name);
        let target = self.shared().target(&names, CHECK_TTL)?;
        Ok(RwLock {
            redlock: self.clone(),
            name: Arc::from(name),
            target,
        })
    }
}

/// The resource names of lock `name`'s keys: writer, readers, waiting mark.
fn key_names(name: &str) -> [String; 3] {
    [
        format!("{name}:rwlock:writer"),
        format!("{name}:rwlock:readers"),
        format!("{name}:rwlock:writer_waiting"),
    ]
}

impl RwLock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The resource names of its keys (the nodes' keys are these after the key prefix):
    /// `<name>:rwlock:writer`, `<name>:rwlock:readers`, `<name>:rwlock:writer_waiting`. The
    /// writer's fencing tokens are issued on the first.
    pub fn resources(&self) -> &[String] {
        &self.target.resources
    }

    /// Acquires a read for `ttl`, retrying as the Redlock's builder configured
    /// (`retry_count`, the backoff schedule, `acquire_timeout`) while a writer holds the lock
    /// or waits for it. Refused, it takes a place in line: the next writer's release admits
    /// it ahead of any writer waiting then (see the module's docs).
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidInput`] for a TTL a lock would refuse; nothing is sent.
    /// - [`Error::Contended`] when a writer still held or waited after the last retry.
    /// - [`Error::QuorumUnreachable`], [`Error::NoValidity`], [`Error::AcquireTimeout`],
    ///   [`Error::Closed`] as for [`Redlock::acquire`].
    pub async fn acquire_read(&self, ttl: Duration) -> Result<ReadGuard, Error> {
        self.acquire(RwMode::Read, ttl, true)
            .await
            .map(ReadGuard::new)
    }

    /// Makes one attempt at a read, without retries and without taking a place in line.
    ///
    /// # Errors
    ///
    /// As [`acquire_read`](Self::acquire_read); [`Error::Contended`] when a writer holds the
    /// lock or waits for it.
    pub async fn try_acquire_read(&self, ttl: Duration) -> Result<ReadGuard, Error> {
        self.acquire(RwMode::Read, ttl, false)
            .await
            .map(ReadGuard::new)
    }

    /// Acquires the write for `ttl`, retrying as the Redlock's builder configured. While it
    /// waits, new readers are refused (the waiting mark), so it gets in once the readers
    /// holding or admitted before it leave (see the module's docs).
    ///
    /// # Errors
    ///
    /// As [`acquire_read`](Self::acquire_read) (contention: a writer or readers still held
    /// after the last retry), and [`Error::Fencing`] when the fencing counter could not issue
    /// a token (nothing is left held).
    pub async fn acquire_write(&self, ttl: Duration) -> Result<WriteGuard, Error> {
        self.acquire(RwMode::Write, ttl, true)
            .await
            .map(WriteGuard::new)
    }

    /// Makes one attempt at the write, without retries and without marking the lock as
    /// waited for.
    ///
    /// # Errors
    ///
    /// As [`acquire_write`](Self::acquire_write); [`Error::Contended`] when a writer or a
    /// reader holds the lock.
    pub async fn try_acquire_write(&self, ttl: Duration) -> Result<WriteGuard, Error> {
        self.acquire(RwMode::Write, ttl, false)
            .await
            .map(WriteGuard::new)
    }

    /// Runs `routine` while holding a read: acquires it (with retries), keeps it alive through
    /// the lease keeper as [`Redlock::using`] does, and releases it when the routine is done.
    /// The [`Signal`] aborts when the read can no longer be guaranteed; its
    /// [`fence`](Signal::fence) is `None` (readers are not fenced).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redfence::{Error, Redlock};
    ///
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// let config = redlock.rwlock("config")?;
    /// let value = config
    ///     .using_read(Duration::from_secs(5), |signal| async move {
    ///         signal.check()?; // no writer beside us while this is Ok
    ///         Ok::<_, Error>(42)
    ///     })
    ///     .await?;
    /// # let _ = value;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The routine's own result or error, unchanged; errors of the acquisition (as
    /// [`acquire_read`](Self::acquire_read)) and TTLs `using()` refuses (as
    /// [`Redlock::using`]) go through `E::from`, and the routine never runs.
    ///
    /// # Panics
    ///
    /// As [`Redlock::using`]: resumes the routine's panic after releasing the read.
    pub async fn using_read<T, E, F, Fut>(&self, ttl: Duration, routine: F) -> Result<T, E>
    where
        F: FnOnce(Signal) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        self.using(RwMode::Read, ttl, routine).await
    }

    /// Runs `routine` while holding the write, as [`using_read`](Self::using_read); the
    /// [`Signal`]'s [`fence`](Signal::fence) is the writer's fencing token.
    ///
    /// # Errors
    ///
    /// As [`using_read`](Self::using_read), the acquisition's as
    /// [`acquire_write`](Self::acquire_write).
    ///
    /// # Panics
    ///
    /// As [`Redlock::using`].
    pub async fn using_write<T, E, F, Fut>(&self, ttl: Duration, routine: F) -> Result<T, E>
    where
        F: FnOnce(Signal) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        self.using(RwMode::Write, ttl, routine).await
    }

    async fn using<T, E, F, Fut>(&self, mode: RwMode, ttl: Duration, routine: F) -> Result<T, E>
    where
        F: FnOnce(Signal) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        let shared = self.redlock.shared();
        let acquire = self.acquire(mode, ttl, true);
        using::acquire_and_scope(&shared.config, &shared.tasks, ttl, acquire, routine).await
    }

    /// Who holds the lock on each node: the writer, the readers, whether a writer waits
    /// (advisory, one read per node, bounded by the node timeout).
    ///
    /// ```no_run
    /// # async fn run(redlock: redfence::Redlock) -> Result<(), redfence::Error> {
    /// let config = redlock.rwlock("config")?;
    /// let report = config.inspect().await?;
    /// println!("writer {:?}, {} readers", report.writer(), report.readers().len());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] after [`Redlock::close`]; a node's failure is in its row.
    pub async fn inspect(&self) -> Result<RwInspection, Error> {
        inspect::inspect(self.redlock.shared(), &self.name, &self.target.keys).await
    }
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock").field("name", &self.name).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names_share_the_name_and_end_in_no_helper_suffix() {
        let names = key_names("{cfg}");
        assert_eq!(
            names,
            [
                "{cfg}:rwlock:writer",
                "{cfg}:rwlock:readers",
                "{cfg}:rwlock:writer_waiting"
            ]
        );
        for name in &names {
            for suffix in crate::helper_keys::RESERVED {
                assert!(!name.ends_with(suffix));
            }
        }
    }
}
