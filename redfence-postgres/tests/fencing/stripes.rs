//! `PostgresCounter::striped`: token order per resource under 16 clients through a crash
//! restart, a lock over several stripes, the move from per-resource rows (which shuts the
//! per-resource mode out), and a refused stripe count.

use std::sync::Arc;

use redfence::fence::Stripes;
use redfence::{FencingCounter, Redlock};
use redfence_postgres::PostgresCounter;

use crate::support::postgres::Postgres;
use crate::support::token_order::Clients;
use crate::support::{self, Servers, TestRedlock};
use crate::{TTL, names, next};

fn striped(pg: &Postgres) -> PostgresCounter {
    PostgresCounter::connect(&pg.url())
        .expect("config")
        .striped(Stripes::DEFAULT)
}

/// Two resource names on different stripes.
fn on_two_stripes() -> (String, String) {
    let s = Stripes::DEFAULT;
    let a = "invoice:1".to_owned();
    let b = (2..)
        .map(|i| format!("invoice:{i}"))
        .find(|b| s.of(b) != s.of(&a))
        .expect("another stripe");
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_clients_keep_each_resource_rising_through_a_restart() {
    let mut pg = Postgres::start();
    let counters: Vec<Arc<dyn FencingCounter>> =
        (0..16).map(|_| Arc::new(striped(&pg)) as _).collect();
    // Twelve resources, and locks over two of them (on different stripes or the same).
    let mut sets: Vec<Vec<String>> = (0..12).map(|i| vec![format!("r{i}")]).collect();
    sets.push(names(&["r0", "r5"]));
    sets.push(names(&["r3", "r7", "r11"]));
    let clients = Clients::start(counters, sets);

    let issued = |n: usize| {
        let clients = &clients;
        support::eventually(move || clients.issued() >= n)
    };
    assert!(issued(2_000).await, "{} tokens before", clients.issued());
    let before: Vec<u64> = (0..12).map(|i| clients.last(&format!("r{i}"))).collect();

    // A crash, no checkpoint: the stripes come back from the WAL, the clients reconnect.
    tokio::task::block_in_place(|| pg.restart());
    let at_restart = clients.issued();
    assert!(
        issued(at_restart + 2_000).await,
        "{} tokens after the restart ({} failed)",
        clients.issued() - at_restart,
        clients.failed()
    );
    for (i, before) in before.iter().enumerate() {
        assert!(clients.last(&format!("r{i}")) > *before, "r{i}");
    }
    let violations = clients.stop().await;
    assert!(violations.is_empty(), "{violations:?}");
}

#[tokio::test]
async fn a_lock_over_two_stripes_exceeds_both() {
    let pg = Postgres::start();
    let counter = striped(&pg);
    let (a, b) = on_two_stripes();
    let mut last_a = 0;
    for _ in 0..20 {
        last_a = next(&counter, &[&a]).await;
    }
    let last_b = next(&counter, &[&b]).await;
    let ab = next(&counter, &[&a, &b]).await;
    assert!(ab > last_a && ab > last_b, "{ab} after {last_a}, {last_b}");
    // Both stripes were raised to it.
    assert!(next(&counter, &[&b]).await > ab);
    assert!(next(&counter, &[&a]).await > ab);

    // The same through the lock manager, beside single-resource locks in one batch.
    let servers = Servers::start(3);
    let redlock: Redlock = servers
        .builder()
        .fencing(striped(&pg))
        .build()
        .expect("config");
    let single = redlock.acquire(&[b.as_str()], TTL).await.expect("acquire");
    let last_b = single.fence().expect("fence");
    single.release().await.expect("release");
    let both = redlock
        .acquire(&[a.as_str(), b.as_str()], TTL)
        .await
        .expect("acquire");
    assert!(both.fence().expect("fence") > last_b);
    both.release().await.expect("release");
}

#[tokio::test]
async fn a_per_resource_table_moves_to_stripes_and_shuts_the_old_mode_out() {
    let pg = Postgres::start();
    let old = PostgresCounter::connect(&pg.url()).expect("config");
    // The per-resource mode on an existing table.
    for _ in 0..40 {
        next(&old, &["hot"]).await;
    }
    let hot = next(&old, &["hot"]).await;
    let cold = next(&old, &["cold"]).await;
    assert_eq!((hot, cold), (41, 1));

    // The first striped request moves the table: every stripe starts above 41.
    let new = striped(&pg);
    assert!(next(&new, &["cold"]).await > hot);
    assert!(next(&new, &["hot"]).await > hot);

    // The per-resource mode now fails closed, and says why.
    let err = old
        .next_fence(&names(&["hot"]))
        .await
        .expect_err("striped table");
    let err = err.to_string();
    assert!(
        err.contains("redfence_striped_16") && err.contains("Stripes::new(16)"),
        "{err}"
    );
    let err = old
        .next_fence(&names(&["fresh", "hot"]))
        .await
        .expect_err("striped table");
    assert!(err.to_string().contains("redfence_striped_16"), "{err}");

    // Another stripe count is refused, and leaves the table as it was.
    let other = PostgresCounter::connect(&pg.url())
        .expect("config")
        .striped(Stripes::new(8).expect("8"));
    let err = other
        .next_fence(&names(&["hot"]))
        .await
        .expect_err("another count");
    assert!(err.to_string().contains("another count"), "{err}");
    assert!(next(&new, &["hot"]).await > hot);

    // The migration SQL is repeatable.
    let sql = new.striped_migration_sql().expect("striped").to_owned();
    let client = pg.client().await;
    client.batch_execute(&sql).await.expect("again");
    client.batch_execute(&sql).await.expect("and again");
    let rows: i64 = client
        .query_one(
            "SELECT count(*) FROM redfence_fences WHERE resource LIKE 'redfence:stripe:%'",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows, 16);
}
