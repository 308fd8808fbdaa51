//! The number of permits, stored at `<name>:semaphore:size`: a client with another number is
//! refused, and leaves no slot held; bad sizes, names and TTLs are refused before any traffic.

use std::time::Duration;

use redfence::{Error, InvalidInput, MAX_PERMITS, Redlock};

use crate::TTL;
use crate::support::{Servers, TestRedlock, eventually};

fn invalid<T: std::fmt::Debug>(result: Result<T, Error>) -> InvalidInput {
    match result {
        Err(Error::InvalidInput(e)) => e,
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

/// How many clients are connected to server `i` (the inspecting one included).
fn clients(servers: &Servers, i: usize) -> usize {
    let info: String = servers.cmd(i, &["INFO", "clients"]);
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("connected_clients")
}

#[tokio::test]
async fn a_client_with_another_number_of_permits_is_refused() {
    let servers = Servers::start(3);
    let redlock = servers.patient();
    let two = redlock.semaphore("pool", 2).expect("semaphore");
    let held = two.acquire(TTL).await.expect("first client");
    assert_eq!(servers.get(0, "pool:semaphore:size").as_deref(), Some("2"));
    let size_ttl = servers.pttl(0, "pool:semaphore:size");
    assert!(
        size_ttl > 3_600_000,
        "the size key expires, late: {size_ttl}"
    );

    let other = servers.patient();
    let three = other.semaphore("pool", 3).expect("semaphore");
    // The size is claimed beside the first tries of the slots: a refused client may take a
    // free slot meanwhile (slot 2, which only it has, or the first client's other one), and
    // must release it before it fails. Several times, so that some refusals do take one.
    let free: Vec<String> = (0..3)
        .filter(|&slot| slot != held.slot())
        .map(|slot| format!("pool:semaphore:slot:{slot}"))
        .collect();
    for _ in 0..10 {
        match three.acquire(TTL).await {
            Err(Error::SemaphoreSize { name, ours, stored }) => {
                assert_eq!((name.as_str(), ours, stored.as_str()), ("pool", 3, "2"));
            }
            other => panic!("expected SemaphoreSize, got {other:?}"),
        }
        assert!(
            eventually(|| free
                .iter()
                .all(|slot| servers.on_every_node(slot, Option::is_none)))
            .await,
            "a refused client left a slot held"
        );
    }
    // The stored size is unchanged.
    assert!(servers.on_every_node("pool:semaphore:size", |size| size.as_deref() == Some("2")));
    let message = three
        .try_acquire(TTL)
        .await
        .expect_err("refused")
        .to_string();
    assert!(message.contains('2') && message.contains('3'), "{message}");
    held.release().await.expect("release");
}

#[tokio::test]
async fn a_client_refused_after_it_took_a_slot_releases_the_slot_first() {
    let servers = Servers::start(3);
    // Another number of permits, stored as a long string of digits. (Its claim's reply once
    // carried those megabytes, which made sure the refused client's first try of a slot was
    // granted before the refusal arrived; now the claim reads no more than a number's worth
    // and answers with the size, so either may come first: both must leave no slot held.)
    let stored = "7".repeat(16 << 20);
    for node in 0..3 {
        let _: () = redis::cmd("SET")
            .arg("slow:semaphore:size")
            .arg(&stored)
            .query(&mut servers.conn(node))
            .expect("SET");
    }
    let redlock = servers.patient();
    let three = redlock.semaphore("slow", 3).expect("semaphore");
    let slots: Vec<String> = three.slots().to_vec();
    // A permit TTL far beyond the wait below: a slot left held would still be there.
    let ttl = Duration::from_secs(60);
    for _ in 0..3 {
        match three.acquire(ttl).await {
            Err(Error::SemaphoreSize { ours, stored, .. }) => {
                assert_eq!((ours, stored.as_str()), (3, "<16777216 bytes>"));
            }
            other => panic!("expected SemaphoreSize, got {other:?}"),
        }
        // Released (awaited when the slot was granted first; in the background when the
        // refusal came first and the try was dropped half-way, as any cancelled attempt).
        assert!(
            eventually(|| slots
                .iter()
                .all(|slot| servers.on_every_node(slot, Option::is_none)))
            .await,
            "a refused client left a slot held"
        );
    }
}

#[tokio::test]
async fn bad_sizes_names_and_ttls_are_refused_before_any_traffic() {
    let servers = Servers::start(1);
    let before = clients(&servers, 0);
    let redlock = Redlock::builder()
        .node(servers.url(0))
        .build()
        .expect("config");
    assert_eq!(
        invalid(redlock.semaphore("jobs", 0)),
        InvalidInput::ZeroPermits
    );
    assert_eq!(
        invalid(redlock.semaphore("jobs", MAX_PERMITS + 1)),
        InvalidInput::TooManyPermits {
            permits: MAX_PERMITS + 1,
            max: MAX_PERMITS
        }
    );
    assert_eq!(
        invalid(redlock.semaphore("", 3)),
        InvalidInput::EmptyResource { index: 0 }
    );
    let long = "x".repeat(redfence::MAX_RESOURCE_LEN);
    assert!(matches!(
        invalid(redlock.semaphore(&long, 3)),
        InvalidInput::ResourceTooLong { .. }
    ));
    let sem = redlock.semaphore("jobs", MAX_PERMITS).expect("at the cap");
    assert!(matches!(
        invalid(sem.acquire(Duration::ZERO).await),
        InvalidInput::ZeroTtl { .. }
    ));
    assert!(matches!(
        invalid(
            sem.using(Duration::from_millis(100), |_| async {
                Ok::<(), Error>(())
            })
            .await
        ),
        InvalidInput::TtlNotAboveThreshold { .. }
    ));
    assert_eq!(clients(&servers, 0), before, "no connection was made");
    assert!(servers.keys(0).is_empty());
}
