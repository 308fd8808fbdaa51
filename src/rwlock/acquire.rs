//! Acquiring one side of a read-write lock: the mutex's attempt
//! ([`acquisition::attempt_rw`]) on the Redlock's retry schedule, and what a waiter left on
//! the nodes taken away once it is done waiting (a writer's waiting mark, a reader's place in
//! line).

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

/// How long a waiting writer's mark, or a waiting reader's place in line, lives after its
/// last refused attempt: three of its longest retry delays and a node timeout, so that it
/// outlives the wait until the next attempt; at least a second, at most [`LONGEST_MARK`]. A
/// writer that vanishes blocks new readers, and a reader that vanishes once admitted blocks
/// writers, for no longer than this.
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
        // A waiter that may retry leaves a sign on the nodes that refuse it: a writer its
        // waiting mark, a reader its place in line (see the module's docs).
        let rw = Arc::new(RwOp {
            mode,
            waiter: if retry || mode == RwMode::Write {
                new_token()?
            } else {
                Arc::from("")
            },
            wait_ms: if retry {
                crate::inner::millis(wait_mark(config))
            } else {
                0
            },
        });
        // Taken away when this call ends: a writer's mark however it ends; a reader's place
        // if it gives up (a read granted takes its place away where it is granted, and its
        // release everywhere else).
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
            mark.set |= retry;
            let failed = match acquisition::attempt_rw(shared, &target, Arc::clone(&rw)).await {
                Ok(acquired) => {
                    // A reader's place goes with its release.
                    mark.set &= mode == RwMode::Write;
                    return Ok(acquired);
                }
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

/// A writer's waiting mark, or a reader's place in line, possibly left on the nodes that
/// refused it: taken away on every node when dropped (the acquisition ended: a writer's
/// granted or not, a reader's not granted), queued behind the attempt's own calls; a mark
/// only where it is still this writer's. A leave that never lands ends with the mark's or
/// the place's expiry.
struct Mark {
    shared: Arc<Shared>,
    target: Target,
    rw: Arc<RwOp>,
    /// Whether an attempt was made that a node may have refused (and so may have set the
    /// mark or the place), and nothing else takes it away.
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
