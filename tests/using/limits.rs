//! Bounded renewal: `max_extensions` and `max_hold` stop renewal and abort with
//! `RenewalLimit`, before the bound; a first lease longer than `max_hold` is refused.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redfence::{Error, Event, InvalidInput, RenewalLimit};

use crate::support::{Servers, TestRedlock, eventually};
use crate::{MS, abort_of, recorded};

#[tokio::test]
async fn max_extensions_stops_renewal_and_aborts_with_renewal_limit() {
    let servers = Servers::start(5);
    let threshold = 300 * MS;
    let (events, redlock) = recorded(
        servers
            .builder()
            .node_timeout(250 * MS)
            .automatic_extension_threshold(threshold)
            .max_extensions(2),
    );
    let checker = &servers;
    let (err, remaining, extended_at_abort) = redlock
        .using(&["job"], Duration::from_secs(1), |signal| {
            let events = events.clone();
            async move {
                let (err, remaining) = abort_of(&signal).await;
                let extended = events.extended();
                // The routine keeps going: the lock expires on its own.
                assert!(eventually(|| (0..5).all(|i| checker.get(i, "job").is_none())).await);
                assert!(signal.is_aborted());
                Ok::<_, Error>((err, remaining, extended))
            }
        })
        .await
        .expect("using");
    assert!(
        matches!(
            err,
            Error::RenewalLimit {
                limit: RenewalLimit::Extensions(2),
                ..
            }
        ),
        "{err:?}"
    );
    // Aborted when the next extension was needed: below the threshold, before expiry.
    assert!(
        remaining > Duration::ZERO && remaining <= threshold,
        "{remaining:?}"
    );
    assert_eq!(extended_at_abort, 2);
    assert_eq!(events.extended(), 2, "{:?}", events.all());
    assert_eq!(
        events.count(|e| matches!(e, Event::ExtensionFailed { .. })),
        0
    );
}

#[tokio::test]
async fn max_hold_bounds_how_long_the_lock_lives() {
    let servers = Servers::start(5);
    let max_hold = Duration::from_secs(2);
    let (events, redlock) = recorded(
        servers
            .builder()
            .node_timeout(250 * MS)
            .automatic_extension_threshold(300 * MS)
            .max_hold(max_hold),
    );
    let checker = &servers;
    let started = Instant::now();
    let (err, gone_after) = redlock
        .using(&["job"], Duration::from_secs(1), |signal| async move {
            let (err, _) = abort_of(&signal).await;
            assert!(eventually(|| (0..5).all(|i| checker.get(i, "job").is_none())).await);
            Ok::<_, Error>((err, started.elapsed()))
        })
        .await
        .expect("using");
    assert!(
        matches!(
            err,
            Error::RenewalLimit {
                limit: RenewalLimit::Hold(h),
                ..
            } if h == max_hold
        ),
        "{err:?}"
    );
    assert!(events.extended() >= 1, "{:?}", events.all());
    // Renewed past one TTL, but gone (give or take polling) by max_hold.
    assert!(
        gone_after > Duration::from_secs(1) && gone_after < max_hold + Duration::from_secs(1),
        "keys lived {gone_after:?}"
    );
}

#[tokio::test]
async fn the_signal_aborts_before_max_hold_and_a_longer_ttl_is_refused() {
    let servers = Servers::start(3);
    let max_hold = 1_500 * MS;
    // When the signal aborted: the instant its Aborted event was announced, as the lease
    // decided it, not when the routine woke up to see it (beside three CPU burners a routine
    // saw the abort 1.587 s after the start: its own wake-up is not what is checked).
    let aborted_at = Arc::new(Mutex::new(None));
    let sink = Arc::clone(&aborted_at);
    let redlock = servers
        .builder()
        .automatic_extension_threshold(300 * MS)
        .max_hold(max_hold)
        .on_event(move |e: &Event| {
            if matches!(e, Event::Aborted { .. }) {
                sink.lock()
                    .expect("aborted at")
                    .get_or_insert(Instant::now());
            }
        })
        .build()
        .expect("config");
    // A first lease longer than max_hold: refused before any traffic, the routine never runs.
    let ran = AtomicBool::new(false);
    let err = redlock
        .using(&["job"], Duration::from_secs(3), |_| async {
            ran.store(true, Ordering::SeqCst);
            Ok::<_, Error>(())
        })
        .await
        .expect_err("ttl above max_hold");
    assert!(
        matches!(
            err,
            Error::InvalidInput(InvalidInput::TtlAboveMaxHold { .. })
        ),
        "{err:?}"
    );
    assert!(!ran.load(Ordering::SeqCst));
    assert!(servers.keys(0).is_empty());
    // Within the bound: the signal aborts before max_hold has passed, never after.
    let started = Instant::now();
    redlock
        .using(&["job"], Duration::from_secs(1), |signal| async move {
            let (err, _) = abort_of(&signal).await;
            assert!(matches!(err, Error::RenewalLimit { .. }), "{err:?}");
            Ok::<_, Error>(())
        })
        .await
        .expect("using");
    let aborted_at = aborted_at.lock().expect("aborted at").expect("announced");
    let aborted_after = aborted_at - started;
    assert!(aborted_after < max_hold, "aborted after {aborted_after:?}");
}
