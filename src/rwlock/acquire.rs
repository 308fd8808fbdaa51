//! Acquiring one side of a read-write lock: the mutex's attempt
//! ([`acquisition::attempt_rw`]) on the Redlock's retry schedule, and a writer's waiting mark
//! taken away once it is done waiting.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::RwLock;
use crate::acquisition::{self, new_token};
use crate::clock;
use crate::config::Config;
use crate::error::Error;
use crate::hand_off::Watch;
use crate::inner::{Shared, Target, validate_ttl};
use crate::lock::Lock;
use crate::metrics::{Tries, TypeLabel};
use crate::node::{Op, Request, RwMode, RwOp};
use crate::trace;

/// The most a refused writer marks the lock as waited for, whatever its retry schedule.
const LONGEST_MARK: Duration = Duration::from_secs(60);

/// How long a waiting writer's mark lives after its last refused attempt: three of its
/// longest retry delays and a node timeout, so that it outlives the wait until the next
/// attempt; at least a second, at most [`LONGEST_MARK`]. A writer that vanishes blocks new
/// readers for no longer than this.
pub(super) fn wait_mark(config: &Config) -> Duration {
    config
        .backoff
        .longest_delay()
        .saturating_mul(3)
        .saturating_add(config.node_timeout)
        .clamp(Duration::from_secs(1), LONGEST_MARK)
}

impl RwLock {
    /// One side for `ttl`: with `retry`, on the Redlock's schedule (a writer marking the lock
    /// while refused); without, one attempt. In a `redfence.acquire` span, with metrics.
    pub(super) async fn acquire(
        &self,
        mode: RwMode,
        ttl: Duration,
        retry: bool,
    ) -> Result<Lock, Error> {
        let shared = self.redlock.shared();
        let span = trace::acquire_span(
            &self.target.resources,
            crate::quorum::quorum(shared.nodes.len()),
        );
        let started = clock::now();
        let ty = TypeLabel::of_lock(&shared.config.resource_type, &self.target.resources[..1]);
        let mut tries = Tries::default();
        let result = self
            .attempts(mode, ttl, retry, &mut tries)
            .instrument(span.clone())
            .await
            .map(|acquired| Lock::new(acquired, ty.clone()));
        trace::outcome(&span, result.as_ref().map(|_| "acquired"), started);
        if let Ok(lock) = &result {
            trace::fence(&span, lock.fence());
        }
        crate::metrics::acquisition(
            &ty,
            result.as_ref().map(|_| ()),
            clock::since(started),
            &tries,
        );
        result
    }

    async fn attempts(
        &self,
        mode: RwMode,
        ttl: Duration,
        retry: bool,
        tries: &mut Tries,
    ) -> Result<acquisition::Acquired, Error> {
        let shared = self.redlock.shared();
        let config = &shared.config;
        let ttl = validate_ttl(ttl, config.drift_factor)?;
        shared.check_open()?;
        let target = Target {
            ttl,
            ..self.target.clone()
        };
        let marks = retry && mode == RwMode::Write;
        let rw = Arc::new(RwOp {
            mode,
            waiter: if mode == RwMode::Write {
                new_token()?
            } else {
                Arc::from("")
            },
            wait_ms: if marks {
                crate::inner::millis(wait_mark(config))
            } else {
                0
            },
        });
        // Once refused, the writer may have marked the lock: taken away when this call ends,
        // however it ends.
        let mut mark = Mark {
            shared: Arc::clone(shared),
            target: target.clone(),
            rw: Arc::clone(&rw),
            set: false,
        };
        let started = clock::now();
        let deadline = config.acquire_timeout.and_then(|t| started.checked_add(t));
        let mut delays = config.backoff.delays();
        let mut attempts: u32 = 0;
        let mut watch: Option<Watch> = None;
        loop {
            if let Some(watch) = &watch {
                watch.reset();
            }
            attempts = attempts.saturating_add(1);
            tries.attempts = attempts;
            trace::attempts(attempts);
            // Any attempt may be refused somewhere and mark the lock there, a granted one too
            // (granted by a majority, refused by a node a reader's entry still held): the
            // mark is taken away whenever it may have been set.
            mark.set |= marks;
            let failed = match acquisition::attempt_rw(shared, &target, Arc::clone(&rw)).await {
                Ok(acquired) => return Ok(acquired),
                Err(failed) => failed,
            };
            if !failed.is_retryable() {
                return Err(failed.into_error(&target.resources, attempts));
            }
            tries.failed(&failed);
            // The first refusal of a waiter that may retry: watch from now on, and try once more
            // at once (a release between the attempt and the watch would have woken nobody).
            if retry && watch.is_none() && config.backoff.max_retries() > 0 {
                watch = Some(shared.hand_off.watch_any(&target.keys[..1]));
                continue;
            }
            let delay = match delays.next() {
                Some(delay) if retry => delay,
                _ => return Err(failed.into_error(&target.resources, attempts)),
            };
            if acquisition::ends_past(delay, deadline) {
                return Err(Error::AcquireTimeout {
                    waited: clock::since(started),
                    attempts,
                    last: Some(Box::new(failed.into_error(&target.resources, attempts))),
                });
            }
            // Woken early by a release on the writer key's channel: a writer's, or the last
            // reader's while a writer waits (or one of this process's guards released).
            let waiting = clock::now();
            Watch::sleep_or_release(watch.as_ref(), delay).await;
            tries.backoff = tries.backoff.saturating_add(clock::since(waiting));
            shared.check_open()?;
        }
    }
}

/// A writer's waiting mark, possibly left on the nodes that refused it: taken away on every
/// node when dropped (the acquisition ended, granted or not), queued behind the attempt's own
/// calls; only where the mark is still this writer's. A leave that never lands ends with the
/// mark's expiry.
struct Mark {
    shared: Arc<Shared>,
    target: Target,
    rw: Arc<RwOp>,
    /// Whether an attempt was made that a node may have refused (and so may have set the mark).
    set: bool,
}

impl Drop for Mark {
    fn drop(&mut self) {
        if !self.set || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let leave = Request {
            op: Op::Leave,
            keys: Arc::clone(&self.target.keys),
            token: Arc::clone(&self.rw.waiter),
            ttl_ms: self.rw.wait_ms,
            queue: None,
            rw: Some(Arc::clone(&self.rw)),
        };
        for node in &self.shared.nodes {
            let call = node.call(&leave);
            self.shared.tasks.spawn(async move {
                let _ = call.await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::Backoff;

    #[test]
    fn the_waiting_mark_outlives_the_retry_delay_within_bounds() {
        let mut config = Config {
            backoff: Backoff::fixed(Duration::from_millis(200), Duration::from_millis(100)),
            node_timeout: Duration::from_millis(500),
            ..Config::default()
        };
        assert_eq!(wait_mark(&config), Duration::from_millis(1_400));
        config.backoff = Backoff::fixed(Duration::from_millis(1), Duration::ZERO);
        config.node_timeout = Duration::from_millis(10);
        assert_eq!(wait_mark(&config), Duration::from_secs(1));
        config.backoff = Backoff::fixed(Duration::from_secs(3600), Duration::ZERO);
        assert_eq!(wait_mark(&config), LONGEST_MARK);
    }
}
