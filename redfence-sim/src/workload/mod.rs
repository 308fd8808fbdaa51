//! What the simulated clients do: mutex acquisitions (held, maybe extended to a longer or a
//! shorter TTL, a fenced write, released) and `using()` scopes (steps of work, each checking
//! the signal before a fenced write), on one resource or two; some writes come after a
//! stall of the process (a GC pause) that may outlast the lease.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redfence::{Error, Redlock};

use crate::history::{History, Write};

mod mutex;
mod shared;

use crate::scenario::Scenario;
pub use shared::{ELECTION, RWLOCK, SEMAPHORE};

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

    /// Offers `who`'s write with `fence` to each of `resources`, and records what the store
    /// did with it.
    pub fn offer(&self, history: &History, who: &str, resources: &[String], fence: u64) {
        for resource in resources {
            let accepted = self.write(resource, fence);
            let at = history.now();
            history.event(|| {
                format!("{who} writes {resource} with fence {fence}: accepted {accepted}")
            });
            history.record().writes.push(Write {
                who: who.to_owned(),
                resource: resource.clone(),
                fence,
                at,
                accepted,
            });
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
        self.store.offer(&self.history, who, resources, fence);
    }
}

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
