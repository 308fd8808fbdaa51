//! Bad input is a typed error returned before any network traffic; nothing is locked.

mod support;

use std::time::Duration;

use redfence::{ConfigError, Error, InvalidInput, MAX_TTL, Redlock};
use support::{Servers, TestRedlock};

const TTL: Duration = Duration::from_secs(5);

fn invalid(result: Result<impl std::fmt::Debug, Error>) -> InvalidInput {
    match result {
        Err(Error::InvalidInput(e)) => e,
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

/// How many clients are connected to server 0 (the inspecting one included).
fn clients(servers: &Servers) -> usize {
    let info: String = servers.cmd(0, &["INFO", "clients"]);
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("connected_clients")
}

#[tokio::test]
async fn bad_requests_never_reach_a_node() {
    let servers = Servers::start(3);
    let redlock = servers.redlock();
    let empty: [&str; 0] = [];

    assert_eq!(
        invalid(redlock.acquire(&empty, TTL).await),
        InvalidInput::NoResources
    );
    assert_eq!(
        invalid(redlock.acquire(&["a", ""], TTL).await),
        InvalidInput::EmptyResource { index: 1 }
    );
    assert_eq!(
        invalid(redlock.try_acquire(&["a", "b", "a"], TTL).await),
        InvalidInput::DuplicateResource {
            resource: "a".into()
        }
    );
    assert!(matches!(
        invalid(redlock.acquire(&["a"], Duration::ZERO).await),
        InvalidInput::ZeroTtl { .. }
    ));
    assert!(matches!(
        invalid(redlock.acquire(&["a"], Duration::from_millis(2)).await),
        InvalidInput::TtlTooShort { .. }
    ));
    assert!(matches!(
        invalid(
            redlock
                .acquire(&["a"], MAX_TTL + Duration::from_millis(1))
                .await
        ),
        InvalidInput::TtlTooLong { .. }
    ));
    assert!(matches!(
        invalid(redlock.acquire(&["a"], Duration::MAX).await),
        InvalidInput::TtlTooLong { .. }
    ));
    // A key that could be another lock's helper key (its fair queue, its waiting mark).
    // And the voters' memory marker and roster keys (the restart quarantine's).
    for reserved in [
        "job:redfence:waiting",
        "job:redfence:queue",
        "job:redfence:alive",
        "redfence:memory",
        "redfence:roster:127.0.0.1:6379/0",
    ] {
        match invalid(redlock.try_acquire(&["a", reserved], TTL).await) {
            InvalidInput::ReservedName {
                index, resource, ..
            } => assert_eq!((index, resource.as_str()), (1, reserved)),
            other => panic!("{reserved}: {other:?}"),
        }
    }
    // The check is on the key, prefix included.
    let prefixed = servers
        .builder()
        .key_prefix("job:redfence:")
        .build()
        .expect("config");
    match invalid(prefixed.try_acquire(&["queue"], TTL).await) {
        InvalidInput::ReservedName { resource, .. } => assert_eq!(resource, "queue"),
        other => panic!("job:redfence:queue: {other:?}"),
    }
    // The lazy connections were never even opened, and nothing was written.
    assert_eq!(clients(&servers), 1);
    for i in 0..3 {
        assert!(servers.keys(i).is_empty());
    }
}

#[tokio::test]
async fn a_bad_extend_ttl_is_rejected_and_keeps_the_lock() {
    let servers = Servers::start(3);
    let redlock = servers.redlock();
    let mut lock = redlock.acquire(&["a"], TTL).await.expect("acquire");
    let expires_at = lock.expires_at();
    assert!(matches!(
        invalid(lock.extend(Duration::ZERO).await),
        InvalidInput::ZeroTtl { .. }
    ));
    assert_eq!(lock.expires_at(), expires_at);
    // Still held: on a majority at once (the last node may still be on its way).
    assert!(servers.holders("a", lock.token(), 0..3).len() >= 2);
    lock.release().await.expect("release");
}

#[test]
fn a_drift_factor_that_leaves_no_ttl_is_rejected_at_build() {
    let e = Redlock::builder()
        .node("redis://127.0.0.1:1")
        .drift_factor(f64::NAN)
        .build()
        .expect_err("NaN drift");
    assert!(matches!(e, ConfigError::BadDriftFactor(_)), "{e:?}");
    assert!(e.to_string().contains("drift factor"));
}

#[tokio::test]
async fn the_ttl_must_exceed_the_drift_of_the_configured_factor() {
    let redlock = Redlock::builder()
        .node("redis://127.0.0.1:1")
        .drift_factor(0.5)
        .build()
        .expect("config");
    // 4 ms * 0.5 + 2 ms = 4 ms: no validity could ever be left.
    let e = invalid(redlock.acquire(&["a"], Duration::from_millis(4)).await);
    assert!(matches!(e, InvalidInput::TtlTooShort { .. }), "{e:?}");
    assert!(e.to_string().contains("drift"), "{e}");
}

#[test]
fn errors_say_what_was_wrong() {
    let e = Redlock::builder()
        .nodes(["redis://127.0.0.1:7001", "http://nope"])
        .build()
        .expect_err("not a Redis URL");
    let msg = e.to_string();
    assert!(msg.contains("#1") && msg.contains("http://nope"), "{msg}");
}

#[tokio::test]
async fn too_many_resources_are_refused_before_any_work() {
    let redlock = Redlock::builder()
        .node("redis://127.0.0.1:1")
        .build()
        .expect("config");
    // Far past the limit: refused outright, without walking the list for duplicates.
    let many: Vec<String> = (0..80_000).map(|i| format!("r{i}")).collect();
    assert_eq!(
        invalid(redlock.acquire(&many, TTL).await),
        InvalidInput::TooManyResources {
            given: 80_000,
            max: redfence::MAX_RESOURCES
        }
    );
    // At the limit, a duplicate in last place is still found.
    let mut at_limit: Vec<String> = (0..redfence::MAX_RESOURCES - 1)
        .map(|i| format!("r{i}"))
        .collect();
    at_limit.push("r0".into());
    assert_eq!(
        invalid(redlock.try_acquire(&at_limit, TTL).await),
        InvalidInput::DuplicateResource {
            resource: "r0".into()
        }
    );
}

/// A counter that cannot store names with a `#`.
struct NoHashCounter;

impl redfence::FencingCounter for NoHashCounter {
    fn next_fence<'a>(
        &'a self,
        _: &'a [String],
    ) -> futures::future::BoxFuture<'a, Result<u64, redfence::BoxError>> {
        Box::pin(async { Ok(1) })
    }

    fn check_resource(&self, resource: &str) -> Result<(), String> {
        if resource.contains('#') {
            Err("no # allowed".into())
        } else {
            Ok(())
        }
    }
}

#[tokio::test]
async fn a_name_the_counter_cannot_store_is_refused_before_any_traffic() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .fencing(NoHashCounter)
        .build()
        .expect("config");
    let e = invalid(redlock.acquire(&["fine", "not#fine"], TTL).await);
    assert_eq!(
        e,
        InvalidInput::ResourceNotFenceable {
            index: 1,
            reason: "no # allowed".into()
        }
    );
    assert!(e.to_string().contains("#1"), "{e}");
    assert_eq!(clients(&servers), 1);
}

#[tokio::test]
async fn an_overlong_name_is_refused_before_any_traffic_and_one_at_the_cap_works() {
    let servers = Servers::start(3);
    let redlock = servers.builder().build().expect("config");
    let huge = "x".repeat(8 * 1024 * 1024);
    assert_eq!(
        invalid(redlock.acquire(&["fine", huge.as_str()], TTL).await),
        InvalidInput::ResourceTooLong {
            index: 1,
            len: huge.len(),
            max: redfence::MAX_RESOURCE_LEN
        }
    );
    // Many names under the cap that are too large together.
    let big: Vec<String> = (0..20)
        .map(|i| format!("{i:02}{}", "y".repeat(redfence::MAX_RESOURCE_LEN - 2)))
        .collect();
    assert_eq!(
        invalid(redlock.acquire(&big, TTL).await),
        InvalidInput::ResourcesTooLarge {
            index: 16,
            max: redfence::MAX_RESOURCE_BYTES
        }
    );
    assert_eq!(
        invalid(redlock.inspect(&[huge.as_str()]).await),
        InvalidInput::ResourceTooLong {
            index: 0,
            len: huge.len(),
            max: redfence::MAX_RESOURCE_LEN
        }
    );
    assert_eq!(clients(&servers), 1, "no request reached a node");
    // A name at the cap is taken and released, and the lock after it is unaffected.
    let at_cap = "z".repeat(redfence::MAX_RESOURCE_LEN);
    let lock = redlock
        .acquire(&[at_cap.as_str()], TTL)
        .await
        .expect("at the cap");
    lock.release().await.expect("release");
    let next = redlock
        .acquire(&["after-the-cap"], TTL)
        .await
        .expect("next");
    next.release().await.expect("release");
}

#[test]
fn an_overlong_key_prefix_is_refused_by_build() {
    let refused = Redlock::builder()
        .node("redis://127.0.0.1:1")
        .key_prefix("p".repeat(1025))
        .build();
    match refused {
        Err(ConfigError::BadOption { option, reason }) => {
            assert_eq!(option, "key_prefix");
            assert!(reason.contains("1025"), "{reason}");
        }
        other => panic!("expected BadOption, got {other:?}"),
    }
}
