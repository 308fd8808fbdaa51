//! What a held permit does: `using()` extends it and signals its loss, its fence increases
//! per slot, `inspect` shows the holders, and a dropped permit frees its slot.

use std::time::{Duration, Instant};

use redfence::Error;

use crate::TTL;
use crate::support::{PATIENT, Servers, TestRedlock, eventually};

#[tokio::test]
async fn using_extends_the_permit_and_signals_its_loss() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .node_timeout(PATIENT)
        .automatic_extension_threshold(Duration::from_millis(200))
        .build()
        .expect("config");
    let sem = redlock.semaphore("pool", 2).expect("semaphore");
    let ttl = Duration::from_millis(800);

    // Kept well past its TTL.
    let kept = sem
        .using(ttl, |signal| async move {
            let until = Instant::now() + ttl * 3;
            while Instant::now() < until {
                signal.check()?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok::<_, Error>(signal.resources()[0].clone())
        })
        .await
        .expect("kept alive");
    assert!(kept.starts_with("pool:semaphore:slot:"), "{kept}");
    assert!(eventually(|| servers.on_every_node(&kept, Option::is_none)).await);

    // Lost: another owner holds its slot's keys (a deleted key would be set again by the
    // next extension: extensions repair); the signal aborts.
    let lost = sem
        .using(ttl, |signal| {
            let servers = &servers;
            async move {
                let slot = signal.resources()[0].clone();
                for node in 0..3 {
                    let _: () = servers.cmd(node, &["SET", &slot, "someone-else", "PX", "60000"]);
                }
                let aborted = tokio::time::timeout(ttl * 4, signal.aborted()).await;
                Ok::<_, Error>(aborted.is_ok())
            }
        })
        .await
        .expect("scope");
    assert!(lost, "the signal aborts once the slot is lost");
}

/// Fencing tokens are per slot: successive holders of one slot get increasing fences.
#[tokio::test]
async fn fences_increase_per_slot() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .node_timeout(PATIENT)
        .fencing(redfence::MemoryCounter::new())
        .build()
        .expect("config");
    let sem = redlock.semaphore("fenced", 1).expect("semaphore");
    let first = sem.acquire(TTL).await.expect("first");
    let one = first.fence().expect("a fence");
    assert_eq!(first.lock().resources(), ["fenced:semaphore:slot:0"]);
    first.release().await.expect("release");
    let second = sem.acquire(TTL).await.expect("second");
    let two = second.fence().expect("a fence");
    assert!(two > one, "{two} after {one}");
    second.release().await.expect("release");
}

/// `inspect` shows who holds which slot; a dropped permit frees its slot in the background;
/// slot and size keys go under the key prefix.
#[tokio::test]
async fn inspect_shows_the_holders_and_a_dropped_permit_frees_its_slot() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .node_timeout(PATIENT)
        .key_prefix("app:")
        .build()
        .expect("config");
    let sem = redlock.semaphore("pool", 3).expect("semaphore");
    let a = sem.acquire(TTL).await.expect("a");
    let b = sem.acquire(TTL).await.expect("b");
    let report = sem.inspect().await.expect("inspect");
    let views = report.views();
    assert_eq!(views.len(), 3);
    for (slot, view) in views.iter().enumerate() {
        let holder = view.owner().map(|h| h.token_prefix.clone());
        let expected = [&a, &b]
            .into_iter()
            .find(|p| p.slot() as usize == slot)
            .map(|p| p.token()[..redfence::TOKEN_PREFIX_LEN].to_owned());
        assert_eq!(holder, expected, "slot {slot}: {view}");
    }
    let key = format!("app:pool:semaphore:slot:{}", a.slot());
    assert!(servers.on_every_node(&key, |value| value.as_deref() == Some(a.token())));
    assert_eq!(
        servers.get(0, "app:pool:semaphore:size").as_deref(),
        Some("3")
    );

    drop(a);
    assert!(
        eventually(|| servers.on_every_node(&key, Option::is_none)).await,
        "a dropped permit is released in the background"
    );
    b.release().await.expect("release");
}
