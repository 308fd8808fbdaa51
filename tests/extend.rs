//! `Lock::extend` never leaves the lock claiming more validity than its keys may have: after a
//! failed or dropped extension that shortened the keys on some nodes, `remaining()` and
//! `is_expired()` follow the shorter TTL, so a second owner can never get in while the first
//! one's `Lock` still says it is valid.

mod support;

use std::time::Duration;

use redfence::{Error, Redlock};
use support::proxy::{Mode, Proxy};
use support::{Servers, TestRedlock};

const LONG: Duration = Duration::from_secs(10);

/// Three servers, each behind a proxy, and a `Redlock` through the proxies with a node timeout
/// long enough to wait out the latency injected below.
async fn behind_proxies() -> (Servers, Vec<Proxy>, Redlock) {
    let servers = Servers::start(3);
    let mut proxies = Vec::new();
    for i in 0..3 {
        proxies.push(Proxy::start(servers.port(i)).await);
    }
    let redlock = Redlock::builder()
        .nodes(proxies.iter().map(Proxy::url))
        .node_timeout(Duration::from_secs(2))
        .retry_count(0)
        .build()
        .expect("config");
    support::warm_up(&redlock).await;
    (servers, proxies, redlock)
}

/// A second client that talks to the servers directly.
fn rival(servers: &Servers) -> Redlock {
    // Its one attempt opens new connections: a node timeout a loaded machine can meet.
    servers.one_attempt(Duration::from_millis(500))
}

#[tokio::test]
async fn a_too_slow_shortening_extend_reports_the_shorter_validity() {
    let (servers, proxies, redlock) = behind_proxies().await;
    let mut lock = redlock.acquire(&["a"], LONG).await.expect("acquire");
    assert!(lock.remaining() > Duration::from_secs(9));

    // Every answer now takes ~500 ms: a majority applies PEXPIRE 60 ms, but too late for
    // the new TTL to leave any validity.
    for p in &proxies {
        p.set(Mode::Delay(Duration::from_millis(250)));
    }
    let err = lock
        .extend(Duration::from_millis(60))
        .await
        .expect_err("too slow");
    assert!(matches!(err, Error::NoValidity { .. }), "{err:?}");
    // The keys may be gone already; the lock must not say otherwise.
    assert!(lock.is_expired(), "remaining {:?}", lock.remaining());
    assert_eq!(lock.remaining(), Duration::ZERO);

    // And indeed a second owner gets in, while the first lock agrees it has expired.
    let other = rival(&servers);
    assert!(
        support::eventually(|| servers.get(0, "a").is_none() && servers.get(1, "a").is_none())
            .await
    );
    let second = other.try_acquire(&["a"], LONG).await.expect("second owner");
    assert!(lock.is_expired());
    second.release().await.expect("release");
}

#[tokio::test]
async fn an_unconfirmed_shortening_extend_reports_the_shorter_validity() {
    let servers = Servers::start(5);
    let redlock = servers.builder().retry_count(0).build().expect("config");
    support::warm_up(&redlock).await;
    let mut lock = redlock.acquire(&["a"], LONG).await.expect("acquire");
    for i in 2..5 {
        servers.pause(i);
    }
    let err = lock
        .extend(Duration::from_millis(300))
        .await
        .expect_err("3 of 5 paused");
    assert!(matches!(err, Error::QuorumUnreachable { .. }), "{err:?}");
    // Two nodes applied PEXPIRE 300 ms: the lock may now hold at most that.
    assert!(
        lock.remaining() <= Duration::from_millis(300),
        "remaining {:?}",
        lock.remaining()
    );
    assert!(
        support::eventually(|| lock.is_expired()).await,
        "still claims validity"
    );
    for i in 2..5 {
        servers.resume(i);
    }
    // A failed extend with a longer TTL changes nothing.
    let mut lock = redlock.acquire(&["b"], LONG).await.expect("acquire b");
    let before = lock.expires_at();
    for i in 2..5 {
        servers.pause(i);
    }
    let err = lock.extend(LONG * 2).await.expect_err("3 of 5 paused");
    assert!(matches!(err, Error::QuorumUnreachable { .. }), "{err:?}");
    assert_eq!(lock.expires_at(), before);
    for i in 2..5 {
        servers.resume(i);
    }
    lock.release().await.expect("release");
}

#[tokio::test]
async fn a_dropped_shortening_extend_reports_the_shorter_validity() {
    let (_servers, proxies, redlock) = behind_proxies().await;
    let mut lock = redlock.acquire(&["a"], LONG).await.expect("acquire");
    for p in &proxies {
        p.set(Mode::Delay(Duration::from_millis(100)));
    }
    // Given up half-way: the PEXPIRE may land on every node after this returns.
    let cut = tokio::time::timeout(
        Duration::from_millis(20),
        lock.extend(Duration::from_millis(400)),
    )
    .await;
    assert!(cut.is_err(), "the extend should still be in flight");
    assert!(
        lock.remaining() <= Duration::from_millis(400),
        "remaining {:?}",
        lock.remaining()
    );
    for p in &proxies {
        p.set(Mode::Pass);
    }
    assert!(support::eventually(|| lock.is_expired()).await);
}
