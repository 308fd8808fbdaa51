//! `Redlock`: acquire a lock on a majority of independent Redis masters.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::builder::{Config, RedlockBuilder};
use crate::clock;
use crate::error::FencingError;
use crate::lock::Lock;
use crate::node::{Op, RedisNode, Request};
use crate::quorum::{self, Settled, Until};
use crate::{Error, InvalidInput};

/// The longest TTL redfence sends to Redis: about 146 million years, far inside what Redis
/// accepts for `PX` and what an [`Instant`] can represent.
pub const MAX_TTL: Duration = Duration::from_millis(i64::MAX as u64 / 2);

/// The most resources one lock may hold. Every resource is a key in one script call per
/// node, and a script blocks its Redis server while it runs: a lock over more keys than this
/// would stall every other client of the node. Larger requests fail with
/// [`InvalidInput::TooManyResources`] before any traffic.
pub const MAX_RESOURCES: usize = 1_000;

/// A distributed lock manager over N independent Redis masters (the Redlock algorithm).
///
/// Cheap to clone (an `Arc` inside): share one per process. Every lock uses the same
/// multiplexed connection per node. Build it with [`Redlock::builder`].
///
/// ```no_run
/// use std::time::Duration;
///
/// # async fn run() -> Result<(), redfence::Error> {
/// let redlock = redfence::Redlock::builder()
///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     .build()?;
///
/// let mut lock = redlock.acquire(&["invoice:4821"], Duration::from_secs(5)).await?;
/// // ... work, checking `lock.remaining()` ...
/// lock.extend(Duration::from_secs(5)).await?;
/// lock.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Redlock {
    pub(crate) shared: Arc<Shared>,
}

/// What every clone of a `Redlock`, and every `Lock` it hands out, shares.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) nodes: Vec<RedisNode>,
}

/// A validated lock request: resource names, their keys and the TTL.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) resources: Arc<[String]>,
    pub(crate) keys: Arc<[String]>,
    pub(crate) ttl: Duration,
}

impl Redlock {
    /// A builder with every option at its default.
    pub fn builder() -> RedlockBuilder {
        RedlockBuilder::new()
    }

    pub(crate) fn from_parts(config: Config, nodes: Vec<RedisNode>) -> Self {
        Redlock {
            shared: Arc::new(Shared { config, nodes }),
        }
    }

    /// How many nodes there are.
    pub fn node_count(&self) -> usize {
        self.shared.nodes.len()
    }

    /// How many nodes must grant a lock: `node_count() / 2 + 1`.
    pub fn quorum(&self) -> usize {
        quorum::quorum(self.shared.nodes.len())
    }

    /// Acquires a lock on every resource in `resources` (all or none) for `ttl`, retrying
    /// on contention and node failures as the builder configured (`retry_count`, the backoff
    /// schedule, `acquire_timeout`).
    ///
    /// The lock is valid for `ttl` minus the time the winning attempt took and the clock-drift
    /// allowance; see [`Lock::expires_at`]. If fencing is configured, the lock carries a fresh
    /// token ([`Lock::fence`]).
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidInput`] for no, empty or duplicate resources, more than
    ///   [`MAX_RESOURCES`], a name the fencing counter cannot store, or a TTL that is below
    ///   1 ms, not above the drift allowance, or above [`MAX_TTL`]; nothing is sent.
    /// - [`Error::Contended`] when another owner still held it after the last retry.
    /// - [`Error::QuorumUnreachable`] when too many nodes failed in the last attempt.
    /// - [`Error::NoValidity`] when the last attempt reached a majority too late.
    /// - [`Error::AcquireTimeout`] when `acquire_timeout` ran out first.
    /// - [`Error::Fencing`] when the fencing counter could not issue a token.
    ///
    /// Whatever the error, nothing is left locked: a failed attempt releases on every node
    /// before it returns (waiting for calls still running on slow nodes first, so a hung
    /// node can make a failed attempt take up to twice `node_timeout`). A call dropped before
    /// it returns (e.g. under `tokio::time::timeout`) releases in the background.
    pub async fn acquire(
        &self,
        resources: &[impl AsRef<str>],
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let started = clock::now();
        let result = match self.target(resources, ttl) {
            Ok(target) => self.acquire_target(&target).await,
            Err(error) => Err(error),
        };
        crate::metrics::acquisition(&result, started.elapsed());
        result
    }

    /// Makes exactly one attempt to acquire a lock; the same as [`acquire`](Self::acquire)
    /// without retries.
    pub async fn try_acquire(
        &self,
        resources: &[impl AsRef<str>],
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let started = clock::now();
        let result = match self.target(resources, ttl) {
            Ok(target) => self.attempt(&target).await,
            Err(error) => Err(error),
        };
        crate::metrics::acquisition(&result, started.elapsed());
        result
    }

    /// Validates a request before any traffic.
    pub(crate) fn target(
        &self,
        resources: &[impl AsRef<str>],
        ttl: Duration,
    ) -> Result<Target, Error> {
        let config = &self.shared.config;
        let ttl = validate_ttl(ttl, config.drift_factor)?;
        if resources.is_empty() {
            return Err(InvalidInput::NoResources.into());
        }
        if resources.len() > MAX_RESOURCES {
            return Err(InvalidInput::TooManyResources {
                given: resources.len(),
                max: MAX_RESOURCES,
            }
            .into());
        }
        let mut seen: HashSet<&str> = HashSet::with_capacity(resources.len());
        let mut names: Vec<String> = Vec::with_capacity(resources.len());
        for (index, resource) in resources.iter().enumerate() {
            let name = resource.as_ref();
            if name.is_empty() {
                return Err(InvalidInput::EmptyResource { index }.into());
            }
            if !seen.insert(name) {
                return Err(InvalidInput::DuplicateResource {
                    resource: name.to_owned(),
                }
                .into());
            }
            if let Some(counter) = &config.fencing
                && let Err(reason) = counter.check_resource(name)
            {
                return Err(InvalidInput::ResourceNotFenceable { index, reason }.into());
            }
            names.push(name.to_owned());
        }
        let keys: Vec<String> = names
            .iter()
            .map(|name| format!("{}{}", config.key_prefix, name))
            .collect();
        Ok(Target {
            resources: names.into(),
            keys: keys.into(),
            ttl,
        })
    }

    /// `acquire` for a validated request: attempts with the configured schedule and deadline.
    pub(crate) async fn acquire_target(&self, target: &Target) -> Result<Lock, Error> {
        let config = &self.shared.config;
        let started = clock::now();
        let deadline = config.acquire_timeout.and_then(|t| started.checked_add(t));
        let mut delays = config.backoff.delays().take(config.retry_count as usize);
        let mut attempts: u32 = 0;
        loop {
            attempts = attempts.saturating_add(1);
            let error = match self.attempt(target).await {
                Ok(lock) => return Ok(lock),
                Err(error) if !error.is_retryable() => return Err(error),
                Err(error) => error,
            };
            let Some(delay) = delays.next() else {
                return Err(with_attempts(error, attempts));
            };
            // A delay too long for an Instant certainly ends past the deadline.
            if let Some(deadline) = deadline
                && clock::now()
                    .checked_add(delay)
                    .is_none_or(|wake| wake >= deadline)
            {
                return Err(Error::AcquireTimeout {
                    waited: started.elapsed(),
                    attempts,
                    last: Some(Box::new(with_attempts(error, attempts))),
                });
            }
            tracing::trace!(?delay, attempts, %error, "lock attempt failed; retrying");
            tokio::time::sleep(delay).await;
        }
    }

    /// One attempt: a fresh token, the quorum round, then the fencing token.
    async fn attempt(&self, target: &Target) -> Result<Lock, Error> {
        let shared = &self.shared;
        let config = &shared.config;
        let req = Request {
            op: Op::Acquire,
            keys: Arc::clone(&target.keys),
            token: new_token(),
            ttl_ms: millis(target.ttl),
        };
        // Until this attempt has handed out a lock or cleaned up after itself, dropping it
        // (the caller gave up mid-way) releases on every node in the background.
        let mut guard = AttemptGuard {
            shared: Arc::clone(shared),
            req: req.clone(),
            after: Settled::none(),
            armed: true,
        };
        let start = clock::now();
        let round = quorum::acquire_round(
            &shared.nodes,
            &req,
            &target.resources,
            config.node_timeout,
            config.drift_factor,
        )
        .await;
        let (valid_for, settled) = match round {
            Ok(granted) => granted,
            Err(error) => {
                // acquire_round released on every node already.
                guard.armed = false;
                return Err(error);
            }
        };
        guard.after = settled.clone();
        let expires_at = start + valid_for;
        let fence = match self.fence(&target.resources, expires_at).await {
            Ok(fence) => fence,
            Err(error) => {
                quorum::release_everywhere(&shared.nodes, &req, config.node_timeout, &settled)
                    .await;
                guard.armed = false;
                return Err(error.into());
            }
        };
        guard.armed = false;
        Ok(Lock::new(
            Arc::clone(shared),
            target.clone(),
            req.token,
            expires_at,
            fence,
            settled,
        ))
    }

    /// Asks the fencing counter, if any, for a token, within the lock's validity.
    async fn fence(
        &self,
        resources: &[String],
        expires_at: Instant,
    ) -> Result<Option<u64>, FencingError> {
        let config = &self.shared.config;
        let Some(counter) = &config.fencing else {
            return Ok(None);
        };
        let remaining = expires_at.saturating_duration_since(clock::now());
        let limit = config.fencing_timeout.min(remaining);
        match tokio::time::timeout(limit, counter.next_fence(resources)).await {
            Ok(Ok(_)) | Err(_) if clock::now() >= expires_at => Err(FencingError::LockExpired),
            Ok(Ok(token)) => Ok(Some(token)),
            Ok(Err(error)) => Err(FencingError::Counter(Arc::from(error))),
            Err(_) => Err(FencingError::Timeout(limit)),
        }
    }
}

impl Shared {
    /// Sends one request for a lock to every node, each after the lock's previous call to
    /// that node finished (see [`Settled`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn round(
        &self,
        op: Op,
        keys: &Arc<[String]>,
        token: &Arc<str>,
        ttl: Duration,
        until: Until,
        after: &Settled,
    ) -> quorum::Round {
        let req = Request {
            op,
            keys: Arc::clone(keys),
            token: Arc::clone(token),
            ttl_ms: millis(ttl),
        };
        quorum::fan_out(&self.nodes, &req, self.config.node_timeout, until, after).await
    }
}

/// Releases an unfinished attempt's keys on every node, in the background, when dropped armed.
struct AttemptGuard {
    shared: Arc<Shared>,
    req: Request,
    /// The calls the release must follow.
    after: Settled,
    armed: bool,
}

impl Drop for AttemptGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (shared, req, after) = (
            Arc::clone(&self.shared),
            self.req.clone(),
            self.after.clone(),
        );
        runtime.spawn(async move {
            let timeout = shared.config.node_timeout;
            quorum::release_everywhere(&shared.nodes, &req, timeout, &after).await;
        });
    }
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<&str> = self
            .shared
            .nodes
            .iter()
            .map(crate::node::Node::addr)
            .collect();
        f.debug_struct("Redlock")
            .field("nodes", &nodes)
            .field("config", &self.shared.config)
            .finish()
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

/// A fresh owner token: 128 random bits from the OS-seeded CSPRNG, as 32 hex digits.
fn new_token() -> Arc<str> {
    let bits: u128 = rand::random();
    Arc::from(format!("{bits:032x}"))
}

fn with_attempts(error: Error, total: u32) -> Error {
    match error {
        Error::Contended {
            resources,
            denied,
            nodes,
            ..
        } => Error::Contended {
            resources,
            denied,
            nodes,
            attempts: total,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fresh_128_bit_hex() {
        let a = new_token();
        let b = new_token();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

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
