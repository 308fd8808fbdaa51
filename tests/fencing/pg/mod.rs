//! PostgreSQL (feature `postgres`): a stale owner rejected by the storage
//! (`stale_owner.rs`), `PostgresCounter`'s tokens (`counter.rs`) and outages
//! (`outages.rs`), the fenced-write helpers (`fenced_writes.rs`), and the counter's group
//! commit (`group_commit.rs`).
//!
//! scripts/test.sh skips these in its Valkey run by their `pg::` prefix.

mod counter;
mod fenced_writes;
mod group_commit;
mod outages;
mod stale_owner;

use redfence::{FencingCounter, PostgresCounter};

use crate::names;

async fn next(counter: &PostgresCounter, r: &[&str]) -> u64 {
    counter.next_fence(&names(r)).await.expect("fence")
}
