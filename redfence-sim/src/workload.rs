//! What the simulated clients do: mutex acquisitions (held, maybe extended to a longer or a
//! shorter TTL, a fenced write, released) and `using()` scopes (steps of work, each checking
//! the signal before a fenced write), on one resource or two; some writes come after a
//! stall of the process (a GC pause) that may outlast the lease.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redfence::{Error, Lock, Redlock};

use crate::history::{Claim, History, Mode, Write};
use crate::scenario::Scenario;

/// The storage the holders write to: it rejects a write whose fence is below the last one it
/// accepted for the resource (what a database does with a fencing check in its `UPDATE`).
#[derive(Default)]
pub struct FencedStore {
    last: Mutex<std::collections::BTreeMap<String, u64>>,
}

impl FencedStore {
    /// Offers a write to `resource` with `fence`: whether it was accepted.
    pub fn write(&self, resource: &str, fence: u64) -> bool {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = last.entry(resource.to_owned()).or_insert(0);
        if fence >= *entry {
            *entry = fence;
            true
        } else {
            false
        }
    }
}

/// One client's part of the run.
pub struct Client {
    /// `c0`, `c1`, ... in the trace.
    pub name: String,
    /// Its own client, over the run's servers.
    pub redlock: Redlock,
    /// Its choices (seeded).
    pub rng: StdRng,
    /// Where it records what it did.
    pub history: History,
    /// The storage every client writes to.
    pub store: Arc<FencedStore>,
    /// The run's settings.
    pub scenario: Arc<Scenario>,
}

impl Client {
    /// Runs the client's operations, one after another.
    pub async fn run(mut self) {
        for op in 0..self.scenario.ops {
            let resources = self.pick_resources();
            let ttl = self.scenario.ttl;
            match self.rng.random_range(0..11) {
                0..=4 => self.mutex(op, &resources, ttl).await,
                5..=7 => self.using(op, &resources, ttl).await,
                8 => self.permit(op, ttl).await,
                9 => self.read_write(op, ttl).await,
                _ => self.lead(op, ttl).await,
            }
            let pause = self.between();
            tokio::time::sleep(pause).await;
        }
    }

    /// One resource, the other, or both.
    fn pick_resources(&mut self) -> Vec<String> {
        let all = &self.scenario.resources;
        match self.rng.random_range(0..4) {
            0 if all.len() > 1 => all.clone(),
            n => vec![all[n % all.len()].clone()],
        }
    }

    /// A wait of up to a quarter TTL.
    fn between(&mut self) -> Duration {
        let quarter = self.scenario.ttl.as_millis() as u64 / 4;
        Duration::from_millis(self.rng.random_range(0..=quarter))
    }

    /// A write to each resource with `fence`, maybe after a stall of the process.
    async fn write(&mut self, who: &str, resources: &[String], fence: Option<u64>) {
        let Some(fence) = fence else {
            return;
        };
        if self.rng.random_bool(self.scenario.stall_chance) {
            let stall = self.scenario.ttl.mul_f64(self.rng.random_range(0.5..2.0));
            self.history
                .event(|| format!("{who} stalls {} ms before its write", stall.as_millis()));
            tokio::time::sleep(stall).await;
        }
        for resource in resources {
            let accepted = self.store.write(resource, fence);
            let at = self.history.now();
            self.history.event(|| {
                format!("{who} writes {resource} with fence {fence}: accepted {accepted}")
            });
            self.history.record().writes.push(Write {
                who: who.to_owned(),
                resource: resource.clone(),
                fence,
                at,
                accepted,
            });
        }
    }

    /// Acquires, checks the time it took, and notes the grant.
    async fn acquire(&mut self, who: &str, resources: &[String], ttl: Duration) -> Option<Lock> {
        let started = self.history.now();
        let result = self.redlock.acquire(resources, ttl).await;
        let took = self.history.now() - started;
        let bound = self.scenario.acquire_bound().as_secs_f64() * 1000.0;
        if took > bound {
            self.history
                .record()
                .late
                .push((who.to_owned(), took, bound));
        }
        match result {
            Ok(lock) => {
                self.history.record().grants += 1;
                self.history.event(|| {
                    format!(
                        "{who} acquired {resources:?} token {} fence {:?}",
                        short(lock.token()),
                        lock.fence()
                    )
                });
                Some(lock)
            }
            Err(err) => {
                self.history
                    .event(|| format!("{who} did not acquire {resources:?}: {}", kind(&err)));
                None
            }
        }
    }

    /// A mutex: acquire, hold, maybe extend, write, release.
    async fn mutex(&mut self, op: usize, resources: &[String], ttl: Duration) {
        let who = format!("{} op{op}", self.name);
        let Some(mut lock) = self.acquire(&who, resources, ttl).await else {
            return;
        };
        let mut claim = Claim {
            mode: Mode::Exclusive,
            who: who.clone(),
            token: lock.token().to_owned(),
            resources: resources.to_vec(),
            fence: lock.fence(),
            from: self.history.now(),
            until: self.history.at_std(lock.expires_at()),
        };
        let hold = ttl.mul_f64(self.rng.random_range(0.0..0.6));
        tokio::time::sleep(hold).await;
        if self.rng.random_bool(0.5) {
            let next = ttl.mul_f64(self.rng.random_range(0.25..2.0));
            let result = lock.extend(next).await;
            let believed = self.history.at_std(lock.expires_at());
            // From now on the holder counts on what the lock says: a longer or a shorter
            // validity after a success, no more than before after a failure.
            claim.until = match &result {
                Ok(()) => believed,
                Err(_) => claim.until.min(believed),
            };
            self.history.event(|| {
                format!(
                    "{who} extends to {} ms: {} (valid until {believed:.3})",
                    next.as_millis(),
                    result.as_ref().map_or_else(kind, |()| "ok")
                )
            });
            // Held on after it, counting on what the lock says.
            let hold = ttl.mul_f64(self.rng.random_range(0.0..0.6));
            tokio::time::sleep(hold).await;
        }
        if !lock.is_expired() {
            let fence = lock.fence();
            self.write(&who, resources, fence).await;
        }
        claim.until = claim.until.min(self.history.now());
        self.history.record().claims.push(claim);
        let released = lock.release().await;
        self.history.event(|| {
            format!(
                "{who} released: {}",
                released.as_ref().map_or_else(kind, |()| "ok")
            )
        });
    }

    /// A `using()` scope: steps of work, each checking the signal, then a fenced write.
    async fn using(&mut self, op: usize, resources: &[String], ttl: Duration) {
        let who = format!("{} op{op} using", self.name);
        let steps = self.rng.random_range(1..=4);
        let step_ms: Vec<u64> = (0..steps)
            .map(|_| self.rng.random_range(0..=ttl.as_millis() as u64 * 3 / 4))
            .collect();
        let stalls: Vec<bool> = (0..steps)
            .map(|_| self.rng.random_bool(self.scenario.stall_chance))
            .collect();
        let history = self.history.clone();
        let store = Arc::clone(&self.store);
        let scope_who = who.clone();
        let scope_resources = resources.to_vec();
        let result = self
            .redlock
            .using(resources, ttl, |signal| async move {
                let who = scope_who;
                let mut claim = Claim {
                    mode: Mode::Exclusive,
                    who: who.clone(),
                    token: signal.token().to_owned(),
                    resources: scope_resources.clone(),
                    fence: signal.fence(),
                    from: history.now(),
                    until: history.now() + signal.remaining().as_secs_f64() * 1000.0,
                };
                history.record().grants += 1;
                history.event(|| {
                    format!(
                        "{who} holds {scope_resources:?} token {} fence {:?}",
                        short(signal.token()),
                        signal.fence()
                    )
                });
                let mut outcome = Ok(());
                // A watcher beside the work: the validity the signal gives, read every few ms,
                // and the moment it aborts, which must come before that validity ends
                // (whatever the work is doing then, stalled or not).
                let watcher = {
                    let (signal, history, who) = (signal.clone(), history.clone(), who.clone());
                    let mut validity = claim.until;
                    tokio::spawn(async move {
                        loop {
                            tokio::select! {
                                err = signal.aborted() => {
                                    let at = history.now();
                                    history.event(|| format!("{who} signal aborted: {}", kind(&err)));
                                    if at > validity + 1.0 {
                                        history.record().late_aborts.push((who, at, validity));
                                    }
                                    return;
                                }
                                () = tokio::time::sleep(Duration::from_millis(5)) => {
                                    validity = history.now() + signal.remaining().as_secs_f64() * 1000.0;
                                }
                            }
                        }
                    })
                };
                for (step, stall) in step_ms.into_iter().zip(stalls) {
                    tokio::time::sleep(Duration::from_millis(step)).await;
                    if let Err(err) = signal.check() {
                        outcome = Err(err);
                        break;
                    }
                    let now = history.now();
                    claim.until = now + signal.remaining().as_secs_f64() * 1000.0;
                    if let Some(fence) = signal.fence() {
                        if stall {
                            tokio::time::sleep(ttl).await;
                        }
                        for resource in &scope_resources {
                            let accepted = store.write(resource, fence);
                            let at = history.now();
                            history.event(|| {
                                format!("{who} writes {resource} with fence {fence}: accepted {accepted}")
                            });
                            history.record().writes.push(Write {
                                who: who.clone(),
                                resource: resource.clone(),
                                fence,
                                at,
                                accepted,
                            });
                        }
                    }
                }
                watcher.abort();
                claim.until = claim.until.min(history.now());
                history.record().claims.push(claim);
                outcome
            })
            .await;
        self.history.event(|| {
            format!(
                "{who} ended: {}",
                result.as_ref().map_or_else(kind, |()| "ok")
            )
        });
    }
}

impl Client {
    /// A semaphore's permit: acquire, hold, release.
    async fn permit(&mut self, op: usize, ttl: Duration) {
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
    async fn read_write(&mut self, op: usize, ttl: Duration) {
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
    async fn lead(&mut self, op: usize, lease: Duration) {
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
                for step in steps {
                    tokio::time::sleep(Duration::from_millis(step)).await;
                    if leadership.check().is_err() {
                        break;
                    }
                    claim.until = remaining(history.now());
                }
                claim.until = claim.until.min(history.now());
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

/// A token, shortly.
fn short(token: &str) -> &str {
    token.get(..8).unwrap_or(token)
}

/// An error's kind, for the trace.
fn kind(err: &Error) -> &'static str {
    match err {
        Error::Contended { .. } => "contended",
        Error::QuorumUnreachable { .. } => "quorum unreachable",
        Error::AcquireTimeout { .. } => "acquire timeout",
        Error::LockLost { .. } => "lock lost",
        Error::NoValidity { .. } => "no validity",
        Error::Fencing { .. } => "fencing failed",
        _ => "other error",
    }
}

/// A seeded generator for client `index` of the run of `seed`.
pub fn client_rng(seed: u64, index: usize) -> StdRng {
    StdRng::seed_from_u64(
        seed.rotate_left(17) ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
    )
}
