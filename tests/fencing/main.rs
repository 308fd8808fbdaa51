//! Fencing tokens end to end: counters (memory, Redis, PostgreSQL) behind real
//! redis-server processes, and PostgreSQL rejecting a stale owner's write.
//!
//! By concern: tokens through `acquire` with any counter (`acquire.rs`), `RedisCounter`
//! (`redis_counter.rs`), and the PostgreSQL tests (`pg/`).
//!
//! The PostgreSQL tests need the `postgres` feature and the server binaries (see
//! `testkit/src/postgres.rs`); each starts a cluster of its own.

mod acquire;
#[cfg(feature = "postgres")]
mod pg;
mod redis_counter;
#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use support::{Servers, eventually};

const TTL: Duration = Duration::from_secs(5);

fn names(r: &[&str]) -> Vec<String> {
    r.iter().map(|s| s.to_string()).collect()
}

/// Every lock node is free of every key: nothing was left locked.
async fn no_key_left(servers: &Servers) -> bool {
    eventually(|| (0..servers.len()).all(|i| servers.keys(i).is_empty())).await
}
