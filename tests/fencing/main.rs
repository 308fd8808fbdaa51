//! Fencing tokens end to end: counters (memory, Redis) behind real redis-server processes.
//!
//! By concern: tokens through `acquire` with any counter (`acquire.rs`), `RedisCounter`
//! (`redis_counter.rs`) and its striped mode (`stripes.rs`). The PostgreSQL counter and the
//! fenced-write helpers are tested in their own crate (`redfence-postgres/tests/`).

mod acquire;
mod redis_counter;
mod stripes;
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
