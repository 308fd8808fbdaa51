//! What comes back: the routine's result and error unchanged, an acquire error through
//! `E::from`, and bad input rejected before any traffic.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redfence::{Error, InvalidInput, Redlock};

use crate::support::{Servers, TestRedlock};
use crate::{MS, PATIENT, held_everywhere};

#[derive(Debug)]
enum AppError {
    Lock(Error),
    Ledger(&'static str),
}

impl From<Error> for AppError {
    fn from(err: Error) -> Self {
        AppError::Lock(err)
    }
}

#[tokio::test]
async fn the_routines_result_and_error_come_back_unchanged() {
    let servers = Servers::start(3);
    let redlock = servers.patient();
    let checker = &servers;
    let ok: Result<u32, AppError> = redlock
        .using(&["job"], Duration::from_secs(5), |signal| async move {
            held_everywhere(checker, &signal).await;
            Ok(42)
        })
        .await;
    assert!(matches!(ok, Ok(42)), "{ok:?}");
    let err: Result<u32, AppError> = redlock
        .using(&["job"], Duration::from_secs(5), |signal| async move {
            held_everywhere(checker, &signal).await;
            Err(AppError::Ledger("rejected"))
        })
        .await;
    assert!(matches!(err, Err(AppError::Ledger("rejected"))), "{err:?}");
    for i in 0..3 {
        assert!(servers.keys(i).is_empty(), "node {i}");
    }

    // A lock held elsewhere: the acquire error goes through `E::from`; the routine never runs.
    let held = redlock
        .acquire(&["job"], Duration::from_secs(5))
        .await
        .expect("acquire");
    let once = servers
        .builder()
        .node_timeout(PATIENT)
        .retry_count(1)
        .build()
        .expect("config");
    let err: Result<(), AppError> = once
        .using(&["job"], Duration::from_secs(5), |_| async {
            panic!("the routine must not run")
        })
        .await;
    assert!(
        matches!(err, Err(AppError::Lock(Error::Contended { .. }))),
        "{err:?}"
    );
    held.release().await.expect("release");
}

#[tokio::test]
async fn bad_input_is_rejected_before_any_traffic() {
    // Nothing listens there: any traffic would fail with QuorumUnreachable instead.
    let redlock = Redlock::builder()
        .nodes([
            "redis://127.0.0.1:1",
            "redis://127.0.0.1:2",
            "redis://127.0.0.1:3",
        ])
        .automatic_extension_threshold(500 * MS)
        .build()
        .expect("config");
    let ran = AtomicBool::new(false);
    let run = |resources: &'static [&'static str], ttl: Duration| {
        let redlock = redlock.clone();
        let ran = &ran;
        async move {
            let started = Instant::now();
            let result: Result<(), AppError> = redlock
                .using(resources, ttl, |_| async move {
                    ran.store(true, Ordering::SeqCst);
                    Ok(())
                })
                .await;
            assert!(started.elapsed() < 100 * MS, "sent traffic first");
            match result {
                Err(AppError::Lock(Error::InvalidInput(e))) => e,
                other => panic!("expected InvalidInput, got {other:?}"),
            }
        }
    };
    let secs = Duration::from_secs(5);
    assert_eq!(run(&[], secs).await, InvalidInput::NoResources);
    assert!(matches!(
        run(&["a", ""], secs).await,
        InvalidInput::EmptyResource { index: 1 }
    ));
    assert!(matches!(
        run(&["a", "a"], secs).await,
        InvalidInput::DuplicateResource { .. }
    ));
    assert!(matches!(
        run(&["a"], Duration::ZERO).await,
        InvalidInput::ZeroTtl { .. }
    ));
    for ttl in [100 * MS, 500 * MS, 507 * MS] {
        let e = run(&["a"], ttl).await;
        assert!(
            matches!(e, InvalidInput::TtlNotAboveThreshold { ttl: t, threshold, .. }
                if t == ttl && threshold == 500 * MS),
            "{e:?}"
        );
    }
    assert!(!ran.load(Ordering::SeqCst));
}
