//! Events from background work, for operators: renewal trouble shows up here before a loss.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;

/// Something that happened in the background, handed to the hook set with
/// [`RedlockBuilder::on_event`](crate::RedlockBuilder::on_event).
///
/// Every event is also logged with `tracing`; the hook is for metrics and alerts.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Event {
    /// `using()` extended its lock.
    Extended {
        /// The lock's resources.
        resources: Vec<String>,
        /// How many extensions this lock has had, this one included.
        extensions: u32,
        /// The validity the extension left.
        validity: Duration,
    },
    /// An extension round failed; the error carries each node's failure.
    ExtensionFailed {
        /// The lock's resources.
        resources: Vec<String>,
        /// Why the round failed.
        error: Error,
        /// The validity that was left after the failed round.
        remaining: Duration,
    },
    /// `using()` aborted its signal: ownership can no longer be guaranteed.
    Aborted {
        /// The lock's resources.
        resources: Vec<String>,
        /// Why (also what [`Signal::error`](crate::Signal::error) returns).
        error: Error,
    },
    /// [`Redlock::check`](crate::Redlock::check) found a node whose `maxmemory-policy` may
    /// evict lock keys before their TTL ends (anything but `noeviction`).
    EvictionPolicy {
        /// The node's position in the order the builder was given.
        index: usize,
        /// The node's address, without credentials.
        addr: String,
        /// Its `maxmemory-policy`.
        policy: String,
    },
    /// [`Redlock::check`](crate::Redlock::check) found two nodes that are one server (the
    /// same `run_id` at two addresses): its vote counts twice, so a lock can be granted
    /// without a true majority. Fix the configuration.
    SameServer {
        /// The earlier node's position in the order the builder was given.
        first: usize,
        /// The later node's position.
        second: usize,
        /// The later node's address, without credentials.
        addr: String,
    },
    /// A release in the background (drop, or the end of `using()`) failed. The keys expire on
    /// their own at the end of their TTL.
    ReleaseFailed {
        /// The lock's resources.
        resources: Vec<String>,
        /// What went wrong.
        error: Error,
    },
}

/// The hook that receives [`Event`]s.
#[derive(Clone)]
pub(crate) struct EventHook(Option<Arc<HookFn>>);

type HookFn = dyn Fn(&Event) + Send + Sync;

impl EventHook {
    pub(crate) fn none() -> Self {
        EventHook(None)
    }

    pub(crate) fn new(f: impl Fn(&Event) + Send + Sync + 'static) -> Self {
        EventHook(Some(Arc::new(f)))
    }

    /// Reports an extension; builds the event only when someone listens (a hook, or
    /// debug-level tracing), since it comes for every lock every round.
    pub(crate) fn extended(&self, resources: &[String], extensions: u32, validity: Duration) {
        if self.0.is_some() || tracing::enabled!(tracing::Level::DEBUG) {
            self.emit(Event::Extended {
                resources: resources.to_vec(),
                extensions,
                validity,
            });
        } else {
            crate::metrics::extension(true);
        }
    }

    /// Logs the event and hands it to the user's hook, if any.
    pub(crate) fn emit(&self, event: Event) {
        match &event {
            Event::Extended {
                resources,
                extensions,
                validity,
            } => {
                tracing::debug!(?resources, extensions, ?validity, "lock extended")
            }
            Event::ExtensionFailed {
                resources,
                error,
                remaining,
            } => {
                tracing::warn!(?resources, %error, ?remaining, "lock extension failed")
            }
            Event::Aborted { resources, error } => {
                tracing::warn!(?resources, %error, "lock ownership lost; signal aborted")
            }
            Event::ReleaseFailed { resources, error } => {
                tracing::warn!(?resources, %error, "lock release failed; keys will expire on their own")
            }
            Event::EvictionPolicy {
                index,
                addr,
                policy,
            } => {
                tracing::warn!(node = index, %addr, %policy, "this node may evict lock keys before their TTL: set maxmemory-policy noeviction")
            }
            Event::SameServer {
                first,
                second,
                addr,
            } => {
                tracing::error!(first, second, %addr, "two nodes are one server (the same run_id): its vote counts twice, and a lock can be granted without a true majority")
            }
        }
        match &event {
            Event::Extended { .. } => crate::metrics::extension(true),
            Event::ExtensionFailed { .. } => crate::metrics::extension(false),
            Event::Aborted { error, .. } => crate::metrics::lock_lost(error),
            Event::ReleaseFailed { .. } => crate::metrics::release_failed(),
            Event::EvictionPolicy { .. } | Event::SameServer { .. } => {}
        }
        if let Some(hook) = &self.0 {
            // A panicking hook must not take the extension task (and the lock) down with it.
            let call = std::panic::AssertUnwindSafe(|| hook(&event));
            if std::panic::catch_unwind(call).is_err() {
                tracing::error!("the on_event hook panicked; the event was dropped");
            }
        }
    }
}

impl fmt::Debug for EventHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Some(<hook>)"
        } else {
            "None"
        })
    }
}
