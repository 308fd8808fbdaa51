//! Finding a slot: through the fair line or this process's line of waiters, then round the
//! slots from a random one (see [`Semaphore`]).

use std::time::{Duration, Instant};

use rand::Rng;

use super::{Permit, Semaphore};
use crate::acquisition::{Attempt, Refused, Retries, line_up};
use crate::clock;
use crate::error::Error;
use crate::hand_off::Watch;
use crate::inner::Target;
use crate::metrics::Tries;
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
        delays: impl Iterator<Item = Duration>,
        started: Instant,
        deadline: Option<Instant>,
    ) -> Result<Permit, Error> {
        let shared = self.redlock.shared();
        let retries = Retries {
            started,
            deadline,
            delays,
            retry,
            watch: None,
            recheck: shared.config.backoff.max_retries() > 0,
            // The wait ends at the deadline, as the next round would have.
            wait_out_deadline: true,
            // Each try of a slot checks it.
            open: None,
        };
        let mut round = Round {
            semaphore: self,
            ttl,
            started,
            deadline,
            last: None,
        };
        // The slots' own acquisitions count their metrics; these count the tries of slots.
        let mut tries = Tries::default();
        retries.run(&mut tries, &mut round).await
    }
}

/// One round of the slots on the schedule (see [`Semaphore::go_round`]).
struct Round<'a> {
    semaphore: &'a Semaphore,
    ttl: Duration,
    started: Instant,
    deadline: Option<Instant>,
    /// The last refusal, kept across rounds: a round cut short by the deadline still says
    /// what the nodes answered before.
    last: Option<Error>,
}

impl Attempt for Round<'_> {
    type Granted = Permit;

    async fn attempt(&mut self, tries: &mut Tries) -> Result<Permit, Refused> {
        let semaphore = self.semaphore;
        let first = crate::random::with(|rng| rng.random_range(0..semaphore.permits));
        for offset in 0..semaphore.permits {
            if let Some(deadline) = self.deadline
                && clock::now() >= deadline
            {
                return Err(Refused::Final(Error::AcquireTimeout {
                    waited: clock::since(self.started),
                    attempts: tries.attempts,
                    last: self.last.take().map(Box::new),
                }));
            }
            let slot = (first + offset) % semaphore.permits;
            let resource = &semaphore.slots[slot as usize];
            tries.attempts = tries.attempts.saturating_add(1);
            // Outside the slots' fair queues: whoever goes round already has its turn.
            let tried = semaphore
                .redlock
                .acquire_traced(&[resource], self.ttl, false, Target::unqueued)
                .await;
            match tried {
                Ok(lock) => return Ok(Permit::new(lock, slot)),
                Err(error) if error.is_retryable() => self.last = Some(error),
                Err(error) => return Err(Refused::Final(error)),
            }
        }
        // Every slot was tried (K >= 1), and each try that did not return set `last`.
        Err(Refused::Again(self.last.clone().unwrap_or(Error::Closed)))
    }

    /// Any slot's release (announced: each refused try marked its slot) ends the wait.
    fn watch(&self) -> Option<Watch> {
        let shared = self.semaphore.redlock.shared();
        Some(
            shared
                .hand_off
                .watch_any(&shared.keys(&self.semaphore.slots)),
        )
    }
}
