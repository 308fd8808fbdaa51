//! Finding a slot: through the fair line or this process's line of waiters, then round the
//! slots from a random one (see [`Semaphore`]).

use std::time::{Duration, Instant};

use rand::Rng;

use super::{Permit, Semaphore};
use crate::acquisition::line_up;
use crate::clock;
use crate::error::Error;
use crate::hand_off::Watch;
use crate::inner::Target;
use crate::using;

impl Semaphore {
    /// Finds a slot (see [`Semaphore`]): in fair mode through the line, otherwise in this
    /// process's line of waiters; `started` and `deadline` are the acquisition's.
    pub(super) async fn find(
        &self,
        ttl: Duration,
        retry: bool,
        started: Instant,
        deadline: Option<Instant>,
    ) -> Result<Permit, Error> {
        let shared = self.redlock.shared();
        let config = &shared.config;
        if let Some(line) = &self.line {
            // Across processes, waiters take turns through the line lock, granted in the
            // order they asked (the nodes' fair queue, and this process's line before it);
            // its holder alone goes round the slots, and gives the line up with its permit.
            let held = self
                .redlock
                .acquire_traced(&[&*line.resource], line.ttl, retry, Target::unfenced)
                .await?;
            // Going round has a retry budget of its own: waiting for the line took the first.
            // The line is released in the background: the permit's validity is not spent
            // waiting for a slow node's answer.
            let delays = config.backoff.delays();
            return using::scope_with(
                held,
                line.policy,
                config,
                &shared.tasks,
                using::Release::InBackground,
                |_| self.go_round(ttl, retry, delays, started, deadline),
            )
            .await;
        }
        // Waiters of this process take turns (FIFO, a line named after the size key), as a
        // mutex's waiters do: only the head of the line tries the slots.
        let mut delays = config.backoff.delays();
        let turn = if retry {
            let line = [self.size_key.to_string()];
            line_up(shared, &line, &mut delays, deadline, started)
                .await?
                .0
        } else {
            None
        };
        self.go_round(ttl, turn.is_some(), delays, started, deadline)
            .await
    }

    /// Goes round the slots, one try each from a random one, until one is granted; when all
    /// are taken and `retry` (this waiter has its turn), waits the next of `delays` or until
    /// a slot is released, and goes round again, within `delays` and the deadline.
    async fn go_round(
        &self,
        ttl: Duration,
        retry: bool,
        mut delays: impl Iterator<Item = Duration>,
        started: Instant,
        deadline: Option<Instant>,
    ) -> Result<Permit, Error> {
        let shared = self.redlock.shared();
        let config = &shared.config;
        let mut attempts: u32 = 0;
        let mut watch: Option<Watch> = None;
        // The last refusal, kept across rounds: a round cut short by the deadline still says
        // what the nodes answered before.
        let mut last: Option<Error> = None;
        loop {
            if let Some(watch) = &watch {
                watch.reset();
            }
            let first = rand::rng().random_range(0..self.permits);
            for offset in 0..self.permits {
                if let Some(deadline) = deadline
                    && clock::now() >= deadline
                {
                    return Err(Error::AcquireTimeout {
                        waited: clock::since(started),
                        attempts,
                        last: last.map(Box::new),
                    });
                }
                let slot = (first + offset) % self.permits;
                let resource = &self.slots[slot as usize];
                attempts += 1;
                // Outside the slots' fair queues: whoever goes round already has its turn.
                let tried = self
                    .redlock
                    .acquire_traced(&[resource], ttl, false, Target::unqueued)
                    .await;
                match tried {
                    Ok(lock) => return Ok(Permit::new(lock, slot)),
                    Err(error) if error.is_retryable() => last = Some(error),
                    Err(error) => return Err(error),
                }
            }
            // Every slot was tried (K >= 1), and each try that did not return set `last`.
            // The first refusal of a waiter that may retry: watch from now on, and go round once
            // more at once (a release between the round and the watch would have woken nobody).
            if watch.is_none() && retry && config.backoff.max_retries() > 0 {
                watch = Some(shared.hand_off.watch_any(&shared.keys(&self.slots)));
                continue;
            }
            // Out of turn (the line took the retries): that was the last round.
            let delay = match delays.next() {
                Some(delay) if retry => delay,
                _ => return Err(last.unwrap_or(Error::Closed)),
            };
            if let Some(deadline) = deadline
                && crate::acquisition::ends_past(delay, Some(deadline))
            {
                tokio::time::sleep_until(deadline.into()).await;
                return Err(Error::AcquireTimeout {
                    waited: clock::since(started),
                    attempts,
                    last: last.map(Box::new),
                });
            }
            // Any slot's release (announced: each refused try marked its slot) ends the wait.
            Watch::sleep_or_release(watch.as_ref(), delay).await;
        }
    }
}
