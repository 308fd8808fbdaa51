//! The real-server harness of redfence's tests and bench: `redis-server` processes on free
//! loopback ports (killed, paused, restarted), a TCP fault proxy, PostgreSQL clusters, clock
//! faults through libfaketime, a Redis Cluster, a Sentinel group, TLS servers, and the
//! docker-compose harness of `docker/`.
//!
//! Dev-only and unpublished. It knows nothing of redfence: what builds a `Redlock` over these
//! servers lives with the tests (`tests/support/mod.rs`) and the bench, so that depending on
//! this crate switches no redfence feature on.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub)]

pub mod cluster;
pub mod faketime;
pub mod postgres;
pub mod proxy;
pub mod redis_cluster;
pub mod sentinel;
mod servers;
pub mod tls;

use std::net::TcpListener;
use std::time::Duration;

pub use servers::{Launch, Servers, redis8, valkey9};

/// A generous deadline for conditions that should come true quickly.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}
