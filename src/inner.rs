//! The internals every public type is built on: the state that every clone of a `Redlock` and
//! every lock it hands out share ([`Shared`]), a validated request ([`Target`]), and one lock
//! as the nodes know it ([`Held`]).

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::error::{Error, InvalidInput, NodeError, NodeFailure};
use crate::events::Event;
use crate::hand_off::{HandOff, Hold};
use crate::node::{Node, Op, QueueTicket, Request, RwOp, Voter, VoterKind};
use crate::quorum::{self, Round, Until};

/// The longest TTL redfence sends to Redis: about 146 million years, far inside what Redis
/// accepts for `PX` and what an [`Instant`](std::time::Instant) can represent.
pub const MAX_TTL: Duration = Duration::from_millis(i64::MAX as u64 / 2);

/// The most resources one lock may hold. Every resource is a key in one script call per
/// node, and a script blocks its Redis server while it runs: a lock over more keys than this
/// would stall every other client of the node. Larger requests fail with
/// [`InvalidInput::TooManyResources`] before any traffic.
pub const MAX_RESOURCES: usize = 1_000;

/// The longest resource name, in bytes (64 KiB). Every name is written to every node in each
/// of the lock's calls, and a lock key's name is read by the server while it runs the script:
/// a longer name would slow every lock that shares the node's queue with it. Longer names
/// fail with [`InvalidInput::ResourceTooLong`] before any traffic.
pub const MAX_RESOURCE_LEN: usize = 64 * 1024;

/// The most bytes of resource names one lock may hold, all its names together (1 MiB); a
/// larger request fails with [`InvalidInput::ResourcesTooLarge`] before any traffic.
pub const MAX_RESOURCE_BYTES: usize = 1024 * 1024;

/// What every clone of a `Redlock`, and every lock it hands out, share.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) nodes: Vec<Arc<dyn Node>>,
    /// What kind of voter each node is.
    kinds: Vec<VoterKind>,
    /// Background work: first connects, straggler drains, releases of dropped locks and of
    /// abandoned attempts. `Redlock::close` waits for it.
    pub(crate) tasks: TaskTracker,
    /// Set by `Redlock::close`: no new acquisition starts.
    closed: AtomicBool,
    /// Waiters' lines and release notifications.
    pub(crate) hand_off: HandOff,
}

/// A validated lock request: resource names, their keys and the TTL.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) resources: Arc<[String]>,
    pub(crate) keys: Arc<[String]>,
    pub(crate) ttl: Duration,
    /// Whether its acquisition takes a place in the nodes' fair queues: the builder's `fair`,
    /// unless a primitive orders its waiters another way (a semaphore's slots).
    pub(crate) fair: bool,
    /// Whether a granted lock asks the fencing counter, if any, for a token: yes, unless the
    /// lock guards no writes (a semaphore's line).
    pub(crate) fenced: bool,
}

impl Target {
    /// The same request outside the nodes' fair queues.
    pub(crate) fn unqueued(self) -> Target {
        Target {
            fair: false,
            ..self
        }
    }

    /// The same request without a fencing token.
    pub(crate) fn unfenced(self) -> Target {
        Target {
            fenced: false,
            ..self
        }
    }
}

/// One lock as the nodes know it: its keys, owner token and TTL.
#[derive(Clone)]
pub(crate) struct Held {
    pub(crate) shared: Arc<Shared>,
    pub(crate) target: Target,
    pub(crate) token: Arc<str>,
    /// Marks the keys as held by this process once granted; dropped with the last copy of
    /// the lock (after its release), which wakes the next waiter here.
    pub(crate) hold: Option<Arc<Hold>>,
    /// Fair mode: the place this lock's acquisition took in the keys' queues, left on every
    /// node by its release (the nodes that did not grant still hold it).
    pub(crate) queue: Option<Arc<QueueTicket>>,
    /// A read-write lock's side (reader or writer), sent with each of its requests; `None`
    /// for a mutex.
    pub(crate) rw: Option<Arc<RwOp>>,
    /// The longest TTL any round of this lock sent (its acquire's, or an extension's, failed
    /// ones too: they may have reached some node): how long its keys may live on a node, so
    /// how long a release given up is sent again.
    pub(crate) longest_ttl: Duration,
}

impl Shared {
    /// Asks every node in parallel (`ask` makes the call for one node), each bounded by the
    /// node timeout: the replies in node order, failures named with the node. For the
    /// advisory calls outside a lock's rounds (reads of a majority, claims).
    pub(crate) async fn ask_every_node<T, F, Fut>(&self, ask: F) -> Vec<Result<T, NodeError>>
    where
        F: Fn(Arc<dyn Node>) -> Fut,
        Fut: Future<Output = Result<T, NodeFailure>>,
    {
        let timeout = self.config.node_timeout;
        let calls = self.nodes.iter().enumerate().map(|(index, node)| {
            let call = ask(Arc::clone(node));
            async move {
                let reply = match tokio::time::timeout(timeout, call).await {
                    Ok(reply) => reply,
                    Err(_) => Err(NodeFailure::Timeout(timeout)),
                };
                reply.map_err(|failure| NodeError {
                    index,
                    addr: node.addr().to_owned(),
                    failure,
                })
            }
        });
        futures::future::join_all(calls).await
    }

    pub(crate) fn new(config: Config, voters: Vec<Voter>, tasks: TaskTracker) -> Self {
        let mut nodes = Vec::with_capacity(voters.len());
        let mut kinds = Vec::with_capacity(voters.len());
        let mut pubsub = Vec::with_capacity(voters.len());
        for voter in voters {
            nodes.push(voter.node);
            kinds.push(voter.kind);
            pubsub.push(voter.pubsub);
        }
        Shared {
            config,
            hand_off: HandOff::new(pubsub),
            nodes,
            kinds,
            tasks,
            closed: AtomicBool::new(false),
        }
    }

    /// Refuses new acquisitions from now on.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// `Err(Closed)` once `close` was called.
    pub(crate) fn check_open(&self) -> Result<(), Error> {
        if self.closed.load(Ordering::SeqCst) {
            Err(Error::Closed)
        } else {
            Ok(())
        }
    }

    /// Validates a request before any traffic: the TTL, then every resource name (linear in
    /// their number, which is capped), then that the fencing counter can store each name.
    pub(crate) fn target(
        &self,
        resources: &[impl AsRef<str>],
        ttl: Duration,
    ) -> Result<Target, InvalidInput> {
        let config = &self.config;
        let ttl = validate_ttl(ttl, config.drift_factor)?;
        let names = resource_names(resources)?;
        if let Some(counter) = &config.fencing {
            for (index, name) in names.iter().enumerate() {
                if let Err(reason) = counter.check_resource(name) {
                    return Err(InvalidInput::ResourceNotFenceable { index, reason });
                }
            }
        }
        let keys = self.keys(&names);
        no_helper_keys(&names, &keys)?;
        self.one_call_each(&keys)?;
        Ok(Target {
            keys,
            resources: names.into(),
            ttl,
            fair: config.fair,
            fenced: true,
        })
    }

    /// Checks that every node can take `keys` in one call: a Cluster voter only when they
    /// share a hash slot.
    pub(crate) fn one_call_each(&self, keys: &[String]) -> Result<(), InvalidInput> {
        for (node, (n, kind)) in self.nodes.iter().zip(&self.kinds).enumerate() {
            if let Some((first, second)) = kind.split_keys(keys) {
                return Err(InvalidInput::KeysAcrossSlots {
                    node,
                    addr: n.addr().to_owned(),
                    first,
                    second,
                });
            }
        }
        Ok(())
    }

    /// The Redis key of each resource: the key prefix, then the name.
    pub(crate) fn keys(&self, names: &[String]) -> Arc<[String]> {
        names
            .iter()
            .map(|name| format!("{}{}", self.config.key_prefix, name))
            .collect()
    }
}

/// Refuses a resource whose key (`keys[i]`, of `names[i]`) ends like a lock's helper key
/// (its waiting mark, fair queue or lease set), or whose name is a voter's memory marker or
/// roster key: locking, inspecting or deleting it would touch another lock's helper, or the
/// restart quarantine's memory.
pub(crate) fn no_helper_keys(names: &[String], keys: &[String]) -> Result<(), InvalidInput> {
    for (index, key) in keys.iter().enumerate() {
        let name = names[index].as_str();
        let memory = if name == crate::memory::MARKER {
            Some(crate::memory::MARKER)
        } else {
            name.starts_with(crate::memory::ROSTER)
                .then_some(crate::memory::ROSTER)
        };
        if let Some(suffix) = reserved_suffix(key).or(memory) {
            return Err(InvalidInput::ReservedName {
                index,
                resource: names[index].clone(),
                suffix,
            });
        }
    }
    Ok(())
}

/// The reserved ending `key` has, if any.
fn reserved_suffix(key: &str) -> Option<&'static str> {
    crate::helper_keys::RESERVED
        .into_iter()
        .find(|suffix| key.ends_with(suffix))
}

/// Checks resource names (at least one, at most [`MAX_RESOURCES`], none empty or longer than
/// [`MAX_RESOURCE_LEN`], at most [`MAX_RESOURCE_BYTES`] together, no duplicates) in time linear
/// in their number, and returns them.
pub(crate) fn resource_names(resources: &[impl AsRef<str>]) -> Result<Vec<String>, InvalidInput> {
    if resources.is_empty() {
        return Err(InvalidInput::NoResources);
    }
    if resources.len() > MAX_RESOURCES {
        return Err(InvalidInput::TooManyResources {
            given: resources.len(),
            max: MAX_RESOURCES,
        });
    }
    // (No set for the usual single resource: it cannot repeat.)
    let mut seen: HashSet<&str> = match resources.len() {
        1 => HashSet::new(),
        n => HashSet::with_capacity(n),
    };
    let mut names: Vec<String> = Vec::with_capacity(resources.len());
    let mut total = 0;
    for (index, resource) in resources.iter().enumerate() {
        let name = resource.as_ref();
        if name.is_empty() {
            return Err(InvalidInput::EmptyResource { index });
        }
        if name.len() > MAX_RESOURCE_LEN {
            return Err(InvalidInput::ResourceTooLong {
                index,
                len: name.len(),
                max: MAX_RESOURCE_LEN,
            });
        }
        total += name.len();
        if total > MAX_RESOURCE_BYTES {
            return Err(InvalidInput::ResourcesTooLarge {
                index,
                max: MAX_RESOURCE_BYTES,
            });
        }
        if resources.len() > 1 && !seen.insert(name) {
            return Err(InvalidInput::DuplicateResource {
                resource: name.to_owned(),
            });
        }
        names.push(name.to_owned());
    }
    Ok(names)
}

impl Held {
    /// The request for one of this lock's rounds. The keys' server-side TTL of an acquire or
    /// an extend is `ttl` plus the lock-delay (`RedlockBuilder::lock_delay`); the validity is
    /// always computed from `ttl` alone, by the caller. A release carries the same (the
    /// script ignores it): a release given up is sent again for as long as the keys may live.
    pub(crate) fn request(&self, op: Op, ttl: Duration) -> Request {
        let server_ttl = match op {
            Op::Acquire | Op::Extend | Op::Release => {
                ttl.saturating_add(self.shared.config.lock_delay)
            }
            Op::Leave => ttl,
        };
        Request {
            op,
            keys: Arc::clone(&self.target.keys),
            token: Arc::clone(&self.token),
            ttl_ms: millis(server_ttl),
            queue: self.queue.clone(),
            rw: self.rw.clone(),
        }
    }

    /// Sends one request for this lock to every node; on each node it runs after the lock's
    /// earlier calls (the node's queue keeps their order).
    pub(crate) async fn round(&self, op: Op, ttl: Duration, until: Until) -> Round {
        let req = self.request(op, ttl);
        quorum::fan_out(&self.shared.nodes, &req, until).await
    }

    /// Compare-and-delete on every node in the background (tracked, so `Redlock::close` waits
    /// for it); a release that reaches no majority is reported as [`Event::ReleaseFailed`].
    /// Does nothing outside a Tokio runtime: the keys then expire at the end of their TTL.
    pub(crate) fn release_in_background(&mut self) {
        if tokio::runtime::Handle::try_current().is_err() {
            tracing::debug!(resources = ?self.target.resources, "lock dropped outside a runtime; it will expire on its own");
            return;
        }
        let held = self.clone();
        self.shared.tasks.spawn(async move {
            let shared = &held.shared;
            let tally = held
                .round(Op::Release, held.longest_ttl, Until::All)
                .await
                .finish(&shared.nodes, Op::Release)
                .await;
            if tally.answered() < tally.quorum() {
                shared.config.events.emit(Event::ReleaseFailed {
                    resources: held.target.resources.to_vec(),
                    error: tally.unreachable(),
                });
            }
        });
    }
}

/// Checks a TTL against Redis's resolution, the drift allowance and [`MAX_TTL`]; returns it
/// rounded down to whole milliseconds (what Redis is sent).
pub(crate) fn validate_ttl(ttl: Duration, drift_factor: f64) -> Result<Duration, InvalidInput> {
    if ttl < Duration::from_millis(1) {
        return Err(InvalidInput::ZeroTtl { ttl });
    }
    if ttl > MAX_TTL {
        return Err(InvalidInput::TtlTooLong { ttl, max: MAX_TTL });
    }
    let whole = Duration::from_millis(millis(ttl));
    let drift = quorum::drift(whole, drift_factor);
    if whole <= drift {
        return Err(InvalidInput::TtlTooShort { ttl, drift });
    }
    Ok(whole)
}

/// Whole milliseconds, as Redis takes them (a valid TTL always fits).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_validation() {
        assert!(matches!(
            validate_ttl(Duration::ZERO, 0.01),
            Err(InvalidInput::ZeroTtl { .. })
        ));
        assert!(matches!(
            validate_ttl(Duration::from_micros(999), 0.01),
            Err(InvalidInput::ZeroTtl { .. })
        ));
        assert!(matches!(
            validate_ttl(Duration::from_millis(2), 0.01),
            Err(InvalidInput::TtlTooShort { .. })
        ));
        // 100 ms with a drift factor of 0.99: drift = 99 + 2 ms > 100 ms.
        assert!(matches!(
            validate_ttl(Duration::from_millis(100), 0.99),
            Err(InvalidInput::TtlTooShort { .. })
        ));
        assert!(matches!(
            validate_ttl(Duration::MAX, 0.01),
            Err(InvalidInput::TtlTooLong { .. })
        ));
        assert_eq!(
            validate_ttl(Duration::from_micros(10_500), 0.01).ok(),
            Some(Duration::from_millis(10))
        );
        assert!(validate_ttl(MAX_TTL, 0.01).is_ok());
    }
}
