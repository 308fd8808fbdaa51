//! PostgreSQL crashed, stopped or paused: committed tokens survive, locks fail closed, the
//! counter recovers; and the counter's connection ends with it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redfence::{Error, FencingCounter, FencingError};
use redfence_postgres::PostgresCounter;

use crate::next;
use crate::support::postgres::Postgres;
use crate::support::{self, Servers, TestRedlock};
use crate::{TTL, names, no_key_left};

#[tokio::test]
async fn committed_fences_survive_a_crash_restart() {
    let mut pg = Postgres::start();
    let reconnecting = PostgresCounter::connect(&pg.url()).expect("config");
    let shared = PostgresCounter::new(pg.client().await);
    let mut last_a = 0;
    let mut last_b = 0;
    for i in 0..30 {
        let set: &[&str] = match i % 3 {
            0 => &["a"],
            1 => &["b"],
            _ => &["a", "b"],
        };
        let fence = next(&reconnecting, set).await;
        if set.contains(&"a") {
            assert!(fence > last_a);
            last_a = fence;
        }
        if set.contains(&"b") {
            assert!(fence > last_b);
            last_b = fence;
        }
    }
    let fence = next(&shared, &["a"]).await;
    assert!(fence > last_a);
    last_a = fence;

    // A crash: no checkpoint; the committed tokens come back from the WAL.
    pg.restart();

    let fresh = PostgresCounter::connect(&pg.url()).expect("config");
    let a = next(&fresh, &["a"]).await;
    assert!(a > last_a, "a: {a} after a restart, {last_a} before");
    let b = next(&fresh, &["b"]).await;
    assert!(b > last_b, "b: {b} after a restart, {last_b} before");
    let ab = next(&fresh, &["a", "b"]).await;
    assert!(ab > a && ab > b);

    // The counter that connected itself reconnects, and goes on from there.
    let again = next(&reconnecting, &["a", "b"]).await;
    assert!(again > ab);

    // A counter over a client the caller owns fails closed once that client's connection
    // is gone: reconnecting is the caller's job.
    let err = shared
        .next_fence(&names(&["a"]))
        .await
        .expect_err("its connection died");
    assert!(
        err.to_string().contains("PostgreSQL fencing counter"),
        "{err}"
    );
    let after = next(&PostgresCounter::new(pg.client().await), &["a"]).await;
    assert!(after > again);
}

#[tokio::test]
async fn postgres_down_fails_closed_and_leaves_no_key() {
    let servers = Servers::start(3);
    let mut pg = Postgres::start();
    let redlock = servers
        .builder()
        .fencing(PostgresCounter::connect(&pg.url()).expect("config"))
        .build()
        .expect("config");
    let lock = redlock.acquire(&["job"], TTL).await.expect("acquire");
    let before = lock.fence().expect("fence");
    lock.release().await.expect("release");
    assert!(no_key_left(&servers).await);

    pg.stop_immediate();
    let started = Instant::now();
    let err = redlock
        .acquire(&["job"], TTL)
        .await
        .expect_err("no counter");
    match &err {
        // Connection refused (or reset, or timed out): either way, no token.
        Error::Fencing(FencingError::Counter(e)) => {
            assert!(e.to_string().contains("PostgreSQL fencing counter"), "{e}")
        }
        Error::Fencing(FencingError::Timeout(_)) => {}
        other => panic!("expected Error::Fencing, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(no_key_left(&servers).await);

    // Back up: the same lock manager works again, and tokens went on growing.
    pg.start_again();
    let lock = redlock.acquire(&["job"], TTL).await.expect("acquire");
    assert!(lock.fence().expect("fence") > before);
    lock.release().await.expect("release");
}

/// The counter's background task, and with it its connection, end when it is dropped.
#[tokio::test]
async fn dropping_the_counter_closes_its_connection() {
    let pg = Postgres::start();
    let client = pg.client().await;
    let backends = || async {
        client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'",
                &[],
            )
            .await
            .expect("select")
            .get::<_, i64>(0)
    };
    let alone = backends().await;
    let counter = PostgresCounter::connect(&pg.url()).expect("config");
    next(&counter, &["r"]).await;
    assert_eq!(backends().await, alone + 1);
    drop(counter);
    let deadline = Instant::now() + support::DEADLINE;
    while backends().await > alone {
        assert!(
            Instant::now() < deadline,
            "the counter's connection is still open"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_paused_postgres_times_out_and_the_counter_recovers() {
    let servers = Servers::start(3);
    let mut pg = Postgres::start();
    let counter = Arc::new(
        PostgresCounter::connect(&pg.url())
            .expect("config")
            .timeout(Duration::from_millis(300)),
    );
    let before = next(&counter, &["r"]).await;

    pg.pause();
    let started = Instant::now();
    let err = counter
        .next_fence(&names(&["r"]))
        .await
        .expect_err("paused");
    assert!(err.to_string().contains("no answer within 300ms"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    // Through a lock: fail closed, nothing left locked.
    let redlock = servers
        .builder()
        .fencing(counter.clone())
        .fencing_timeout(Duration::from_millis(200))
        .build()
        .expect("config");
    let err = redlock.acquire(&["r"], TTL).await.expect_err("paused");
    assert!(matches!(err, Error::Fencing(_)), "{err:?}");
    assert!(no_key_left(&servers).await);

    pg.resume();
    // The counter drops the connection it gave up on and connects again.
    let deadline = Instant::now() + support::DEADLINE;
    let after = loop {
        if let Ok(fence) = counter.next_fence(&names(&["r"])).await {
            break fence;
        }
        assert!(Instant::now() < deadline, "the counter did not recover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(after > before);
    let lock = redlock.acquire(&["r"], TTL).await.expect("acquire");
    assert!(lock.fence().expect("fence") > after);
    lock.release().await.expect("release");
}
