//! PostgreSQL fencing end to end, behind real redis-server processes: a stale owner
//! rejected by the storage (`stale_owner.rs`), `PostgresCounter`'s tokens (`counter.rs`)
//! and outages (`outages.rs`), the fenced-write helpers (`fenced_writes.rs`), the counter's
//! group commit (`group_commit.rs`), striped counters (`stripes.rs`), and a deposed leader's late write rejected by a guard
//! row (`election.rs`).
//!
//! They need the PostgreSQL server binaries (see `testkit/src/postgres.rs`); each test starts
//! a cluster of its own. The harness helpers that need redfence are the core crate's
//! `tests/support/mod.rs`, included here.

mod counter;
mod election;
mod fenced_writes;
mod group_commit;
mod outages;
mod stale_owner;
mod stripes;
#[path = "../../../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use redfence::FencingCounter;
use redfence_postgres::PostgresCounter;
use support::{Servers, eventually};

async fn next(counter: &PostgresCounter, r: &[&str]) -> u64 {
    counter.next_fence(&names(r)).await.expect("fence")
}

const TTL: Duration = Duration::from_secs(5);

fn names(r: &[&str]) -> Vec<String> {
    r.iter().map(|s| s.to_string()).collect()
}

/// Every lock node is free of every key: nothing was left locked.
async fn no_key_left(servers: &Servers) -> bool {
    eventually(|| (0..servers.len()).all(|i| servers.keys(i).is_empty())).await
}
