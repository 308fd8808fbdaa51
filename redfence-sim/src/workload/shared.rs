//! The locks held beside others or by term: a semaphore's permits, a read-write lock's two
//! sides, an election's leaderships.

use std::time::Duration;

use rand::Rng;
use redfence::Error;

use super::{Client, kind, short};
use crate::history::{Claim, Mode};

impl Client {
    /// A semaphore's permit: acquire, hold, release.
    pub(super) async fn permit(&mut self, op: usize, ttl: Duration) {
        let who = format!("{} op{op} permit", self.name);
        let semaphore = match self.redlock.semaphore(SEMAPHORE, self.scenario.permits) {
            Ok(semaphore) => semaphore,
            Err(err) => {
                self.history.event(|| format!("{who}: no semaphore: {err}"));
                return;
            }
        };
        let result = semaphore.acquire(ttl).await;
        let permit = match result {
            Ok(permit) => permit,
            Err(err) => {
                self.history
                    .event(|| format!("{who} did not get a permit: {}", kind(&err)));
                return;
            }
        };
        self.history.record().grants += 1;
        self.history.event(|| {
            format!(
                "{who} holds slot {} token {}",
                permit.slot(),
                short(permit.token())
            )
        });
        let mut claim = Claim {
            mode: Mode::Permit,
            who,
            token: permit.token().to_owned(),
            resources: vec![SEMAPHORE.to_owned()],
            fence: permit.fence(),
            from: self.history.now(),
            until: self.history.at_std(permit.expires_at()),
        };
        let hold = ttl.mul_f64(self.rng.random_range(0.0..0.8));
        tokio::time::sleep(hold).await;
        claim.until = claim.until.min(self.history.now());
        self.history.record().claims.push(claim);
        let _ = permit.release().await;
    }

    /// A read-write lock's read or write side: acquire, hold, release.
    pub(super) async fn read_write(&mut self, op: usize, ttl: Duration) {
        let write = self.rng.random_bool(0.4);
        let who = format!(
            "{} op{op} {}",
            self.name,
            if write { "writer" } else { "reader" }
        );
        let rwlock = match self.redlock.rwlock(RWLOCK) {
            Ok(rwlock) => rwlock,
            Err(err) => {
                self.history
                    .event(|| format!("{who}: no read-write lock: {err}"));
                return;
            }
        };
        let hold = ttl.mul_f64(self.rng.random_range(0.0..0.8));
        let (mode, held) = if write {
            match rwlock.acquire_write(ttl).await {
                Ok(guard) => {
                    let held = (guard.token().to_owned(), guard.expires_at());
                    self.hold_claim(&who, Mode::Write, held, hold).await;
                    let _ = guard.release().await;
                    (Mode::Write, true)
                }
                Err(err) => {
                    self.history
                        .event(|| format!("{who} was refused: {}", kind(&err)));
                    (Mode::Write, false)
                }
            }
        } else {
            match rwlock.acquire_read(ttl).await {
                Ok(guard) => {
                    let held = (guard.token().to_owned(), guard.expires_at());
                    self.hold_claim(&who, Mode::Read, held, hold).await;
                    let _ = guard.release().await;
                    (Mode::Read, true)
                }
                Err(err) => {
                    self.history
                        .event(|| format!("{who} was refused: {}", kind(&err)));
                    (Mode::Read, false)
                }
            }
        };
        let _ = (mode, held);
    }

    /// Notes a read-write claim from now to its validity, holds it for `hold`, and cuts the
    /// claim at its release.
    async fn hold_claim(
        &mut self,
        who: &str,
        mode: Mode,
        (token, expires_at): (String, std::time::Instant),
        hold: Duration,
    ) {
        self.history.record().grants += 1;
        self.history
            .event(|| format!("{who} holds {RWLOCK} token {}", short(&token)));
        let mut claim = Claim {
            mode,
            who: who.to_owned(),
            token,
            resources: vec![RWLOCK.to_owned()],
            fence: None,
            from: self.history.now(),
            until: self.history.at_std(expires_at),
        };
        tokio::time::sleep(hold).await;
        claim.until = claim.until.min(self.history.now());
        self.history.record().claims.push(claim);
    }
}

impl Client {
    /// A candidacy in the election: campaigns (for at most the acquire timeout), and once
    /// elected leads for a few steps, each checking the leadership; its term is its fence.
    pub(super) async fn lead(&mut self, op: usize, lease: Duration) {
        let who = format!("{} op{op} leader", self.name);
        let election = self
            .redlock
            .election(ELECTION, Some(&self.name))
            .lease(lease)
            .retry_period(lease / 5)
            .renew_deadline(lease.mul_f64(0.6))
            .build();
        let election = match election {
            Ok(election) => election,
            Err(err) => {
                self.history.event(|| format!("{who}: no election: {err}"));
                return;
            }
        };
        let steps: Vec<u64> = (0..self.rng.random_range(1..=3))
            .map(|_| self.rng.random_range(0..=lease.as_millis() as u64 / 2))
            .collect();
        let history = self.history.clone();
        let term_who = who.clone();
        let run = election.run(move |leadership| {
            let (history, who, steps) = (history.clone(), term_who.clone(), steps.clone());
            async move {
                let remaining = |now: f64| now + leadership.remaining().as_secs_f64() * 1000.0;
                let from = history.now();
                let mut claim = Claim {
                    mode: Mode::Exclusive,
                    who: who.clone(),
                    token: format!("term {}", leadership.term()),
                    resources: vec![ELECTION.to_owned()],
                    fence: Some(leadership.term()),
                    from,
                    until: remaining(from),
                };
                history.record().grants += 1;
                history.event(|| format!("{who} leads, term {}", leadership.term()));
                // The routine must stop leading when the signal fires (the term then steps
                // down and another may lead): the claim ends there at the latest.
                let fired = std::sync::Arc::new(std::sync::Mutex::new(None::<f64>));
                let watcher = {
                    let (leadership, history, fired) =
                        (leadership.clone(), history.clone(), fired.clone());
                    tokio::spawn(async move {
                        leadership.lost().await;
                        let at = history.now();
                        *fired
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(at);
                    })
                };
                for step in steps {
                    tokio::time::sleep(Duration::from_millis(step)).await;
                    if leadership.check().is_err() {
                        break;
                    }
                    claim.until = remaining(history.now());
                }
                watcher.abort();
                let fired = *fired
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                claim.until = claim
                    .until
                    .min(history.now())
                    .min(fired.unwrap_or(f64::MAX));
                history.record().claims.push(claim);
                Ok::<(), Error>(())
            }
        });
        let ended = tokio::time::timeout(self.scenario.acquire_timeout, run).await;
        if ended.is_err() {
            self.history
                .event(|| format!("{who} gave up its candidacy"));
        }
    }
}

/// The election every client runs in.
pub const ELECTION: &str = "leader";

/// The semaphore every client shares.
pub const SEMAPHORE: &str = "sem";
/// The read-write lock every client shares.
pub const RWLOCK: &str = "rw";
