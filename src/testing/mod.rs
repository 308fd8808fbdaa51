//! Simulated Redis servers to test locking code without servers (feature `testing`).
//!
//! [`SimServers`] is a set of in-process Redis 7 servers that run redfence's real Lua scripts
//! in an embedded Lua 5.1, on Tokio's clock. A `Redlock` built over [`SimServers::addrs`] is
//! the real client (its queues, batching, resends, restart quarantine, lease keeper); the test
//! steers the servers: [`pause`](SimServers::pause) one, [`restart`](SimServers::restart) it,
//! [`expire`](SimServers::expire) a lock, make its next reply a [`SimFault`], shift its clock.
//! Under a paused Tokio clock (`#[tokio::test(start_paused = true)]`) and [`seed_thread`], a
//! run is decided by its seeds alone. The client's clock is Tokio's: a stall of the process
//! (a GC pause between a check and a write) is a `tokio::time::sleep` in the code under test,
//! or `tokio::time::advance` in the test, and takes no real time.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), redfence::Error> {
//! use std::time::Duration;
//! use redfence::{Error, Redlock};
//! use redfence::testing::SimServers;
//!
//! let servers = SimServers::new(3);
//! let redlock = Redlock::builder().nodes(servers.addrs()).build()?;
//! let work = redlock.using(&["report"], Duration::from_secs(1), |signal| {
//!     let servers = servers.clone();
//!     async move {
//!         // The lock is lost under the work: every server forgets it, as after a flush.
//!         servers.expire("report");
//!         // The next extension finds it gone, and the signal says so before the TTL ends.
//!         Err::<(), Error>(signal.aborted().await)
//!     }
//! });
//! assert!(matches!(work.await, Err(Error::LockLost { .. })));
//! # Ok(())
//! # }
//! ```
//!
//! Inside the crate, the unit tests' fakes run on the same simulated server.
// Built with feature `testing` alone, parts used only by the unit tests are unused.
#![cfg_attr(not(test), allow(dead_code, unused_imports))]

mod commands;
mod compare_delete;
#[cfg(test)]
pub(crate) mod fake;
mod keyspace;
mod lua;
mod network;
pub(crate) mod profile;
mod reply;
mod requests;
mod scan;
pub(crate) mod server;
mod servers;
mod set;
mod sorted_set;
mod tail;
mod wire;
mod zset;

#[cfg(test)]
mod differential;
#[cfg(test)]
mod differential_data;
#[cfg(test)]
mod differential_gen;
#[cfg(test)]
mod differential_plain;
#[cfg(test)]
mod differential_real;
#[cfg(test)]
mod profile_tests;
#[cfg(test)]
mod script_tests;
#[cfg(test)]
mod tests;

pub use network::SimFault;
pub use profile::Profile;
pub use servers::SimServers;
pub(crate) use wire::{SimEndpoint, Wire};

/// Makes this thread a simulation's: from now on every random choice redfence makes on it
/// (lock tokens, retry jitter, a semaphore's first slot, identities) comes from `seed`, and
/// its clocks count from now (a fair line's tickets, the lease schedule's grid). Call it first
/// thing inside a current-thread runtime with a paused clock: a run is then replayed exactly.
/// `None` gives the thread back to the system's generators and clocks.
pub fn seed_thread(seed: Option<u64>) {
    crate::random::seed_thread(seed);
    crate::clock::simulate_thread(seed.is_some());
}

pub use crate::plant::Plant;

/// Puts a historical bug back on this thread (`None`: none), for the simulation to prove
/// that its checkers find it. Never in a real application.
#[doc(hidden)]
pub fn plant_thread(plant: Option<Plant>) {
    crate::plant::plant_thread(plant);
}
pub(crate) use server::SimServer;
