//! Attacks through plain commands (Valkey 9, Redis 8.6): an acquire refused by its plain
//! `SET … NX` runs again in the script after the pipeline; a flush of a majority timed between
//! the pipeline's marker read and that call let its grant count (fixed: the call reads the
//! marker too). The flush is timed by watching the server's `MONITOR`.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redfence::Redlock;

use super::review::{
    RES, TTL, assert_not_two_owners, assert_quarantined, client, rosters_current_as,
};
use crate::support::proxy::{Mode, Proxy};
use crate::support::{self, PATIENT, Servers, eventually, warm_up};

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
