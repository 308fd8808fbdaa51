//! An adversarial review of the restart quarantine by memory (`src/memory.rs`,
//! `src/memory/identity.rs`, `src/node/server_link.rs`): attacks that tried to make two valid
//! owners (or more than K semaphore holders) with the default quarantine, on real servers. The
//! attacks that found a bug (each fixed) and the ones the quarantine withstood, kept as
//! regression tests. The plain-command attacks are in `plain_rerun.rs`.

use std::time::Duration;

use redfence::{Error, Lock, Redlock};

use crate::support::proxy::{Mode, Proxy};
use crate::support::restarted::quarantined;
use crate::support::{PATIENT, Servers, eventually, warm_up};

pub(super) const RES: &str = "ledger:review";
pub(super) const TTL: Duration = Duration::from_secs(20);

/// A client with the default quarantine over `urls`, one attempt per acquisition, node calls
/// bounded by `node_timeout`.
pub(super) fn client(urls: &[String], node_timeout: Duration) -> Redlock {
    Redlock::builder()
        .nodes(urls.to_vec())
        .retry_count(0)
        .node_timeout(node_timeout)
        .build()
        .expect("valid config")
}

/// A fresh client (a new process) with the default quarantine, over every test server.
pub(super) fn fresh(servers: &Servers) -> Redlock {
    client(&servers.urls(), PATIENT)
}

/// The roster key in which the server named `name` (as clients name it) is remembered.
pub(super) fn roster_key_named(name: &str) -> String {
    format!("redfence:roster:{name}")
}

/// Server `i`'s name as clients name it when they use its own URL.
pub(super) fn name_of(servers: &Servers, i: usize) -> String {
    format!("127.0.0.1:{}/0", servers.port(i))
}

/// The marker id on server `i`.
pub(super) fn marker_id(servers: &Servers, i: usize) -> Option<String> {
    let marker = servers.get(i, "redfence:memory")?;
    Some(marker.rsplit_once('|')?.0.to_owned())
}

/// Whether server `on`'s roster entry for the server named `of_name` (marker on `of`) names
/// `of`'s current marker.
pub(super) fn roster_current(servers: &Servers, on: usize, of: usize, of_name: &str) -> bool {
    let (Some(entry), Some(id)) = (
        servers.get(on, &roster_key_named(of_name)),
        marker_id(servers, of),
    ) else {
        return false;
    };
    entry.starts_with(&format!("{id}|"))
}

/// Every server's name as clients name it through `urls`.
pub(super) fn names_of(urls: &[String]) -> Vec<String> {
    urls.iter()
        .map(|url| {
            let addr = url.trim_start_matches("redis://");
            let addr = addr.rsplit_once('@').map_or(addr, |(_, addr)| addr);
            format!("{addr}/0")
        })
        .collect()
}

/// Waits until every server's roster names every other server's current marker, the
/// servers named as `urls` name them.
pub(super) async fn rosters_current_as(servers: &Servers, urls: &[String]) {
    let names = names_of(urls);
    let n = servers.len();
    let current = eventually(|| {
        (0..n).all(|on| {
            (0..n)
                .filter(|&of| of != on)
                .all(|of| roster_current(servers, on, of, &names[of]))
        })
    })
    .await;
    assert!(
        current,
        "every roster names every other server's current marker"
    );
}

/// The same, the servers named by their own URLs.
pub(super) async fn rosters_current(servers: &Servers) {
    rosters_current_as(servers, &servers.urls()).await;
}

/// Prints every server's marker and roster.
pub(super) fn dump_memory(servers: &Servers, when: &str) {
    for i in 0..servers.len() {
        let mut keys: Vec<String> = servers
            .all_keys(i)
            .into_iter()
            .filter(|k| k.starts_with("redfence:"))
            .collect();
        keys.sort();
        for key in keys {
            eprintln!("{when}: server {i} {key} = {:?}", servers.get(i, &key));
        }
    }
}

/// `err` is a refusal in which `nodes` were quarantined.
pub(super) fn assert_quarantined(err: &Error, nodes: &[usize]) {
    let mut seen = quarantined(err);
    seen.sort_unstable();
    assert_eq!(seen, nodes, "{err}");
    assert!(err.to_string().contains("quarantined"), "{err}");
}

/// The safety property: `second` (another client's attempt) must not be granted while
/// `first` is still valid.
pub(super) async fn assert_not_two_owners(first: &Lock, second: Result<Lock, Error>, what: &str) {
    match second {
        Ok(second) => {
            let both = !first.is_expired();
            let _ = second.release().await;
            assert!(
                !both,
                "TWO VALID OWNERS ({what}): a second lock was granted while the first, \
                 {:?} left, was still valid",
                first.remaining()
            );
        }
        Err(err) => eprintln!("{what}: refused as it should be: {err}"),
    }
}

// ---------------------------------------------------------------------------------------
// Attack 1: the rememberer loses its memory during the others' quarantine.
// ---------------------------------------------------------------------------------------

/// A holds on all three servers. Servers 1 and 2 restart without persistence: a fresh client
/// is refused (server 0's roster remembers their old markers), and its reading spreads the
/// news: 0's roster now names their new markers as replacements, while 1's and 2's rosters,
/// empty after the restart, record each other's new markers as *first seen* (not replaced).
/// Server 0 then restarts too (a rolling restart: the majority first, then the rest; here at
/// once, any time within the 60 s period does the same): its roster, the only memory of 1's
/// and 2's loss, is gone. A fresh client
/// now finds 0 replaced (1's and 2's rosters name its old marker) but 1 and 2 "first seen"
/// everywhere: they count, well inside their quarantine, and make a majority: A's lock was
/// forgotten by all three and is granted again while A still holds.
///
/// Not "every voter's memory lost at once": a client saw and quarantined the first loss; the
/// quarantine of 1 and 2 (60 s) is ended early by the loss of 0's roster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_rolling_restart_majority_then_rememberer() {
    let mut servers = Servers::start(3);
    let a = fresh(&servers)
        .try_acquire(&[RES], TTL)
        .await
        .expect("a brand-new voter set grants");
    rosters_current(&servers).await;

    servers.restart(1);
    servers.restart(2);
    let err = fresh(&servers)
        .try_acquire(&[RES], Duration::from_secs(5))
        .await
        .expect_err("nodes 1 and 2 forgot A's lock");
    assert_quarantined(&err, &[1, 2]);
    // The news reached every roster: 0's names 1's and 2's new markers (as replacements).
    rosters_current(&servers).await;
    for of in [1, 2] {
        let entry = servers
            .get(0, &roster_key_named(&name_of(&servers, of)))
            .expect("0's roster entry");
        assert!(entry.ends_with("|1"), "0 remembers {of}'s loss: {entry}");
    }

    // The rest of the rolling restart.
    servers.restart(0);
    dump_memory(&servers, "after 0's restart (before the fresh client)");
    assert!(
        !a.is_expired(),
        "A still holds (20 s TTL, well under a second in)"
    );
    let second = fresh(&servers)
        .try_acquire(&[RES], Duration::from_secs(5))
        .await;
    if let Err(err) = &second {
        // Nodes 1 and 2 must still be quarantined: their loss is seconds old.
        let seen = quarantined(err);
        assert!(
            seen.contains(&1) && seen.contains(&2),
            "1 and 2 still quarantined: {err}"
        );
    }
    assert_not_two_owners(&a, second, "majority restart, then the rememberer").await;
}

// ---------------------------------------------------------------------------------------
// Withstood: a survivor that refuses writes (maxmemory, noeviction) still shows its roster.
// ---------------------------------------------------------------------------------------

/// A holds on all three servers; the rosters remember every marker. Server 0 reaches its
/// `maxmemory` (noeviction, the policy lock servers should run): it refuses writes (the memory
/// script's roster writes among them: `OOM command not allowed`) but still answers reads and
/// holds A's key. Servers 1 and 2 restart without persistence; 0 is a little further away
/// (30 ms each way, and an `AUTH` round trip on connecting).
///
/// The attack: make a fresh client's reading of 0 carry the new markers of 1 and 2, so that
/// it has to write and fails, leaving 0 unread (and 1 and 2 `Unsettled`, counted once 0's
/// batch answered). It fails: a client's first reading of every server is built before any
/// reply (the markers it passes are all ""), so it only reads, and 0's roster is seen. Kept
/// as a regression test: the first contact must stay read-only (its later readings, which
/// write, do fail on 0, which then stays suspect for that client while it is full).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_survivor_at_maxmemory_still_shows_its_roster() {
    let mut servers = Servers::start(3);
    let proxy = Proxy::in_front_of(&servers.url(0), Mode::Pass).await;
    // A user with a password: connecting to 0 takes a round trip (AUTH), as a TCP handshake
    // does on a real network (the proxy accepts at once).
    let _: () = servers.cmd(
        0,
        &[
            "ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all",
        ],
    );
    let mut urls = servers.urls();
    urls[0] = proxy.url().replace("redis://", "redis://app:secret@");
    let a = client(&urls, PATIENT)
        .try_acquire(&[RES], TTL)
        .await
        .expect("a brand-new voter set grants");
    assert!(eventually(|| servers.holders(RES, a.token(), 0..3) == vec![0, 1, 2]).await);
    rosters_current_as(&servers, &urls).await;

    let _: () = servers.cmd(0, &["CONFIG", "SET", "maxmemory", "1"]);
    proxy.set(Mode::Delay(Duration::from_millis(30)));
    servers.restart(1);
    servers.restart(2);
    let second = client(&urls, PATIENT)
        .try_acquire(&[RES], Duration::from_secs(5))
        .await;
    assert_eq!(
        servers.holders(RES, a.token(), 0..3),
        vec![0],
        "A's key only on 0"
    );
    if let Err(err) = &second {
        eprintln!("refused: {err}");
    }
    assert_not_two_owners(&a, second, "a survivor at maxmemory").await;
}

// ---------------------------------------------------------------------------------------
// Regression tests: attacks the quarantine withstood.
// ---------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------
// Attack 5: a survivor within the node timeout, but not on a fresh client's first contact.
// ---------------------------------------------------------------------------------------

/// Server 0 is 30 ms away (15 ms each way), within the default 50 ms node timeout: a
/// connected client's batch there takes one round trip. A fresh client's first contact takes
/// four (the connection's `PING`, the memory reading, `COMMAND INFO` for plain commands, the
/// batch), and its memory reading arrives after two, 60 ms: 0 times out unread. Servers 1 and 2 restarted; their young markers are `Unsettled`, and
/// once 0 timed out every node has "answered": `Tally::settle` counts them. The stated limit
/// ("every survivor unreachable: down, or slower than the node timeout") thus covers every
/// survivor farther than a quarter of the node timeout, for the first attempt of every new
/// process — the clients the quarantine is for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_survivor_slower_than_the_node_timeout_only_on_first_contact() {
    let mut servers = Servers::start(3);
    let proxy = Proxy::in_front_of(&servers.url(0), Mode::Pass).await;
    let mut urls = servers.urls();
    urls[0] = proxy.url();
    let a = client(&urls, PATIENT)
        .try_acquire(&[RES], TTL)
        .await
        .expect("a brand-new voter set grants");
    rosters_current_as(&servers, &urls).await;
    proxy.set(Mode::Delay(Duration::from_millis(15)));

    // Default settings (50 ms node timeout): once connected, 0's vote arrives in time. With
    // node 1 held by another owner, a lock needs 0's grant.
    let default = |urls: &[String]| {
        Redlock::builder()
            .nodes(urls.to_vec())
            .build()
            .expect("valid config")
    };
    let connected = default(&urls);
    warm_up(&connected).await;
    let _: () = servers.cmd(1, &["SET", "probe", "other", "PX", "20000"]);
    let probe = connected
        .acquire(&["probe"], Duration::from_secs(5))
        .await
        .expect("0 answers a connected client within the default node timeout");
    probe.release().await.expect("release");

    servers.restart(1);
    servers.restart(2);
    let second = default(&urls).acquire(&[RES], Duration::from_secs(5)).await;
    assert_not_two_owners(&a, second, "a survivor slow only on first contact").await;
}
