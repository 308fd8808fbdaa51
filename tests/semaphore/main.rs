//! The counting semaphore (K slots, each a Redlock mutex) against real redis-server processes.
//!
//! By concern: never more than K holders, a majority deciding each slot (`holders.rs`); the
//! size every client must agree on and the inputs refused before any traffic (`size.rs`);
//! waiting for a permit: woken by a release, served in order, giving up at the acquire timeout
//! (`waiting.rs`); fair mode, the semaphore's line (`fair.rs`); what a held permit does:
//! `using()`'s extension and loss signal, fences per slot, `inspect` and a dropped permit
//! (`held.rs`). The helpers shared by them are here.

mod fair;
mod held;
mod holders;
mod size;
#[path = "../support/mod.rs"]
mod support;
mod waiting;

use std::time::{Duration, Instant};

use redfence::{Error, Permit};
use tokio::task::JoinHandle;

const TTL: Duration = Duration::from_secs(5);

/// The permit a spawned acquisition got, within `limit`; `what` says what the test waited for.
async fn served(task: JoinHandle<Result<Permit, Error>>, limit: Duration, what: &str) -> Permit {
    tokio::time::timeout(limit, task)
        .await
        .unwrap_or_else(|_| panic!("{what} (not within {limit:?})"))
        .expect("task")
        .expect("acquire")
}

/// An acquisition that gave up, `started` ago, did so no earlier than `early` and before
/// `late`.
fn gave_up_between(started: Instant, early: Duration, late: Duration) {
    let took = started.elapsed();
    assert!(took >= early, "gave up early: {took:?}");
    assert!(took < late, "gave up late: {took:?}");
}
