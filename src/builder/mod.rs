//! `RedlockBuilder` (made by `Redlock::builder`, declared here) and the validated `Config` it
//! produces.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::error::ConfigError;
use crate::events::{Event, EventHook};
use crate::fence::FencingCounter;
use crate::inner::Shared;
use crate::memory::MemoryBook;
use crate::node::Voter;
use crate::node_addr::NodeAddr;
use crate::redlock::Redlock;
use crate::resource_type::ResourceType;
use crate::retry::Backoff;
#[cfg(test)]
use crate::testing::fake::{Fake, FakeNode};

/// Builds a [`Redlock`]. Every option has a documented default; nothing is checked until
/// [`build`](RedlockBuilder::build), which validates everything at once.
///
/// ```
/// use std::time::Duration;
/// # fn main() -> Result<(), redfence::Error> {
/// let redlock = redfence::Redlock::builder()
///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     .node_timeout(Duration::from_millis(50))
///     .retry_count(5)
///     .key_prefix("locks:")
///     .build()?; // connects lazily: no server needs to be up yet
/// # drop(redlock);
/// # Ok(())
/// # }
/// ```
#[must_use = "a builder does nothing until `build()` is called"]
#[derive(Debug, Default)]
pub struct RedlockBuilder {
    nodes: Vec<NodeAddr>,
    config: Config,
}

impl Redlock {
    /// A builder with every option at its default.
    pub fn builder() -> RedlockBuilder {
        RedlockBuilder::new()
    }
}

impl RedlockBuilder {
    /// A builder with no node and every option at its default.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one independent Redis master. Give 1, 3 or 5 (an odd number: an even one adds a
    /// node without adding a failure it can survive).
    pub fn node(mut self, node: impl Into<NodeAddr>) -> Self {
        self.nodes.push(node.into());
        self
    }

    /// Adds several independent Redis masters. They must be *independent*: no replication
    /// between them.
    pub fn nodes<I>(mut self, nodes: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<NodeAddr>,
    {
        self.nodes.extend(nodes.into_iter().map(Into::into));
        self
    }

    /// The share of the TTL set aside for clock drift between this process and the Redis
    /// servers: a lock's validity is `ttl - elapsed - (ttl * drift_factor + 2 ms)`.
    /// Must be finite and in `[0, 1)`. Defaults to `0.01`.
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.config.drift_factor = factor;
        self
    }

    /// The longest any single node call may take; a node that does not answer in time counts
    /// as failed for that attempt, so one slow or hung node never slows a lock down.
    ///
    /// Defaults to 50 ms: several times a loaded LAN round trip, yet small next to any TTL
    /// worth using (it is also the most validity a slow node can cost). The Redlock paper
    /// suggests 5–50 ms for a 10 s TTL. Raise it for nodes across a WAN.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.config.node_timeout = timeout;
        self
    }

    /// How many times `acquire` retries after a failed first attempt (so it makes up to
    /// `retry_count + 1` attempts). [`try_acquire`](Redlock::try_acquire) never retries.
    /// Defaults to 10. Sets the retry count of the current [`backoff`](Self::backoff).
    pub fn retry_count(mut self, count: u32) -> Self {
        self.config.backoff = self.config.backoff.retries(count);
        self
    }

    /// The base delay between attempts of the fixed schedule (see [`Backoff::fixed`]).
    /// Defaults to 200 ms. Replaces an exponential schedule set with [`backoff`](Self::backoff).
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.config.backoff = self.config.backoff.with_delay(delay);
        self
    }

    /// The largest random deviation from `retry_delay`, either way (see [`Backoff::fixed`]).
    /// Defaults to 100 ms. Replaces an exponential schedule set with [`backoff`](Self::backoff).
    pub fn retry_jitter(mut self, jitter: Duration) -> Self {
        self.config.backoff = self.config.backoff.with_jitter(jitter);
        self
    }

    /// The whole retry schedule, its retry count included: e.g.
    /// `Backoff::exponential(base, max).retries(5)` for exponential backoff with full jitter.
    /// Defaults to [`Backoff::DEFAULT`] (10 retries, 200 ms ± 100 ms).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.config.backoff = backoff;
        self
    }

    /// An overall deadline for `acquire` and `using`, retries included: no attempt starts
    /// after it, and no retry waits past it; they then fail with [`Error::AcquireTimeout`](crate::Error::AcquireTimeout).
    /// It is checked between attempts: an attempt under way when it passes runs to its end
    /// (bounded by `node_timeout` and `fencing_timeout`), and a lock it wins is returned.
    /// Defaults to none: `retry_count` bounds them.
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.config.acquire_timeout = Some(timeout);
        self
    }

    /// `using()` extends the lock shortly before its remaining validity falls below this
    /// (early enough to retry a failed round), and aborts the signal when no extension
    /// succeeded by the time less than this is left. Defaults to 500 ms. The TTLs given to
    /// `using()` must exceed it plus the drift allowance.
    pub fn automatic_extension_threshold(mut self, threshold: Duration) -> Self {
        self.config.extension_threshold = threshold;
        self
    }

    /// The most extensions `using()` makes for one lock; then the signal aborts with
    /// [`Error::RenewalLimit`](crate::Error::RenewalLimit) and the lock expires on its own. Defaults to no limit.
    pub fn max_extensions(mut self, max: u32) -> Self {
        self.config.max_extensions = Some(max);
        self
    }

    /// The longest `using()` keeps one lock alive, counted from the start of its winning
    /// acquire round: no extension lets the keys live past it, and `using()` refuses a TTL
    /// above it ([`InvalidInput::TtlAboveMaxHold`](crate::InvalidInput::TtlAboveMaxHold)). The signal aborts with
    /// [`Error::RenewalLimit`](crate::Error::RenewalLimit) before `max_hold` has passed (when the last lease the bound
    /// allows falls below the extension threshold: up to one TTL early), and the lock then
    /// expires on its own. Defaults to no limit.
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.config.max_hold = Some(max);
        self
    }

    /// The counter that issues a fencing token for every acquisition (see [`FencingCounter`]).
    /// A counter shared with other code can be given in an `Arc`. Defaults to none: locks
    /// carry no fence.
    pub fn fencing(mut self, counter: impl FencingCounter + 'static) -> Self {
        self.config.fencing = Some(Arc::new(counter));
        self
    }

    /// The longest the fencing counter may take to issue a token (it is also bounded by the
    /// lock's validity). Defaults to 1 s.
    pub fn fencing_timeout(mut self, timeout: Duration) -> Self {
        self.config.fencing_timeout = timeout;
        self
    }

    /// A prefix put before every resource name to form its Redis key. Defaults to empty, which
    /// is wire-compatible with node-redlock and redsync: the key is the resource name. At most
    /// 1 KiB ([`build`](Self::build) refuses a longer one).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.key_prefix = prefix.into();
        self
    }

    /// Fair mode: waiters for a resource are served in the order they started waiting,
    /// across processes. Defaults to `false`.
    ///
    /// Without it, waiters inside one `Redlock` already take turns in FIFO order and wake as
    /// soon as a release reaches them; but between processes the fastest to ask after a
    /// release wins. With it, each acquisition takes a place in a queue on every node (a
    /// sorted set beside each key, by the time it started waiting), and a node grants only
    /// the waiter at the head of every key's queue. A release tells the waiters which one is
    /// next, so only that one retries at once. See the README's "Hot resources" for the
    /// guarantees and the cost.
    ///
    /// - Safety is unchanged: a lock is still granted only by a majority, each node still
    ///   sets a key only where no other owner holds it.
    /// - Order is by each client's wall clock when it started waiting: clients whose clocks
    ///   disagree by more than a hold time are served in their clocks' order, not the true one.
    /// - A waiter that stops asking (a crashed process) keeps its place for its lease,
    ///   `max(3 × the longest retry delay + node_timeout, 1 s)`, then is dropped.
    /// - Clients without fair mode (or node-redlock) on the same resource do not queue: they
    ///   take a free lock whoever waits.
    /// - A [`Semaphore`](crate::Semaphore)'s waiters queue on the semaphore's line (one fair
    ///   lock per semaphore), not on its slots; see its docs.
    /// - Needs single-server nodes (a Sentinel group's master is one): `build()` refuses it
    ///   with Redis Cluster voters ([`ConfigError::FairQueueUnsupported`]).
    pub fn fair(mut self, fair: bool) -> Self {
        self.config.fair = fair;
        self
    }

    /// How long a lock server that lost any of its memory does not count toward a majority
    /// for an acquisition (nor for confirming an extension), for every client: one that saw the
    /// loss and a process started after it alike. Redlock's known weakness: a server that
    /// forgot the locks it granted lets a second owner get a majority with its vote during
    /// their TTL. A quarantined server's vote is still cast and its key still written (and
    /// released if the attempt fails), but the grant counts as a
    /// [`NodeFailure::Quarantined`](crate::NodeFailure::Quarantined); an extension does not set
    /// its missing key again until it is out of quarantine.
    ///
    /// **Default: 60 s plus the [`lock_delay`](Self::lock_delay).** Set it to at least the
    /// longest TTL any client uses on these servers plus the lock-delay (a loss forgets the
    /// delay's keys too); a day at most (`build()` refuses more). [`Duration::ZERO`] turns it
    /// off, with every check below.
    ///
    /// A server has lost memory when it lost any of its keys, whatever the cause:
    /// - a restart without persistence, `FLUSHALL` or `FLUSHDB`, a failover to an empty
    ///   replica: its memory marker (`<prefix>redfence:memory`, a random id with no TTL) is
    ///   gone, while the other servers' rosters (`<prefix>redfence:roster:<server>`) remember
    ///   it. A client started afterwards sees that too;
    /// - a restart that reloaded a snapshot or an AOF, which may miss the latest grants: its
    ///   marker is older than its start, and it started less than the period ago;
    /// - seen by a connected client: a new `run_id`, a new replication id (a failover), evicted
    ///   keys, or a step of the server's clock beyond the drift bound (its expiries were wrong).
    ///   The client replaces the server's marker, so that every other client sees the loss.
    ///
    /// The period is counted from the loss, by the least of the server's own clock and the
    /// clocks of the other servers that recorded it, so one stepped clock cannot end it early.
    /// A brand-new set of servers (no client has locked there yet) grants at once.
    ///
    /// What it cannot see: the memory of **every** server lost at once without persistence
    /// (no roster is left to remember it), and an eviction while no client was connected.
    /// [Fencing tokens](Self::fencing) protect the data in those cases. Name every server the
    /// same way (the same URLs) in every client: the rosters are kept by name. The checks read
    /// `INFO` and run `scripts/memory.lua` (`GET`, `SET`, `TIME` on the two keys above, by
    /// `EVALSHA` after a `SCRIPT LOAD`) beside the lock calls, once a second at most, with no
    /// round trip of their own but the first. A server that refuses them for good (an ACL
    /// without `INFO` or `TIME`) is not quarantined for what they would show. Any other failure
    /// to read it, or a connection lost on any call, makes the server suspect: its votes do
    /// not count until it is read again. A Sentinel voter is quarantined as a server, and a new
    /// master (a failover) counts as a restart; Cluster voters are not quarantined.
    pub fn restart_quarantine(mut self, period: Duration) -> Self {
        self.config.restart_quarantine = Some(period);
        self
    }

    /// Chubby's lock-delay: when a lock ends without a release (its holder crashed, hung or
    /// lost it), nobody can take its resources until `delay` after its expiry; a release frees
    /// them at once. The keys' server-side TTL of acquire and extend is `ttl + delay`, while the
    /// holder's validity (and every expiry this client computes) is still that of `ttl`.
    /// Defaults to zero (off); at most an hour (`build()` refuses more).
    ///
    /// Other clients on the same resources (node-redlock, redsync) see the longer TTL too: to
    /// them the lock simply lasts `delay` longer.
    pub fn lock_delay(mut self, delay: Duration) -> Self {
        self.config.lock_delay = delay;
        self
    }

    /// Whether a lock on one key goes as plain commands, without Lua, on servers that have
    /// compare-and-delete (Valkey 9's `DELIFEQ`, Redis 8.4's `DELEX`): `SET k t NX PX ttl` to
    /// acquire (one that finds the key taken is settled by the script, which marks it as
    /// waited for), `SET k t IFEQ t PX ttl` to extend and `DELIFEQ k t` (`DELEX k IFEQ t`) to
    /// release, which costs the server much less than the script. Defaults to `true`; other
    /// servers, locks on several keys and fair mode always use the script. Keys and values
    /// are the same either way.
    ///
    /// Each server is asked once per connection (`COMMAND INFO DELIFEQ DELEX`; a user not
    /// allowed to ask gets the script). Acquires go plain only after a release went through, and a
    /// refused plain command (`NOPERM`, or an unknown command after the server was replaced
    /// by an older one) turns that connection back to the script, so that an ACL user
    /// without `+delifeq` still releases what it acquires. An ACL line for plain commands
    /// adds `+command|info +delifeq` (`+delex` on Redis 8.4; see the README's ACL line).
    pub fn native_commands(mut self, native: bool) -> Self {
        self.config.native_commands = native;
        self
    }

    /// How a resource name maps to its *type*, the `type` label of the metrics (feature
    /// `metrics`), which never carry resource names. Defaults to
    /// [`ResourceType::prefix_before(':')`](ResourceType::prefix_before): `invoice:4821` is of
    /// type `invoice`, a name without `:` of type `other`. Types are cut to 32 bytes and at
    /// most 100 are reported per process (see [`ResourceType`]).
    pub fn resource_type(mut self, rule: ResourceType) -> Self {
        self.config.resource_type = rule;
        self
    }

    /// A hook that receives background [`Event`]s: failed extension rounds (with each node's
    /// error), aborted signals, failed background releases. Defaults to none (events are still
    /// logged with `tracing`). Keep it quick: it runs on the extension task.
    pub fn on_event(mut self, hook: impl Fn(&Event) + Send + Sync + 'static) -> Self {
        self.config.events = EventHook::new(hook);
        self
    }

    /// Validates every option and returns the [`Redlock`].
    ///
    /// Connections are lazy: nothing is sent until the first lock, so this succeeds while
    /// nodes are down. Needs no runtime; the first lock must run inside a Tokio runtime.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when no node is given, a URL does not parse, two nodes point at the
    /// same server, or an option is out of range. It converts into [`Error::Config`](crate::Error::Config).
    ///
    /// Two nodes are the same server when their host names resolve to a common address and
    /// port (names are resolved once, here, with the system resolver; a name that does not
    /// resolve is compared as written), or when they name the same Unix socket: so
    /// `redis://localhost:6379` and `redis://127.0.0.1:6379` are rejected, whatever their
    /// database numbers. One server reached through two different addresses (its LAN address
    /// and a public one, or through a proxy or a NAT) cannot be told apart here: keep the
    /// node list free of such aliases.
    pub fn build(self) -> Result<Redlock, ConfigError> {
        let config = self.config;
        config.validate()?;
        if self.nodes.is_empty() {
            return Err(ConfigError::NoNodes);
        }
        let tasks = TaskTracker::new();
        let memory = Arc::new(MemoryBook::new(config.quarantine().period));
        let mut voters: Vec<Voter> = Vec::with_capacity(self.nodes.len());
        for (index, addr) in self.nodes.into_iter().enumerate() {
            let voter = addr.into_voter(index, &config, &tasks, &memory)?;
            if let Some(first) = voters
                .iter()
                .position(|v| !v.identities.is_disjoint(&voter.identities))
            {
                return Err(ConfigError::DuplicateNode {
                    first,
                    second: index,
                    addr: voter.node.addr().to_owned(),
                });
            }
            if config.fair && !voter.kind.queues() {
                return Err(ConfigError::FairQueueUnsupported {
                    index,
                    addr: voter.node.addr().to_owned(),
                });
            }
            voters.push(voter);
        }
        Ok(Redlock::from_shared(Shared::new(config, voters, tasks)))
    }

    /// Builds a `Redlock` over `n` healthy fake nodes instead of the configured URLs, and
    /// returns the fakes too (to steer and inspect them).
    #[cfg(test)]
    pub(crate) fn build_over_fakes(self, n: usize) -> (Vec<Arc<FakeNode>>, Redlock) {
        let (fakes, nodes) = crate::testing::fake::fakes(&vec![Fake::Real; n]);
        for fake in &fakes {
            fake.set_timeout(self.config.node_timeout);
        }
        let voters = nodes
            .into_iter()
            .map(|node| Voter {
                node,
                kind: crate::node::VoterKind::Server,
                identities: std::collections::BTreeSet::new(),
                pubsub: None,
            })
            .collect();
        let redlock = self
            .config
            .validate()
            .map(|()| Redlock::from_shared(Shared::new(self.config, voters, TaskTracker::new())))
            .expect("a valid test configuration");
        (fakes, redlock)
    }
}

#[cfg(test)]
mod tests;
