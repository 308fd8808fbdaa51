//! A Sentinel voter is one server whose address the sentinels give: fair mode queues on its
//! master, a waiter hears a release there through the pub/sub hand-off, and on a master with
//! compare-and-delete (Valkey 9, Redis 8) a one-key lock is plain commands.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use redfence::{Backoff, Error, NodeAddr, Redlock, RedlockBuilder};

use crate::support::sentinel::{MASTER, SentinelGroup};
use crate::support::{self, DEADLINE, Launch, PATIENT, eventually, redis8, valkey9};

const TTL: Duration = Duration::from_secs(10);

/// A builder over the group's master alone, as a Sentinel voter.
fn builder(group: &SentinelGroup) -> RedlockBuilder {
    Redlock::builder()
        .node(NodeAddr::sentinel(group.urls(), MASTER))
        .node_timeout(PATIENT)
}

/// Fair mode is built over a Sentinel voter (it was refused) and serves the waiters of its
/// master in the order they started waiting: the first waiter gets the lock before the
/// second, whose queue place is on the master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mode_serves_a_sentinel_voters_waiters_in_order() {
    let group = SentinelGroup::start();
    let fair = || {
        builder(&group)
            .fair(true)
            .backoff(Backoff::fixed(Duration::from_millis(50), Duration::ZERO).retries(400))
            .build()
            .expect("fair mode over a Sentinel voter")
    };
    let held = fair().acquire(&["hot"], TTL).await.expect("holder");
    let queued = |n: i64| {
        let servers = &group.servers;
        move || servers.cmd::<i64>(0, &["ZCARD", "hot:redfence:queue"]) == n
    };
    let (tx, rx) = mpsc::channel();
    let mut waiters = Vec::new();
    for (n, name) in [(1, "first"), (2, "second")] {
        let (redlock, tx) = (fair(), tx.clone());
        waiters.push(tokio::spawn(async move {
            let lock = redlock.acquire(&["hot"], TTL).await.expect(name);
            tx.send(name).expect("send");
            // Held a moment, so that the other one is still waiting.
            tokio::time::sleep(Duration::from_millis(200)).await;
            lock.release().await.expect("release");
        }));
        assert!(
            eventually(queued(n)).await,
            "{name} waits in the master's queue"
        );
    }
    held.release().await.expect("release");
    for waiter in waiters {
        tokio::time::timeout(DEADLINE, waiter)
            .await
            .expect("served")
            .expect("task");
    }
    let order: Vec<&str> = rx.try_iter().collect();
    assert_eq!(order, ["first", "second"], "served in line");
}

/// A waiter (retry delay 20 s) hears the holder's release from the master the sentinels name,
/// through its release subscriber, and takes the lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_hears_a_release_on_the_sentinel_voters_master() {
    let group = SentinelGroup::start();
    let holder = builder(&group).retry_count(0).build().expect("config");
    let waiter = builder(&group)
        .retry_count(3)
        .retry_delay(Duration::from_secs(20))
        .retry_jitter(Duration::from_millis(1))
        .build()
        .expect("config");
    support::warm_up(&waiter).await;
    let held = holder.acquire(&["hot"], TTL).await.expect("holder");
    let waiting = tokio::spawn(async move {
        let lock = waiter.acquire(&["hot"], TTL).await;
        (lock, Instant::now())
    });
    let listening = || group.servers.release_subscribers(0, "hot") > 0;
    assert!(
        eventually(listening).await,
        "the waiter subscribed on the master"
    );
    let released = Instant::now();
    held.release().await.expect("release");
    let (lock, got) = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the waiter was not told (it would wait its 20 s retry delay)")
        .expect("task");
    let lock = lock.expect("the waiter's lock");
    assert!(
        got.duration_since(released) < Duration::from_secs(5),
        "told of the release: {:?}",
        got.duration_since(released)
    );
    lock.release().await.expect("release");
}

/// Every command server `port` runs from now on, as its arguments (a `MONITOR` connection
/// read on a thread; names and tokens here need no escapes).
fn monitor(port: u16) -> mpsc::Receiver<Vec<String>> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.write_all(b"MONITOR\r\n").expect("MONITOR");
    let mut reader = BufReader::new(stream);
    let mut ok = String::new();
    reader.read_line(&mut ok).expect("+OK");
    assert_eq!(ok.trim_end(), "+OK");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in reader.lines() {
            let Ok(line) = line else { return };
            let Some(start) = line.find("] ") else {
                continue;
            };
            let args = line[start + 2..]
                .split("\" \"")
                .map(|a| a.trim_matches('"').to_owned())
                .collect();
            if tx.send(args).is_err() {
                return;
            }
        }
    });
    rx
}

/// How a group's servers are started.
type Launcher = fn() -> Launch;

fn args(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

/// On a master with compare-and-delete, a one-key lock through a Sentinel voter is the plain
/// commands a server's is, byte for byte: `SET NX`, `SET IFEQ`, then `DELIFEQ` (Valkey 9) or
/// `DELEX … IFEQ` (Redis 8), with no script call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_key_lock_is_plain_commands_on_the_master() {
    for (name, launch) in [("Valkey 9", valkey9 as Launcher), ("Redis 8", redis8)] {
        let group = SentinelGroup::start_launched(launch);
        let redlock = builder(&group)
            .node_timeout(Duration::from_secs(5))
            .retry_count(0)
            .build()
            .expect("config");
        // The first plain release turns acquires to plain commands too.
        redlock
            .using(&["prime"], TTL, |_| async { Ok::<_, Error>(()) })
            .await
            .expect("prime");
        let commands = monitor(group.servers.port(0));
        let mut lock = redlock.acquire(&["invoice:7"], TTL).await.expect("acquire");
        let token = lock.token().to_owned();
        lock.extend(Duration::from_secs(20)).await.expect("extend");
        lock.release().await.expect("release");
        let deadline = Instant::now() + DEADLINE;
        let mut ours: Vec<Vec<String>> = Vec::new();
        let done = |ours: &[Vec<String>]| ours.last().is_some_and(|a| a[0] == "EXISTS");
        while !done(&ours) {
            let left = deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("{name}: the release never came: {ours:?}"));
            let Ok(args) = commands.recv_timeout(left) else {
                panic!("{name}: the release never came: {ours:?}");
            };
            if args.iter().any(|w| w.starts_with("invoice:7")) {
                ours.push(args);
            }
        }
        let release = match name {
            "Valkey 9" => args(&["DELIFEQ", "invoice:7", &token]),
            _ => args(&["DELEX", "invoice:7", "IFEQ", &token]),
        };
        assert_eq!(
            ours,
            vec![
                args(&["SET", "invoice:7", &token, "NX", "PX", "10000"]),
                args(&["SET", "invoice:7", &token, "IFEQ", &token, "PX", "20000"]),
                release,
                args(&["EXISTS", "invoice:7:redfence:waiting"]),
            ],
            "{name}: no script call, nothing else"
        );
    }
}
