//! `RedisCounter::striped`: token order per resource under 16 clients through a restart of
//! a persisting server, a lock over several stripes, and the move from per-resource keys.

use std::sync::Arc;

use redfence::fence::Stripes;
use redfence::{FencingCounter, RedisCounter};

use crate::names;
use crate::support::token_order::Clients;
use crate::support::{self, Servers};

fn striped(store: &Servers) -> RedisCounter {
    RedisCounter::open(&store.url(0))
        .expect("url")
        .striped(Stripes::DEFAULT)
}

async fn next(counter: &RedisCounter, r: &[&str]) -> u64 {
    counter.next_fence(&names(r)).await.expect("fence")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_clients_keep_each_resource_rising_through_a_restart() {
    let mut store = Servers::start_with(1, &["--appendonly", "yes", "--appendfsync", "always"]);
    let counters: Vec<Arc<dyn FencingCounter>> =
        (0..16).map(|_| Arc::new(striped(&store)) as _).collect();
    let mut sets: Vec<Vec<String>> = (0..12).map(|i| vec![format!("r{i}")]).collect();
    sets.push(names(&["r0", "r5"]));
    sets.push(names(&["r3", "r7", "r11"]));
    let clients = Clients::start(counters, sets);

    let issued = |n: usize| {
        let clients = &clients;
        support::eventually(move || clients.issued() >= n)
    };
    assert!(issued(3_000).await, "{} tokens before", clients.issued());
    let before: Vec<u64> = (0..12).map(|i| clients.last(&format!("r{i}"))).collect();

    // Killed and started again: the stripes come back from the AOF.
    tokio::task::block_in_place(|| store.restart(0));
    let at_restart = clients.issued();
    assert!(
        issued(at_restart + 3_000).await,
        "{} tokens after the restart ({} failed)",
        clients.issued() - at_restart,
        clients.failed()
    );
    for (i, before) in before.iter().enumerate() {
        assert!(clients.last(&format!("r{i}")) > *before, "r{i}");
    }
    let violations = clients.stop().await;
    assert!(violations.is_empty(), "{violations:?}");
    // Only the marker and the stripes: no key per resource.
    let mut keys = store.keys(0);
    keys.sort();
    assert_eq!(keys.len(), 17, "{keys:?}");
    assert_eq!(store.get(0, "fence:#stripes").as_deref(), Some("16"));
}

#[tokio::test]
async fn a_lock_over_two_stripes_exceeds_both() {
    let store = Servers::start(1);
    let counter = striped(&store);
    let s = Stripes::DEFAULT;
    let a = "invoice:1";
    let b = (2..)
        .map(|i| format!("invoice:{i}"))
        .find(|b| s.of(b) != s.of(a))
        .expect("another stripe");
    let mut last_a = 0;
    for _ in 0..20 {
        last_a = next(&counter, &[a]).await;
    }
    let last_b = next(&counter, &[&b]).await;
    let ab = next(&counter, &[a, &b]).await;
    assert!(ab > last_a && ab > last_b, "{ab} after {last_a}, {last_b}");
    // Both stripes were raised to it.
    assert_eq!(
        store.get(0, &format!("fence:#stripe:{}", s.of(&b))),
        Some(ab.to_string())
    );
    assert!(next(&counter, &[&b]).await > ab);
    assert!(next(&counter, &[a]).await > ab);
}

#[tokio::test]
async fn per_resource_keys_move_to_stripes() {
    let store = Servers::start(1);
    let old = RedisCounter::open(&store.url(0)).expect("url");
    for _ in 0..40 {
        next(&old, &["hot"]).await;
    }
    let hot = next(&old, &["hot"]).await;
    assert_eq!(hot, 41);
    assert_eq!(next(&old, &["cold"]).await, 1);

    // The first striped request makes every stripe start at the largest per-resource token.
    let new = striped(&store);
    assert!(next(&new, &["cold"]).await > hot);
    assert!(next(&new, &["hot"]).await > hot);
    for i in 0..16 {
        let stripe = store.get(0, &format!("fence:#stripe:{i}")).expect("stripe");
        assert!(
            stripe.parse::<u64>().expect("integer") >= hot,
            "{i}: {stripe}"
        );
    }

    // Another stripe count is refused.
    let other = RedisCounter::open(&store.url(0))
        .expect("url")
        .striped(Stripes::new(8).expect("8"));
    let err = other
        .next_fence(&names(&["hot"]))
        .await
        .expect_err("another count");
    assert!(
        err.to_string()
            .contains("every client must use the same count"),
        "{err}"
    );
    assert!(next(&new, &["hot"]).await > hot);
}
