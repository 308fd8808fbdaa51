//! An adversarial review of the restart quarantine by memory (`src/memory.rs`,
//! `src/node/identity.rs`, `src/node/server_link.rs`): attacks that try to make two valid
//! owners (or more than K semaphore holders) with the default quarantine, on real servers.
//! A failing test is a bug found; a passing one is an attack the quarantine withstood, kept
//! as a regression test.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redfence::{Error, Lock, Redlock};
use support::proxy::{Mode, Proxy};
use support::restarted::quarantined;
use support::{PATIENT, Servers, eventually, warm_up};

const RES: &str = "ledger:review";
const TTL: Duration = Duration::from_secs(20);

/// A client with the default quarantine over `urls`, one attempt per acquisition, node calls
/// bounded by `node_timeout`.
fn client(urls: &[String], node_timeout: Duration) -> Redlock {
    Redlock::builder()
        .nodes(urls.to_vec())
        .retry_count(0)
        .node_timeout(node_timeout)
        .build()
        .expect("valid config")
}

/// A fresh client (a new process) with the default quarantine, over every test server.
fn fresh(servers: &Servers) -> Redlock {
    client(&servers.urls(), PATIENT)
}

/// The roster key in which the server named `name` (as clients name it) is remembered.
fn roster_key_named(name: &str) -> String {
    format!("redfence:roster:{name}")
}

/// Server `i`'s name as clients name it when they use its own URL.
fn name_of(servers: &Servers, i: usize) -> String {
    format!("127.0.0.1:{}/0", servers.port(i))
}

/// The marker id on server `i`.
fn marker_id(servers: &Servers, i: usize) -> Option<String> {
    let marker = servers.get(i, "redfence:memory")?;
    Some(marker.rsplit_once('|')?.0.to_owned())
}

/// Whether server `on`'s roster entry for the server named `of_name` (marker on `of`) names
/// `of`'s current marker.
fn roster_current(servers: &Servers, on: usize, of: usize, of_name: &str) -> bool {
    let (Some(entry), Some(id)) = (
        servers.get(on, &roster_key_named(of_name)),
        marker_id(servers, of),
    ) else {
        return false;
    };
    entry.starts_with(&format!("{id}|"))
}

/// Every server's name as clients name it through `urls`.
fn names_of(urls: &[String]) -> Vec<String> {
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
async fn rosters_current_as(servers: &Servers, urls: &[String]) {
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
async fn rosters_current(servers: &Servers) {
    rosters_current_as(servers, &servers.urls()).await;
}

/// Prints every server's marker and roster.
fn dump_memory(servers: &Servers, when: &str) {
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
fn assert_quarantined(err: &Error, nodes: &[usize]) {
    let mut seen = quarantined(err);
    seen.sort_unstable();
    assert_eq!(seen, nodes, "{err}");
}

/// The safety property: `second` (another client's attempt) must not be granted while
/// `first` is still valid.
async fn assert_not_two_owners(first: &Lock, second: Result<Lock, Error>, what: &str) {
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
// Attack 2: a plain acquire run again in the script after the batch's marker was read.
// ---------------------------------------------------------------------------------------

/// Watches server `i` (MONITOR, on its own connection) and runs `FLUSHALL` there at once when
/// one client (not a script) has sent, in order, a command containing every piece of each of
/// `steps`; `done` is set then. Prints what that client sends next, for the record.
fn flush_after(servers: &Servers, i: usize, steps: Vec<Vec<String>>, done: Arc<AtomicBool>) {
    let port = servers.port(i);
    let mut flusher = servers.conn(i);
    let mut monitor = TcpStream::connect(("127.0.0.1", port)).expect("monitor connection");
    monitor.write_all(b"MONITOR\r\n").expect("MONITOR");
    let mut lines = BufReader::new(monitor.try_clone().expect("clone"));
    let mut ok = String::new();
    lines.read_line(&mut ok).expect("MONITOR's +OK");
    assert!(ok.starts_with("+OK"), "MONITOR: {ok}");
    std::thread::spawn(move || {
        let mut client: Option<String> = None;
        let mut step = 0;
        let mut line = String::new();
        loop {
            line.clear();
            if lines.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line.contains(" lua]") {
                continue;
            }
            // "+1700000000.123456 [0 127.0.0.1:54321] "SET" ..."
            let from = line
                .split_once('[')
                .and_then(|(_, rest)| rest.split_once(']'))
                .map(|(inside, _)| inside.to_owned());
            if step > 0 && from != client {
                continue;
            }
            if steps[step]
                .iter()
                .all(|piece| line.contains(piece.as_str()))
            {
                client = from;
                step += 1;
                if step == steps.len() {
                    break;
                }
            }
        }
        let _: () = redis::cmd("FLUSHALL")
            .query(&mut flusher)
            .expect("FLUSHALL");
        done.store(true, Ordering::SeqCst);
        for _ in 0..6 {
            line.clear();
            if lines.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            if !line.contains("\"FLUSHALL\"") {
                eprint!("server {i} after the flush: {line}");
            }
            if line.contains("\"EVALSHA\"") && !line.contains(" lua]") {
                break;
            }
        }
        drop(monitor);
    });
}

/// The steps of a one-key plain acquire of `RES` and the batch's marker read after it.
fn plain_acquire_then_marker_read() -> Vec<Vec<String>> {
    plain_acquire_of_then_marker_read(RES)
}

/// The steps of a one-key plain acquire of a key starting with `key` and the batch's marker
/// read after it.
fn plain_acquire_of_then_marker_read(key: &str) -> Vec<Vec<String>> {
    vec![
        vec![format!("\"SET\" \"{key}"), "\"NX\"".to_owned()],
        vec!["\"GET\" \"redfence:memory\"".to_owned()],
    ]
}

/// The step of a memory reading (the identity check's script call).
fn memory_reading() -> Vec<Vec<String>> {
    vec![vec![
        "\"EVALSHA\"".to_owned(),
        "\"redfence:memory\"".to_owned(),
    ]]
}

/// Valkey 9, plain commands (the default): a connected client's one-key acquire is `SET … NX`
/// then the marker's `GET`, pipelined; a `SET` that finds the key taken runs again in the
/// batch script, in a round trip of its own, and that call reads no marker. A `FLUSHALL` of
/// a majority after the pipeline and before that call (one round trip: here 16 ms through a
/// proxy; on a real network a millisecond, which a flush of a busy set, where many refused
/// acquires are in flight, hits) empties A's keys: the script grants, and the grant counts,
/// since the marker read before the flush matched. Two valid owners, every setting default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_plain_acquire_run_again_after_the_marker_read() {
    plain_acquire_run_again(Servers::start_launched(3, &[], |_| support::valkey9())).await;
}

/// The same on Redis 8.6 (`DELEX … IFEQ`): plain commands too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_plain_acquire_run_again_after_the_marker_read_redis8() {
    plain_acquire_run_again(Servers::start_launched(3, &[], |_| support::redis8())).await;
}

async fn plain_acquire_run_again(servers: Servers) {
    let proxies = Proxy::in_front_of_each(&servers.urls(), Mode::Pass).await;
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    // C: default settings, every one of them (50 ms node timeout).
    let c = Redlock::builder()
        .nodes(urls.clone())
        .build()
        .expect("valid config");
    // Connected, scripts loaded, a release done (acquires go plain from then on).
    warm_up(&c).await;
    let a = client(&urls, PATIENT)
        .try_acquire(&[RES], TTL)
        .await
        .expect("A");
    assert!(eventually(|| servers.holders(RES, a.token(), 0..3) == vec![0, 1, 2]).await);

    let flushed = [
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    ];
    for (i, done) in [1, 2].into_iter().zip(&flushed) {
        flush_after(
            &servers,
            i,
            plain_acquire_then_marker_read(),
            Arc::clone(done),
        );
        // 16 ms a round trip: the pipeline and the script call fit the 50 ms node timeout.
        proxies[i].set(Mode::Delay(Duration::from_millis(8)));
    }
    // Not a second since C's last reading: no identity check in this batch's way (it would
    // not matter: the check comes before the pipeline).
    let second = c.try_acquire(&[RES], Duration::from_secs(5)).await;
    assert!(
        flushed.iter().all(|f| f.load(Ordering::SeqCst)),
        "the flushes landed between the pipeline and the script call"
    );
    assert!(
        servers.get(0, RES).as_deref() == Some(a.token()),
        "A still holds on node 0"
    );
    assert_not_two_owners(&a, second, "flush between the marker read and the script").await;
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
// Attack 4: the same lock key under another key prefix is another memory.
// ---------------------------------------------------------------------------------------

/// A locks `job` with `key_prefix("app:")`: the key `app:job`, the memory `app:redfence:*`.
/// Servers 1 and 2 restart. A client of A's prefix is refused; a client that names the same
/// key as `app:job` with the default (empty) prefix reads another memory, `redfence:*`, which
/// no client ever wrote: a brand-new voter set to it, which grants at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_same_key_under_another_prefix() {
    let mut servers = Servers::start(3);
    let urls = servers.urls();
    let prefixed = || {
        Redlock::builder()
            .nodes(urls.clone())
            .key_prefix("app:")
            .retry_count(0)
            .node_timeout(PATIENT)
            .build()
            .expect("valid config")
    };
    let a = prefixed().try_acquire(&["job"], TTL).await.expect("A");
    let names = names_of(&servers.urls());
    let written = eventually(|| {
        (0..3).all(|on| {
            (0..3).filter(|&of| of != on).all(|of| {
                servers
                    .get(on, &format!("app:{}", roster_key_named(&names[of])))
                    .is_some()
            })
        })
    });
    assert!(written.await, "A's rosters");
    servers.restart(1);
    servers.restart(2);
    let err = prefixed()
        .try_acquire(&["job"], Duration::from_secs(5))
        .await
        .expect_err("A's prefix: 1 and 2 quarantined");
    assert_quarantined(&err, &[1, 2]);
    let second = fresh(&servers)
        .try_acquire(&["app:job"], Duration::from_secs(5))
        .await;
    assert_not_two_owners(&a, second, "the same key under another prefix").await;
}

// ---------------------------------------------------------------------------------------
// Regression tests: attacks the quarantine withstood.
// ---------------------------------------------------------------------------------------

/// A fresh client reads every server's memory (markers intact, rosters agree: they count),
/// then servers 1 and 2 are flushed before its batch reaches them (60 ms each way through a
/// proxy). The batch's marker read (in the script) finds the markers gone: their grants do
/// not count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_flush_between_a_fresh_clients_first_reading_and_its_batch() {
    let servers = Servers::start(3);
    let proxies = Proxy::in_front_of_each(&servers.urls(), Mode::Pass).await;
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let a = client(&urls, PATIENT)
        .try_acquire(&[RES], TTL)
        .await
        .expect("A");
    rosters_current_as(&servers, &urls).await;
    let flushed = [
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    ];
    for (i, done) in [1, 2].into_iter().zip(&flushed) {
        flush_after(&servers, i, memory_reading(), Arc::clone(done));
        proxies[i].set(Mode::Delay(Duration::from_millis(60)));
    }
    let second = client(&urls, Duration::from_secs(2))
        .try_acquire(&[RES], Duration::from_secs(5))
        .await;
    assert!(
        flushed.iter().all(|f| f.load(Ordering::SeqCst)),
        "the flushes landed after the readings"
    );
    if let Err(err) = &second {
        assert_quarantined(err, &[1, 2]);
    }
    assert_not_two_owners(&a, second, "flush between the first reading and the batch").await;
}

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

/// Attack 2 on a semaphore (Valkey 9, the default quarantine): K = 2 permits held by A; a connected
/// client's try of a slot is a plain `SET … NX`, taken, run again in the script after a flush
/// of servers 1 and 2: a third holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_semaphore_slot_run_again_after_the_marker_read() {
    let servers = Servers::start_launched(3, &[], |_| support::valkey9());
    let proxies = Proxy::in_front_of_each(&servers.urls(), Mode::Pass).await;
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    // A generous node timeout: a semaphore's try also claims its size, more round trips
    // than the 50 ms default allows through the proxy's delay (the mutex tests above use
    // the defaults).
    let c = client(&urls, Duration::from_secs(2));
    warm_up(&c).await;
    let a = client(&urls, PATIENT);
    let sem_a = a.semaphore("pool", 2).expect("semaphore");
    let first = sem_a.try_acquire(TTL).await.expect("permit 1");
    let second = sem_a.try_acquire(TTL).await.expect("permit 2");

    let flushed = [
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    ];
    for (i, done) in [1, 2].into_iter().zip(&flushed) {
        let steps = plain_acquire_of_then_marker_read("pool:semaphore:slot:");
        flush_after(&servers, i, steps, Arc::clone(done));
        proxies[i].set(Mode::Delay(Duration::from_millis(60)));
    }
    let sem_c = c.semaphore("pool", 2).expect("semaphore");
    let third = sem_c.try_acquire(Duration::from_secs(5)).await;
    assert!(flushed.iter().all(|f| f.load(Ordering::SeqCst)), "flushed");
    if let Ok(third) = &third {
        let holders = [
            !first.is_expired(),
            !second.is_expired(),
            !third.is_expired(),
        ];
        assert!(
            holders.iter().filter(|&&h| h).count() <= 2,
            "THREE HOLDERS of a 2-permit semaphore: slots {}, {} and {}",
            first.slot(),
            second.slot(),
            third.slot()
        );
    }
}
