//! [`ElectionBuilder`] (made by [`Redlock::election`], declared here): an election's options,
//! their defaults (the timing rule is checked in `timing.rs`).

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::identity;
use super::leadership::Leadership;
use super::record::Leader;
use super::timing::Timing;
use crate::Redlock;
use crate::error::{ConfigError, Error};
use crate::inner::Shared;

/// The longest election identity, in bytes: the leader record it is written into is read
/// as a lock key's value is, at most 4 KiB (`scripts/inspect.lua`).
const MAX_IDENTITY_LEN: usize = 1024;

/// Default [`lease`](ElectionBuilder::lease): 15 s (client-go's usual value).
const DEFAULT_LEASE: Duration = Duration::from_secs(15);
/// Default [`renew_deadline`](ElectionBuilder::renew_deadline): 10 s.
const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// Default [`retry_period`](ElectionBuilder::retry_period): 2 s.
const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// A callback run with the leader of a term.
pub(super) type Hook = Arc<dyn Fn(&Leader) + Send + Sync>;

/// The callbacks of an election; each fires only for a term this candidate actually led.
#[derive(Clone, Default)]
pub(super) struct Hooks {
    pub(super) started: Option<Hook>,
    pub(super) stopped: Option<Hook>,
}

/// One candidate in a leader election, built by
/// [`Redlock::election`](crate::Redlock::election). Cheap to clone (an `Arc` inside): keep a
/// clone to [`resign`](Election::resign) from outside [`run`](Election::run), or to watch the
/// leader.
///
/// ```no_run
/// use std::time::Duration;
/// use redfence::{Error, MemoryCounter, Redlock};
///
/// # async fn schedule_jobs(_term: u64) -> Result<(), Error> { Ok(()) }
/// # async fn run() -> Result<(), Error> {
/// let redlock = Redlock::builder()
///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     // The terms. Every candidate must share ONE counter: a MemoryCounter is per process,
///     // so candidates in two processes would each get term 1. Use a PostgresCounter
///     // (redfence-postgres).
///     .fencing(MemoryCounter::new())
///     .build()?;
/// let election = redlock
///     .election("scheduler", None) // identity: host name + random UUID
///     .lease(Duration::from_secs(15))
///     .renew_deadline(Duration::from_secs(10))
///     .retry_period(Duration::from_secs(2))
///     .build()?;
/// election
///     .run(|leadership| async move {
///         loop {
///             tokio::select! {
///                 lost = leadership.lost() => return Err(lost), // stop writing now
///                 done = schedule_jobs(leadership.term()) => done?,
///             }
///         }
///     })
///     .await
/// # }
/// ```
///
/// # How it works
///
/// A candidate campaigns by trying to take a lock on the resource `election:{NAME}` (the
/// Redis key is the builder's key prefix, then that name; the braces make it a Redis
/// Cluster hash tag). The candidate that gets it leads, with the lock's **fencing token as
/// its term**: terms strictly increase from one leader to the next, so the storage the
/// leader writes to can reject a deposed leader's late writes (see [`crate::fence`]).
///
/// While it leads, a renewal loop extends the lock to `lease` every `retry_period`. When
/// renewal has failed for `renew_deadline` (measured from the start of the last successful
/// round), the [`Leadership`] signal fires — `lease − renew_deadline` before the lease can run
/// out, never after — and the leader steps down. The timing rule is client-go's:
/// `lease > renew_deadline > 1.2 × retry_period`.
///
/// Beside the lock, the leader keeps a record at `election:{NAME}:leader` (plus the key
/// prefix): `"{term} {token} {identity}"`, written on every node whose lock key still holds
/// its token, with the lease as TTL, re-armed after every renewal and deleted when it steps
/// down. [`Election::leader`] counts a node's record only if its token matches the lock key
/// on that node, so a stale record never names a leader. The lock's own value stays the
/// random token: plain locks keep the node-redlock wire format.
#[derive(Clone)]
pub struct Election {
    pub(super) inner: Arc<Inner>,
}

/// What every clone of an [`Election`] shares.
pub(super) struct Inner {
    pub(super) redlock: Redlock,
    pub(super) shared: Arc<Shared>,
    pub(super) name: String,
    /// The lock's resource name, `election:{NAME}`.
    pub(super) resource: String,
    /// The lock's Redis key (with the key prefix).
    pub(super) lock_key: Arc<str>,
    /// The leader record's Redis key (with the key prefix).
    pub(super) record_key: Arc<str>,
    pub(super) identity: String,
    pub(super) timing: Timing,
    pub(super) rejoin: bool,
    pub(super) hooks: Hooks,
    /// The term this candidate leads now, for [`Election::resign`].
    pub(super) current: Mutex<Option<Leadership>>,
    /// How many times [`Election::resign`] was called: a term won by an attempt that was in
    /// flight meanwhile starts resigned.
    pub(super) resigns: AtomicU64,
}

impl Redlock {
    /// A candidate in the leader election `name`, with `identity` (`None`: the host name
    /// plus a random UUID, see [`default_identity`](crate::default_identity)).
    /// Set its lease, renew deadline and retry period on the returned builder, `build()` it,
    /// then [`run`](crate::Election::run) it; the election's lock is the resource
    /// `election:{NAME}` and its term the lock's fencing token, so the `Redlock` needs a
    /// fencing counter. See [`Election`](crate::Election) for how it works.
    ///
    /// ```no_run
    /// # async fn run(redlock: redfence::Redlock) -> Result<(), redfence::Error> {
    /// let election = redlock.election("scheduler", Some("worker-1")).build()?;
    /// if let Some(leader) = election.leader().await? {
    ///     println!("{} leads in term {}", leader.identity, leader.term);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn election(&self, name: &str, identity: Option<&str>) -> ElectionBuilder {
        ElectionBuilder::new(self.clone(), Arc::clone(self.shared()), name, identity)
    }
}

/// Options of one candidate in a leader election; [`build`](ElectionBuilder::build) checks
/// them. Made by [`Redlock::election`].
#[must_use = "an election builder does nothing until built and run"]
pub struct ElectionBuilder {
    redlock: Redlock,
    shared: Arc<Shared>,
    name: String,
    identity: Option<String>,
    lease: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
    rejoin: bool,
    hooks: Hooks,
}

impl ElectionBuilder {
    pub(crate) fn new(
        redlock: Redlock,
        shared: Arc<Shared>,
        name: &str,
        identity: Option<&str>,
    ) -> Self {
        ElectionBuilder {
            redlock,
            shared,
            name: name.to_owned(),
            identity: identity.map(str::to_owned),
            lease: DEFAULT_LEASE,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
            rejoin: false,
            hooks: Hooks::default(),
        }
    }

    /// The lease: the TTL of the election's lock, renewed every retry period. Other
    /// candidates wait it out when a leader dies without releasing. Defaults to 15 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long renewal may keep failing, from the start of the last successful round,
    /// before the leader's signal fires and it steps down. Must be below the lease (minus
    /// its drift allowance) and above 1.2 × the retry period. Defaults to 10 s.
    pub fn renew_deadline(mut self, renew_deadline: Duration) -> Self {
        self.renew_deadline = renew_deadline;
        self
    }

    /// How often a candidate tries to become leader (each wait stretched by a random 0–20 %,
    /// so that candidates started together do not keep trying at the same instants), and a
    /// leader renews its lease (and retries a failed renewal). Also the polling interval of
    /// [`Election::observe`]. Defaults to 2 s.
    pub fn retry_period(mut self, retry_period: Duration) -> Self {
        self.retry_period = retry_period;
        self
    }

    /// Whether [`Election::run`] campaigns again after a term whose routine returned `Err`
    /// (leadership lost, or any failure), one retry period after stepping down. A routine
    /// that returns `Ok` always ends `run`. Defaults to `false`: `run` returns after one term.
    pub fn rejoin(mut self, rejoin: bool) -> Self {
        self.rejoin = rejoin;
        self
    }

    /// Called with the leader (this candidate, with its term) when it has been elected,
    /// before the routine starts. Never called for a candidate that did not lead. Must not
    /// block; a panic in it is caught and logged. No callback by default.
    pub fn on_started_leading(mut self, hook: impl Fn(&Leader) + Send + Sync + 'static) -> Self {
        self.hooks.started = Some(Arc::new(hook));
        self
    }

    /// Called once per term this candidate led, after it stepped down (the routine returned
    /// and the lock was released), or when `run` is dropped during a term. Never called for
    /// a candidate that did not lead. Must not block; a panic in it is caught and logged. No
    /// callback by default.
    pub fn on_stopped_leading(mut self, hook: impl Fn(&Leader) + Send + Sync + 'static) -> Self {
        self.hooks.stopped = Some(Arc::new(hook));
        self
    }

    /// Checks the options and returns the [`Election`]. Nothing is sent.
    ///
    /// # Errors
    ///
    /// - [`ConfigError::ElectionWithoutFencing`] when the `Redlock` has no fencing counter
    ///   (the terms are its tokens).
    /// - [`ConfigError::ElectionTiming`] unless `lease > renew_deadline > 1.2 ×
    ///   retry_period > 0` and `renew_deadline < lease − drift(lease)`.
    /// - [`ConfigError::BadOption`] for an empty name or identity, or, with Cluster voters, a
    ///   name or key prefix that puts the lock and the leader record in different slots (the
    ///   name is their hash tag: a name starting with `}` breaks it).
    /// - [`Error::InvalidInput`] for a lease `acquire` would reject, or a resource name the
    ///   fencing counter cannot store.
    pub fn build(self) -> Result<Election, Error> {
        let config = &self.shared.config;
        if config.fencing.is_none() {
            return Err(ConfigError::ElectionWithoutFencing.into());
        }
        if self.name.is_empty() {
            return Err(bad_option("election name", "must not be empty"));
        }
        let identity = match self.identity {
            Some(identity) if identity.is_empty() => {
                return Err(bad_option("election identity", "must not be empty"));
            }
            // The leader record ("term token identity") is read as a lock key's value is,
            // at most 4 KiB (scripts/inspect.lua): a longer one would hide the leader.
            Some(identity) if identity.len() > MAX_IDENTITY_LEN => {
                return Err(bad_option(
                    "election identity",
                    &format!(
                        "is {} bytes long; at most {MAX_IDENTITY_LEN} are allowed",
                        identity.len()
                    ),
                ));
            }
            Some(identity) => identity,
            None => identity::default_identity(),
        };
        let timing = Timing::validate(
            self.lease,
            self.renew_deadline,
            self.retry_period,
            config.drift_factor,
        )?;
        let resource = format!("election:{{{}}}", self.name);
        let target = self.shared.target(&[&resource], timing.lease)?;
        let lock_key: Arc<str> = Arc::from(target.keys.first().map_or("", String::as_str));
        let record_key: Arc<str> = Arc::from(format!("{lock_key}:leader"));
        // On a Cluster voter both keys must share a slot: the name is their hash tag, which a
        // name starting with `}` or a key prefix with an empty tag (`{}`) breaks.
        let both = [lock_key.to_string(), record_key.to_string()];
        if self.shared.one_call_each(&both).is_err() {
            return Err(bad_option(
                "election name",
                "puts the election's lock and leader record in different Redis Cluster slots \
                 (a name starting with '}', or an empty hash tag {} in the key prefix)",
            ));
        }
        Ok(Election {
            inner: Arc::new(Inner {
                redlock: self.redlock,
                shared: self.shared,
                name: self.name,
                resource,
                lock_key,
                record_key,
                identity,
                timing,
                rejoin: self.rejoin,
                hooks: self.hooks,
                current: Mutex::new(None),
                resigns: AtomicU64::new(0),
            }),
        })
    }
}

fn bad_option(option: &'static str, reason: &str) -> Error {
    ConfigError::BadOption {
        option,
        reason: reason.to_owned(),
    }
    .into()
}

impl fmt::Debug for ElectionBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ElectionBuilder")
            .field("name", &self.name)
            .field("identity", &self.identity)
            .field("lease", &self.lease)
            .field("renew_deadline", &self.renew_deadline)
            .field("retry_period", &self.retry_period)
            .field("rejoin", &self.rejoin)
            .finish()
    }
}
