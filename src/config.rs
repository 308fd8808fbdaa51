//! The validated options of a `Redlock`, with their defaults.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::ConfigError;
use crate::events::EventHook;
use crate::fence::FencingCounter;
use crate::memory::identity::QuarantineRule;
use crate::resource_type::ResourceType;
use crate::retry::Backoff;

/// Default [`drift_factor`](crate::RedlockBuilder::drift_factor): 1 % of the TTL.
const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
/// Default [`node_timeout`](crate::RedlockBuilder::node_timeout): 50 ms.
const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// Default [`automatic_extension_threshold`](crate::RedlockBuilder::automatic_extension_threshold): 500 ms.
const DEFAULT_EXTENSION_THRESHOLD: Duration = Duration::from_millis(500);
/// Default [`restart_quarantine`](crate::RedlockBuilder::restart_quarantine): 60 s (plus the
/// lock-delay), for every client: a voter that lost any of its memory does not count for it.
pub(crate) const DEFAULT_RESTART_QUARANTINE: Duration = Duration::from_secs(60);
/// The longest [`lock_delay`](crate::RedlockBuilder::lock_delay): one hour.
pub(crate) const MAX_LOCK_DELAY: Duration = Duration::from_secs(3600);
/// The longest [`restart_quarantine`](crate::RedlockBuilder::restart_quarantine): one day.
pub(crate) const MAX_RESTART_QUARANTINE: Duration = Duration::from_secs(86_400);
/// Default [`fencing_timeout`](crate::RedlockBuilder::fencing_timeout): 1 s.
const DEFAULT_FENCING_TIMEOUT: Duration = Duration::from_secs(1);

/// The options of a [`Redlock`], validated once by [`RedlockBuilder::build`].
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) drift_factor: f64,
    pub(crate) node_timeout: Duration,
    pub(crate) backoff: Backoff,
    pub(crate) acquire_timeout: Option<Duration>,
    pub(crate) extension_threshold: Duration,
    pub(crate) max_extensions: Option<u32>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) fencing: Option<Arc<dyn FencingCounter>>,
    pub(crate) fencing_timeout: Duration,
    pub(crate) key_prefix: String,
    pub(crate) resource_type: ResourceType,
    pub(crate) events: EventHook,
    /// Fair mode: waiters line up on every node (see `RedlockBuilder::fair`).
    pub(crate) fair: bool,
    /// How long a voter that lost memory does not count toward a majority, when set (see
    /// `RedlockBuilder::restart_quarantine`); `None`: the default, 60 s plus the lock-delay.
    pub(crate) restart_quarantine: Option<Duration>,
    /// Added to the server-side TTL of acquire and extend, never to the validity (see
    /// `RedlockBuilder::lock_delay`).
    pub(crate) lock_delay: Duration,
    /// Plain commands where a server has compare-and-delete (see
    /// `RedlockBuilder::native_commands`).
    pub(crate) native_commands: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            drift_factor: DEFAULT_DRIFT_FACTOR,
            node_timeout: DEFAULT_NODE_TIMEOUT,
            backoff: Backoff::DEFAULT,
            acquire_timeout: None,
            extension_threshold: DEFAULT_EXTENSION_THRESHOLD,
            max_extensions: None,
            max_hold: None,
            fencing: None,
            fencing_timeout: DEFAULT_FENCING_TIMEOUT,
            key_prefix: String::new(),
            resource_type: ResourceType::default(),
            events: EventHook::none(),
            fair: false,
            restart_quarantine: None,
            lock_delay: Duration::ZERO,
            native_commands: true,
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("drift_factor", &self.drift_factor)
            .field("node_timeout", &self.node_timeout)
            .field("backoff", &self.backoff)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("extension_threshold", &self.extension_threshold)
            .field("max_extensions", &self.max_extensions)
            .field("max_hold", &self.max_hold)
            .field("fencing", &self.fencing.as_ref().map(|_| "<counter>"))
            .field("fencing_timeout", &self.fencing_timeout)
            .field("key_prefix", &self.key_prefix)
            .field("fair", &self.fair)
            .field("quarantine", &self.quarantine())
            .field("lock_delay", &self.lock_delay)
            .field("native_commands", &self.native_commands)
            .field("resource_type", &self.resource_type)
            .field("events", &self.events)
            .finish()
    }
}

/// The longest key prefix, in bytes: it is written before every resource name in every call.
const MAX_KEY_PREFIX_LEN: usize = 1024;

impl Config {
    /// The restart quarantine in force: the period set, or 60 s plus the lock-delay (a restart
    /// forgets the delay's keys too), with the drift factor that bounds a clock's steps.
    pub(crate) fn quarantine(&self) -> QuarantineRule {
        QuarantineRule {
            period: self
                .restart_quarantine
                .unwrap_or(DEFAULT_RESTART_QUARANTINE + self.lock_delay),
            drift_factor: self.drift_factor,
        }
    }

    /// Checks every option; the first bad one is the error.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let config = self;
        let f = config.drift_factor;
        if !f.is_finite() || !(0.0..1.0).contains(&f) {
            return Err(ConfigError::BadDriftFactor(f));
        }
        let positive = |option: &'static str, d: Duration| {
            if d.is_zero() {
                Err(ConfigError::BadOption {
                    option,
                    reason: "must be greater than zero".into(),
                })
            } else {
                Ok(())
            }
        };
        positive("node_timeout", config.node_timeout)?;
        positive("automatic_extension_threshold", config.extension_threshold)?;
        positive("fencing_timeout", config.fencing_timeout)?;
        if let Some(t) = config.acquire_timeout {
            positive("acquire_timeout", t)?;
        }
        if let Some(t) = config.max_hold {
            positive("max_hold", t)?;
        }
        let at_most = |option: &'static str, d: Duration, max: Duration| {
            if d > max {
                Err(ConfigError::BadOption {
                    option,
                    reason: format!("is {d:?}; at most {max:?} is allowed"),
                })
            } else {
                Ok(())
            }
        };
        at_most("lock_delay", config.lock_delay, MAX_LOCK_DELAY)?;
        at_most(
            "restart_quarantine",
            config.quarantine().period,
            MAX_RESTART_QUARANTINE,
        )?;
        if config.key_prefix.len() > MAX_KEY_PREFIX_LEN {
            return Err(ConfigError::BadOption {
                option: "key_prefix",
                reason: format!(
                    "is {} bytes long; at most {MAX_KEY_PREFIX_LEN} are allowed",
                    config.key_prefix.len()
                ),
            });
        }
        if let Err(reason) = config.backoff.check() {
            return Err(ConfigError::BadOption {
                option: "backoff",
                reason,
            });
        }
        Ok(())
    }
}
