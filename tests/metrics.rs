//! The metrics (feature `metrics`) against real redis-server processes (the fenced writes'
//! are tested in `redfence-postgres/tests/metrics.rs`): each test records into its own local
//! recorder, on a current-thread runtime so that background tasks record there too.

mod support;

use std::time::Duration;

use metrics_util::debugging::DebuggingRecorder;
use redfence::{Error, LossReason, Redlock, RedlockBuilder, ResourceType};
use support::recorded::{counter, samples, snapshot, value};
use support::{Servers, TestRedlock, eventually, warm_up};

const TTL: Duration = Duration::from_secs(10);

/// Another owner takes `key` on every server, behind its holder's back (a deleted key would be
/// set again by the holder's next extension: extensions repair).
fn taken_over(servers: &Servers, key: &str) {
    for i in 0..servers.len() {
        let _: () = servers.cmd(i, &["SET", key, "someone-else", "PX", "60000"]);
    }
}

/// The test servers' builder, with a node timeout generous enough that a loaded machine does
/// not turn a contended attempt into an unreachable one.
fn builder(servers: &Servers) -> RedlockBuilder {
    servers.builder().node_timeout(Duration::from_millis(500))
}

#[tokio::test]
async fn a_hold_is_timed_until_its_release_loss_or_drop() {
    let servers = Servers::start(3);
    let redlock = builder(&servers).build().expect("config");
    warm_up(&redlock).await;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    let released = redlock.acquire(&["job:1"], TTL).await.expect("acquire");
    released.release().await.expect("release");

    let dropped = redlock.acquire(&["job:2"], TTL).await.expect("acquire");
    drop(dropped);

    // Taken over behind its back: the next extension finds another owner.
    let mut taken = redlock.acquire(&["job:3"], TTL).await.expect("acquire");
    taken_over(&servers, "job:3");
    let err = taken.extend(TTL).await.expect_err("not held any more");
    assert!(
        matches!(
            err,
            Error::LockLost {
                reason: LossReason::NotHeld { .. },
                ..
            }
        ),
        "{err}"
    );
    taken.release().await.expect("release after loss");

    // Released only after its validity ran out: lost, at its expiry.
    let short = Duration::from_millis(100);
    let expired = redlock.acquire(&["job:4"], short).await.expect("acquire");
    assert!(eventually(|| expired.is_expired()).await);
    expired.release().await.expect("release of an expired lock");
    redlock.close().await;

    let all = snapshot(&snapshotter);
    let hold = |end| {
        samples(value(
            &all,
            "redfence_lock_hold_seconds",
            &[("type", "job"), ("end", end)],
        ))
    };
    assert_eq!(hold("released").len(), 1);
    assert_eq!(hold("dropped").len(), 1);
    let lost = hold("lost");
    assert_eq!(lost.len(), 2, "{lost:?}");
    // The expired lock's hold ends at its expiry, inside its 100 ms TTL, not at the late
    // release.
    assert!(lost[0] < short.as_secs_f64(), "{lost:?}");
    assert_eq!(
        counter(
            &all,
            "redfence_acquire_total",
            &[("result", "acquired"), ("type", "job")]
        ),
        4
    );
    assert_eq!(
        samples(value(&all, "redfence_acquire_retries", &[("type", "job")])),
        [0.0; 4]
    );
}

#[tokio::test]
async fn using_records_a_released_and_a_lost_hold() {
    let servers = Servers::start(3);
    let redlock = builder(&servers)
        .automatic_extension_threshold(Duration::from_secs(1))
        .build()
        .expect("config");
    warm_up(&redlock).await;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    redlock
        .using(&["report:daily"], TTL, |_| async { Ok::<_, Error>(()) })
        .await
        .expect("using");
    let servers = &servers;
    let aborted = redlock
        .using(
            &["report:weekly"],
            Duration::from_secs(3),
            |signal| async move {
                taken_over(servers, "report:weekly");
                tokio::time::timeout(Duration::from_secs(10), signal.aborted())
                    .await
                    .map_err(|_| Error::Closed)
            },
        )
        .await
        .expect("the signal aborted");
    assert!(aborted.is_lock_lost(), "{aborted}");
    redlock.close().await;

    let all = snapshot(&snapshotter);
    let hold = |end| {
        value(
            &all,
            "redfence_lock_hold_seconds",
            &[("type", "report"), ("end", end)],
        )
    };
    assert_eq!(samples(hold("released")).len(), 1);
    assert_eq!(samples(hold("lost")).len(), 1);
    assert!(hold("dropped").is_none());
    assert_eq!(
        counter(&all, "redfence_lock_lost_total", &[("reason", "not_held")]),
        1
    );
}

#[tokio::test]
async fn contention_retries_and_backoff_are_recorded_by_type() {
    let servers = Servers::start(3);
    let holder = builder(&servers).build().expect("config");
    let waiter = builder(&servers)
        .retry_count(2)
        .retry_delay(Duration::from_millis(20))
        .retry_jitter(Duration::ZERO)
        .build()
        .expect("config");
    warm_up(&holder).await;
    warm_up(&waiter).await;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    let held = holder.acquire(&["order:1"], TTL).await.expect("acquire");
    let once = waiter.try_acquire(&["order:1"], TTL).await;
    assert!(
        matches!(once, Err(Error::Contended { attempts: 1, .. })),
        "{once:?}"
    );
    let retried = waiter.acquire(&["order:1"], TTL).await;
    assert!(
        matches!(retried, Err(Error::Contended { attempts: 3, .. })),
        "{retried:?}"
    );
    // A multi-resource request of two types, and a name without a type.
    let mixed = waiter.try_acquire(&["order:1", "invoice:2"], TTL).await;
    assert!(matches!(mixed, Err(Error::Contended { .. })), "{mixed:?}");
    let untyped = waiter.acquire(&["untyped"], TTL).await.expect("acquire");
    held.release().await.expect("release");
    untyped.release().await.expect("release");

    let all = snapshot(&snapshotter);
    // One try, three attempts of the retrying call.
    assert_eq!(
        counter(&all, "redfence_contended_total", &[("type", "order")]),
        4
    );
    assert_eq!(
        counter(&all, "redfence_contended_total", &[("type", "mixed")]),
        1
    );
    assert_eq!(
        counter(
            &all,
            "redfence_acquire_total",
            &[("result", "contended"), ("type", "order")]
        ),
        2
    );
    assert_eq!(
        counter(
            &all,
            "redfence_acquire_total",
            &[("result", "acquired"), ("type", "other")]
        ),
        1
    );
    // Retries and backoff per retrying call only (`try_acquire` never retries): none for the
    // holder's `acquire`; two retries, two 20 ms waits with no jitter for the waiter's, measured.
    assert_eq!(
        samples(value(
            &all,
            "redfence_acquire_retries",
            &[("type", "order")]
        )),
        [0.0, 2.0]
    );
    let backoff = samples(value(
        &all,
        "redfence_acquire_backoff_seconds",
        &[("type", "order")],
    ));
    assert_eq!(backoff.len(), 2);
    assert_eq!(backoff[0], 0.0);
    // The time actually waited: at least the two delays (a release may cut a wait short
    // only when there is one; here the holder releases after).
    assert!(backoff[1] >= 0.040 && backoff[1] < 2.0, "{backoff:?}");
}

#[tokio::test]
async fn a_custom_resource_type_labels_the_lock() {
    let servers = Servers::start(1);
    let redlock: Redlock = builder(&servers)
        .resource_type(ResourceType::custom(|name| name.split('/').nth(1)))
        .build()
        .expect("config");
    warm_up(&redlock).await;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    let lock = redlock
        .acquire(&["tenant-a/invoice/x"], TTL)
        .await
        .expect("acquire");
    lock.release().await.expect("release");
    let all = snapshot(&snapshotter);
    assert_eq!(
        counter(
            &all,
            "redfence_acquire_total",
            &[("result", "acquired"), ("type", "invoice")]
        ),
        1
    );
}
