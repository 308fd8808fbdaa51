//! Unit tests of the builder: configuration errors and defaults, on fake nodes.

use super::*;

/// Why a builder over the nodes at `urls` does not build.
fn invalid_nodes(urls: &[&str]) -> ConfigError {
    invalid(
        urls.iter()
            .fold(RedlockBuilder::new(), |b, url| b.node(*url)),
    )
}

fn invalid(b: RedlockBuilder) -> ConfigError {
    match b.build() {
        Err(e) => e,
        Ok(r) => panic!("expected a ConfigError, got {r:?}"),
    }
}

#[test]
fn no_nodes() {
    assert_eq!(invalid(RedlockBuilder::new()), ConfigError::NoNodes);
}

#[test]
fn bad_url_names_the_node() {
    let e = invalid_nodes(&["redis://127.0.0.1:1", "not a url"]);
    assert!(
        matches!(e, ConfigError::BadNodeUrl { index: 1, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("not a url"));
}

#[test]
fn duplicate_nodes() {
    let e = invalid_nodes(&[
        "redis://127.0.0.1:7001",
        "redis://127.0.0.1:7002",
        "redis://127.0.0.1:7001/0",
    ]);
    assert!(
        matches!(
            e,
            ConfigError::DuplicateNode {
                first: 0,
                second: 2,
                ..
            }
        ),
        "{e:?}"
    );
    // A different database on the same server is still the same server.
    let e = invalid_nodes(&["redis://127.0.0.1:7001/0", "redis://127.0.0.1:7001/1"]);
    assert!(matches!(e, ConfigError::DuplicateNode { .. }), "{e:?}");
}

#[test]
fn one_server_under_two_names_is_a_duplicate() {
    let e = invalid_nodes(&["redis://127.0.0.1:7001", "redis://localhost:7001/3"]);
    assert!(
        matches!(
            e,
            ConfigError::DuplicateNode {
                first: 0,
                second: 1,
                ..
            }
        ),
        "{e:?}"
    );
}

const TLS: bool = cfg!(any(feature = "tls-rustls", feature = "tls-native-tls"));

#[test]
fn passwords_never_show() {
    let mut bad = vec!["redis://:hunter2@127.0.0.1:99999999/0"];
    if !TLS {
        bad.push("rediss://app:hunter2@127.0.0.1:7001");
    }
    for url in bad {
        let e = invalid(RedlockBuilder::new().node(url));
        assert!(matches!(e, ConfigError::BadNodeUrl { .. }), "{e:?}");
        let shown = format!("{e} {e:?} {}", crate::Error::from(e.clone()));
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }
    let builder = RedlockBuilder::new()
        .node("redis://app:hunter2@127.0.0.1:7001")
        .node(redis::Client::open("redis://:hunter2@127.0.0.1:7002").expect("url"));
    let shown = format!("{builder:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
}

#[test]
fn tls_needs_a_tls_feature() {
    let built = RedlockBuilder::new()
        .node("rediss://127.0.0.1:7001")
        .build();
    if TLS {
        assert!(built.is_ok(), "{built:?}");
    } else {
        let e = invalid_nodes(&["rediss://127.0.0.1:7001"]);
        assert!(matches!(e, ConfigError::BadNodeUrl { .. }), "{e:?}");
        assert!(e.to_string().contains("`tls-rustls`"), "{e}");
    }
}

#[test]
fn drift_factor_must_be_sane() {
    for f in [f64::NAN, -0.1, 1.0, f64::INFINITY] {
        let e = invalid(
            RedlockBuilder::new()
                .node("redis://127.0.0.1:1")
                .drift_factor(f),
        );
        assert!(matches!(e, ConfigError::BadDriftFactor(_)), "{f}: {e:?}");
    }
}

#[test]
fn zero_durations_are_rejected() {
    let base = || RedlockBuilder::new().node("redis://127.0.0.1:1");
    for (b, name) in [
        (base().node_timeout(Duration::ZERO), "node_timeout"),
        (base().acquire_timeout(Duration::ZERO), "acquire_timeout"),
        (base().max_hold(Duration::ZERO), "max_hold"),
        (
            base().automatic_extension_threshold(Duration::ZERO),
            "automatic_extension_threshold",
        ),
    ] {
        let e = invalid(b);
        assert!(
            matches!(e, ConfigError::BadOption { option, .. } if option == name),
            "{e:?}"
        );
    }
}

#[test]
fn builds_without_a_runtime_or_a_server() {
    let r = RedlockBuilder::new()
        .nodes(["redis://127.0.0.1:1", "redis://127.0.0.1:2"])
        .node(redis::Client::open("redis://127.0.0.1:3").expect("valid url"))
        .build();
    assert!(r.is_ok(), "{r:?}");
}

#[test]
fn retry_delay_and_jitter_compose_with_the_retry_count() {
    let b = RedlockBuilder::new()
        .retry_count(3)
        .retry_delay(Duration::from_millis(30))
        .retry_jitter(Duration::from_millis(5));
    assert_eq!(
        b.config.backoff,
        Backoff::fixed(Duration::from_millis(30), Duration::from_millis(5)).retries(3)
    );
}
