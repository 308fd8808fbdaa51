//! Test support: the real-server harness of `redfence-testkit` (`testkit/`), re-exported so
//! that tests name it `support::Servers`, `support::proxy::Proxy`, …; and the helpers that
//! need redfence, which the testkit does not depend on.
#![allow(dead_code)]

pub use redfence_testkit::*;

pub mod candidates;
pub mod recorded;
pub mod restarted;
pub mod token_order;

use std::time::{Duration, Instant};

use redfence::{Redlock, RedlockBuilder};

/// A node timeout generous enough that a loaded machine never fails a healthy local node.
pub const PATIENT: Duration = Duration::from_millis(500);

/// The shortest `using()` TTL whose extension window is the whole `threshold` (at the default
/// drift factor, 0.01): each renewal round then has `threshold` to be confirmed before the
/// signal aborts, and rounds come about every `threshold`. The keeper plans a round `lead =
/// min(threshold, (ttl - drift - threshold) / 2)` before the threshold, so the window is the
/// whole threshold from `ttl - drift >= 3 * threshold` on. A test that means to keep its lock
/// on a loaded machine takes a threshold a stalled round cannot outlast, and this TTL.
pub fn ttl_for_window(threshold: Duration) -> Duration {
    // ttl * 0.99 - 2 ms >= 3 * threshold, rounded up to the next millisecond.
    let micros = (3 * threshold + Duration::from_millis(2)).as_micros() * 100 / 99;
    Duration::from_millis(u64::try_from(micros / 1_000 + 1).expect("a test TTL"))
}

/// `Redlock`s over every test server, tuned for tests.
pub trait TestRedlock {
    /// A builder over every server, tuned for tests: fast retries.
    fn builder(&self) -> RedlockBuilder;

    /// A `Redlock` over every server with the test defaults of [`builder`](Self::builder).
    fn redlock(&self) -> Redlock {
        self.builder().build().expect("valid test config")
    }

    /// A `Redlock` over every server with [`PATIENT`] node calls.
    fn patient(&self) -> Redlock {
        self.builder()
            .node_timeout(PATIENT)
            .build()
            .expect("valid test config")
    }

    /// A `Redlock` over every server with [`PATIENT`] node calls that waits 30 s between
    /// attempts (five retries): a waiter that gets in within seconds was woken by a release,
    /// not by its retry delay.
    fn slow_retries(&self) -> Redlock {
        self.builder()
            .node_timeout(PATIENT)
            .backoff(redfence::Backoff::fixed(Duration::from_secs(30), Duration::ZERO).retries(5))
            .build()
            .expect("valid test config")
    }

    /// A fair-mode `Redlock` over every server polling every `delay` (200 retries). With
    /// [`PATIENT`] node calls: a call timed out on a loaded machine would cost a waiter its
    /// turn, which is not what fair-mode tests are about.
    fn fair(&self, delay: Duration) -> Redlock {
        self.builder()
            .fair(true)
            .node_timeout(PATIENT)
            .backoff(redfence::Backoff::fixed(delay, Duration::ZERO).retries(200))
            .build()
            .expect("valid test config")
    }

    /// A `Redlock` over every server without the restart quarantine (Redlock as published),
    /// one attempt per acquisition, [`PATIENT`] node calls: the restart tests' other owner.
    fn unquarantined(&self) -> Redlock {
        self.builder()
            .restart_quarantine(Duration::ZERO)
            .retry_count(0)
            .node_timeout(PATIENT)
            .build()
            .expect("valid test config")
    }

    /// A `Redlock` over every server that makes one attempt per acquisition (no retry), each
    /// node call bounded by `node_timeout`: one answer per node, as the test set it up.
    fn one_attempt(&self, node_timeout: Duration) -> Redlock {
        self.builder()
            .retry_count(0)
            .node_timeout(node_timeout)
            .build()
            .expect("valid test config")
    }
}

impl TestRedlock for Servers {
    fn builder(&self) -> RedlockBuilder {
        Redlock::builder()
            .nodes(self.urls())
            .retry_delay(Duration::from_millis(10))
            .retry_jitter(Duration::from_millis(10))
    }
}

/// Takes and releases a lock twice, so that every node's connection is open and its scripts
/// are loaded before a test measures or injects anything. Through `using()`, whose release
/// waits for every node to answer or time out, behind the acquire (a node runs a lock's calls
/// in order). A node whose first connect outlasted the node timeout answered both with the
/// timeout and goes on connecting in the background: the second round finds it connected.
/// Retries for up to [`DEADLINE`]: on a loaded machine a first connection can miss a short
/// node timeout.
pub async fn warm_up(redlock: &Redlock) {
    let deadline = Instant::now() + DEADLINE;
    let mut rounds = 0;
    while rounds < 2 {
        let scope = redlock.using(&["warm"], Duration::from_secs(10), |_| async {
            Ok::<(), redfence::Error>(())
        });
        match scope.await {
            Ok(()) => rounds += 1,
            Err(err) if err.is_retryable() && Instant::now() < deadline => {}
            Err(err) => panic!("warm-up: {err}"),
        }
    }
}

/// Acquires `resources`, retrying retryable errors (every 100 ms) until `within` has passed;
/// panics with `what` and the last error then, or on any other error.
pub async fn acquire_within(
    redlock: &Redlock,
    resources: &[&str],
    ttl: Duration,
    within: Duration,
    what: &str,
) -> redfence::Lock {
    let deadline = Instant::now() + within;
    loop {
        match redlock.acquire(resources, ttl).await {
            Ok(lock) => return lock,
            Err(err) if Instant::now() < deadline && err.is_retryable() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("{what}: {err}"),
        }
    }
}

/// Polls `cond` until it holds or [`DEADLINE`] passes; returns whether it held.
pub async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The most of `windows` (start, end; half-open, so one that ends as another starts is not
/// beside it) that share one instant.
pub fn most_at_once(windows: impl IntoIterator<Item = (Instant, Instant)>) -> usize {
    let mut events: Vec<(Instant, i32)> = windows
        .into_iter()
        .flat_map(|(start, end)| [(start, 1), (end, -1)])
        .collect();
    // At one instant, ends before starts.
    events.sort_by_key(|&(at, delta)| (at, delta));
    let (mut open, mut most) = (0_i32, 0_i32);
    for (_, delta) in events {
        open += delta;
        most = most.max(open);
    }
    usize::try_from(most).unwrap_or(0)
}
