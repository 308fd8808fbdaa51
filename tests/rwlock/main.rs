//! The read-write lock (any number of readers or one writer) against real redis-server
//! processes.
//!
//! By concern: who may hold at once, expiry, extension, `using()` and fences (`holds.rs`);
//! failures, bad input, restarts, other servers and the stress run (`faults.rs`). The
//! helpers shared by them are here.

mod faults;
mod holds;
#[path = "../support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use redfence::{Error, InvalidInput, Redlock, RwLock};
use support::{PATIENT, Servers, TestRedlock};

pub(crate) const TTL: Duration = Duration::from_secs(5);
pub(crate) const WRITER: &str = "cfg:rwlock:writer";
pub(crate) const READERS: &str = "cfg:rwlock:readers";
pub(crate) const WAITING: &str = "cfg:rwlock:writer_waiting";

pub(crate) fn invalid<T: std::fmt::Debug>(result: Result<T, Error>) -> InvalidInput {
    match result {
        Err(Error::InvalidInput(e)) => e,
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

pub(crate) fn contended<T: std::fmt::Debug>(result: Result<T, Error>, what: &str) {
    match result {
        Err(Error::Contended { .. }) => {}
        other => panic!("{what}: expected Contended, got {other:?}"),
    }
}

/// How many readers server `i` holds (expired members included until the next operation).
pub(crate) fn readers(servers: &Servers, i: usize) -> usize {
    servers.cmd(i, &["ZCARD", READERS])
}

/// Whether `cond` holds within 2 s: for a release that returned at a majority and must reach
/// every node long before the TTL ([`TTL`], 5 s) could make it look done.
pub(crate) async fn soon(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !cond() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// A `Redlock` that retries for as long as the test needs.
pub(crate) fn waiting(servers: &Servers) -> Redlock {
    servers
        .builder()
        .node_timeout(PATIENT)
        .retry_count(100_000)
        .build()
        .expect("config")
}

pub(crate) fn rwlock(redlock: &Redlock) -> RwLock {
    redlock.rwlock("cfg").expect("rwlock")
}
