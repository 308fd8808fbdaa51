//! Acquiring one side of a read-write lock: the mutex's attempt
//! ([`acquisition::attempt_rw`]) on the Redlock's retry schedule, and what a waiter left on
//! the nodes taken away once it is done waiting (a writer's waiting mark, a reader's place in
//! line).

use std::sync::Arc;
use std::time::Duration;

use super::RwLock;
use crate::acquisition::{self, Attempt, Leave, Refused, Retries, count_attempt};
use crate::clock;
use crate::config::Config;
use crate::error::Error;
use crate::hand_off::Watch;
use crate::inner::{Shared, Target, validate_ttl};
use crate::lock::Lock;
use crate::metrics::{Tries, TypeLabel};
use crate::node::{Op, Request, RwMode, RwOp};
use crate::random::new_token;

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
        let ty = TypeLabel::of_lock(&shared.config.resource_type, &self.target.resources[..1]);
        // No retry metrics: a read-write lock's calls never recorded them.
        self.redlock
            .traced(&self.target.resources, ty, false, async |tries, _| {
                self.attempts(mode, ttl, retry, tries).await
            })
            .await
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
        let leave = Request {
            op: Op::Leave,
            keys: Arc::clone(&target.keys),
            token: Arc::clone(&rw.waiter),
            ttl_ms: rw.wait_ms,
            queue: None,
            rw: Some(Arc::clone(&rw)),
        };
        let mark = Leave::new(shared, leave, false);
        let started = clock::now();
        let retries = Retries {
            started,
            deadline: acquisition::deadline(config, started),
            delays: config.backoff.delays(),
            retry,
            watch: None,
            recheck: config.backoff.max_retries() > 0,
            wait_out_deadline: false,
            open: Some(shared),
        };
        let mut side = Side {
            shared,
            target: &target,
            rw,
            mark,
            retry,
        };
        retries.run(tries, &mut side).await
    }
}

/// A read-write lock side's attempt on the schedule, with its waiting mark or place in line.
struct Side<'a> {
    shared: &'a Arc<Shared>,
    target: &'a Target,
    rw: Arc<RwOp>,
    /// Taken away when the acquisition ends (see [`Leave`]).
    mark: Leave,
    retry: bool,
}

impl Attempt for Side<'_> {
    type Granted = acquisition::Acquired;

    async fn attempt(&mut self, tries: &mut Tries) -> Result<acquisition::Acquired, Refused> {
        let attempts = count_attempt(tries);
        // Any attempt may be refused somewhere and mark the lock there, a granted one
        // too (granted by a majority, refused by a node a reader's entry still held): the
        // mark is taken away whenever it may have been set.
        self.mark.armed |= self.retry;
        let attempt = acquisition::attempt_rw(self.shared, self.target, Arc::clone(&self.rw));
        match attempt.await {
            Ok(acquired) => {
                // A reader's place goes with its release.
                self.mark.armed &= self.rw.mode == RwMode::Write;
                Ok(acquired)
            }
            Err(failed) => Err(Refused::of(failed, tries, &self.target.resources, attempts)),
        }
    }

    /// Woken early by a release on the writer key's channel: a writer's, or the last
    /// reader's while a writer waits (or one of this process's guards released).
    fn watch(&self) -> Option<Watch> {
        Some(self.shared.hand_off.watch_any(&self.target.keys[..1]))
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
