//! The mutex's workloads: an acquisition held, maybe extended, written with and released; a
//! `using()` scope of steps, each checking the signal before its write.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use redfence::Lock;

use super::{Client, kind, short};
use crate::history::{Claim, Mode};

impl Client {
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
    pub(super) async fn mutex(&mut self, op: usize, resources: &[String], ttl: Duration) {
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
    pub(super) async fn using(&mut self, op: usize, resources: &[String], ttl: Duration) {
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
                        store.offer(&history, &who, &scope_resources, fence);
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
