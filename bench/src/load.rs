//! Load scenarios: a burst of concurrent acquisitions, the first call after idleness, the
//! client CPU of extension rounds, and many held `using()` locks (CPU and memory), each beside
//! its floor where one exists.

use super::*;

use std::sync::atomic::{AtomicUsize, Ordering};

static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/extend.lua")));

/// Resident memory, from `/proc/self/status`.
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

pub async fn scenarios(urls: &[String], redlock: &Redlock, floor: &Floor, ops: usize) {
    println!();
    println!("load: 5 local redis-server nodes");
    burst(urls, floor).await;
    idle(redlock, floor, ops).await;
    machine_idle(urls, ops).await;
    extension_cpu(redlock, floor).await;
    held_using(urls).await;
}

/// 10,000 concurrent acquisitions with default options, beside 10,000 concurrent floor calls.
async fn burst(urls: &[String], floor: &Floor) {
    const BURST: usize = 10_000;
    let redlock = Redlock::builder()
        .nodes(urls.to_vec())
        .build()
        .expect("config");
    lock_once(&redlock, "bench:burst:warm").await.expect("warm");
    let unreachable = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..BURST)
        .map(|i| {
            let redlock = redlock.clone();
            let unreachable = Arc::clone(&unreachable);
            tokio::spawn(async move {
                match redlock.acquire(&[format!("bench:burst:{i}")], TTL).await {
                    Ok(lock) => Some(lock),
                    Err(redfence::Error::QuorumUnreachable { .. }) => {
                        unreachable.fetch_add(1, Ordering::Relaxed);
                        None
                    }
                    Err(_) => None,
                }
            })
        })
        .collect();
    let locks: Vec<_> = join_all(tasks)
        .await
        .into_iter()
        .filter_map(|r| r.ok().flatten())
        .collect();
    let ours = started.elapsed();
    let granted = locks.len();
    join_all(locks.into_iter().map(|l| l.release())).await;

    let started = Instant::now();
    let tasks: Vec<_> = (0..BURST)
        .map(|i| {
            let floor = floor.clone();
            tokio::spawn(async move {
                floor
                    .acquire_release(&format!("bench:burst:floor:{i}"), "floor-token")
                    .await
                    .is_ok()
            })
        })
        .collect();
    let floor_ok = join_all(tasks)
        .await
        .into_iter()
        .filter(|r| matches!(r, Ok(true)))
        .count();
    let theirs = started.elapsed();
    println!(
        "{:<34} {:>14} {:>14}",
        "burst of 10,000: granted",
        format!("{granted}"),
        format!("{floor_ok}")
    );
    println!(
        "{:<34} {:>14} {:>14}",
        "burst: QuorumUnreachable",
        format!("{}", unreachable.load(Ordering::Relaxed)),
        "-"
    );
    println!(
        "{:<34} {:>14} {:>14} {:>7.2}x",
        "burst: time to all (ms)",
        format!("{:.0}", ours.as_secs_f64() * 1e3),
        format!("{:.0} (a+r)", theirs.as_secs_f64() * 1e3),
        ours.as_secs_f64() / theirs.as_secs_f64()
    );
}

/// Acquire+release after 100 ms of idleness, beside back-to-back calls, and the floor's.
async fn idle(redlock: &Redlock, floor: &Floor, ops: usize) {
    let n = (ops / 25).clamp(40, 200);
    let mut back_to_back = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        lock_once(redlock, &format!("bench:b2b:{i}"))
            .await
            .expect("b2b");
        back_to_back.push(t.elapsed());
    }
    let mut after_idle = Vec::new();
    for i in 0..n {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t = Instant::now();
        lock_once(redlock, &format!("bench:idle:{i}"))
            .await
            .expect("idle");
        after_idle.push(t.elapsed());
    }
    let mut floor_idle = Vec::new();
    for i in 0..n {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t = Instant::now();
        floor
            .acquire_release(&format!("bench:idle:floor:{i}"), "floor-token")
            .await
            .expect("floor");
        floor_idle.push(t.elapsed());
    }
    let (b, a, f) = (stats(back_to_back), stats(after_idle), stats(floor_idle));
    println!(
        "{:<34} {:>14} {:>14} {:>7.2}x",
        "after 100 ms idle: p50 vs b2b",
        micros(a.p50),
        micros(b.p50),
        a.p50.as_secs_f64() / b.p50.as_secs_f64()
    );
    println!(
        "{:<34} {:>14} {:>14} {:>7.2}x",
        "after 100 ms idle: p50 vs floor's",
        micros(a.p50),
        micros(f.p50),
        a.p50.as_secs_f64() / f.p50.as_secs_f64()
    );
}

/// What idleness costs on this machine without any client library: `PING` to every node (all
/// sent, then all read) over plain blocking sockets from one thread, back-to-back and after
/// 100 ms idle; once, and twice in a row (the shape of an acquire+release: two rounds). The
/// two-round ratio is what an acquire+release can hope for on this machine.
async fn machine_idle(urls: &[String], ops: usize) {
    let n = (ops / 25).clamp(40, 200);
    let addrs: Vec<String> = urls.iter().map(|u| host_port(u)).collect();
    let rows = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut socks: Vec<std::net::TcpStream> = addrs
            .iter()
            .map(|addr| {
                let s = std::net::TcpStream::connect(addr).expect("connect for PING");
                s.set_nodelay(true).expect("nodelay");
                s
            })
            .collect();
        let mut rounds = |count: usize| {
            let t = Instant::now();
            for _ in 0..count {
                for s in &mut socks {
                    s.write_all(b"PING\r\n").expect("PING");
                }
                for s in &mut socks {
                    let mut reply = [0u8; 7];
                    s.read_exact(&mut reply).expect("+PONG");
                }
            }
            t.elapsed()
        };
        [1, 2].map(|count| {
            let back_to_back: Vec<Duration> = (0..n).map(|_| rounds(count)).collect();
            let after_idle: Vec<Duration> = (0..n)
                .map(|_| {
                    std::thread::sleep(Duration::from_millis(100));
                    rounds(count)
                })
                .collect();
            (count, stats(back_to_back), stats(after_idle))
        })
    })
    .await
    .expect("PING rounds");
    for (count, b, a) in rows {
        println!(
            "{:<34} {:>14} {:>14} {:>7.2}x",
            format!("machine alone: {count}x PING x5 idle/b2b"),
            micros(a.p50),
            micros(b.p50),
            a.p50.as_secs_f64() / b.p50.as_secs_f64()
        );
    }
}

/// Client CPU per extension of a held lock: 1,000 locks extended 20 times, all at once per
/// round, beside the same extend script sent straight to every node.
async fn extension_cpu(redlock: &Redlock, floor: &Floor) {
    const LOCKS: usize = 1_000;
    const ROUNDS: usize = 20;
    let mut locks = Vec::with_capacity(LOCKS);
    for i in 0..LOCKS {
        locks.push(
            redlock
                .acquire(&[format!("bench:ext:{i}")], TTL)
                .await
                .expect("acquire"),
        );
    }
    let before = cpu::own();
    for _ in 0..ROUNDS {
        join_all(locks.iter_mut().map(|l| l.extend(TTL))).await;
    }
    let ours = cpu::own().saturating_sub(before);
    let tokens: Vec<String> = locks.iter().map(|l| l.token().to_owned()).collect();
    let before = cpu::own();
    let ttl_ms = TTL.as_millis() as u64;
    for _ in 0..ROUNDS {
        join_all((0..LOCKS).map(|i| {
            let resource = format!("bench:ext:{i}");
            let token = tokens[i].clone();
            let conns = floor.conns.clone();
            async move {
                join_all(conns.into_iter().map(|mut c| {
                    let (resource, token) = (resource.clone(), token.clone());
                    async move {
                        EXTEND
                            .key(resource)
                            .arg(token)
                            .arg(ttl_ms)
                            .invoke_async::<i64>(&mut c)
                            .await
                    }
                }))
                .await
            }
        }))
        .await;
    }
    let theirs = cpu::own().saturating_sub(before);
    join_all(locks.into_iter().map(|l| l.release())).await;
    let per = |d: Duration| d.as_secs_f64() * 1e6 / (LOCKS * ROUNDS) as f64;
    println!(
        "{:<34} {:>14} {:>14} {:>7.2}x",
        "client CPU per extension (µs)",
        format!("{:.1}", per(ours)),
        format!("{:.1}", per(theirs)),
        per(ours) / per(theirs).max(f64::MIN_POSITIVE)
    );
}

/// 10,000 `using()` scopes held at TTL 4 s, started gradually: client CPU while they are held,
/// and resident memory per held lock.
pub async fn held_using(urls: &[String]) {
    const HELD: usize = 10_000;
    const WINDOW: Duration = Duration::from_secs(8);
    let redlock = Redlock::builder()
        .nodes(urls.to_vec())
        .build()
        .expect("config");
    lock_once(&redlock, "bench:held:warm").await.expect("warm");
    let rss_before = resident_bytes();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let held = Arc::new(AtomicUsize::new(0));
    let mut scopes = Vec::with_capacity(HELD);
    for i in 0..HELD {
        let redlock = redlock.clone();
        let mut stop = stop_rx.clone();
        let held = Arc::clone(&held);
        scopes.push(tokio::spawn(async move {
            redlock
                .using(
                    &[format!("bench:held:{i}")],
                    Duration::from_secs(4),
                    |_signal| async move {
                        held.fetch_add(1, Ordering::Relaxed);
                        let _ = stop.wait_for(|s| *s).await;
                        Ok::<_, redfence::Error>(())
                    },
                )
                .await
        }));
        if i % 500 == 499 {
            // Started gradually: 500 every 100 ms, so that extensions spread out.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    while held.load(Ordering::Relaxed) < HELD {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rss_held = resident_bytes();
    let before = cpu::own();
    let started = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let core = cpu::own().saturating_sub(before).as_secs_f64() / started.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    let ok = join_all(scopes)
        .await
        .into_iter()
        .filter(|r| matches!(r, Ok(Ok(()))))
        .count();
    println!(
        "{:<34} {:>14} {:>14}",
        "10,000 held using(): % of a core",
        format!("{:.1} %", core * 100.0),
        "target <= 5 %"
    );
    println!(
        "{:<34} {:>14} {:>14}",
        "held using(): memory per lock",
        format!(
            "{:.2} KiB",
            rss_held.saturating_sub(rss_before) as f64 / HELD as f64 / 1024.0
        ),
        "target <= 1 KiB"
    );
    println!(
        "{:<34} {:>14} {:>14}",
        "held using(): scopes kept to the end",
        format!("{ok}"),
        format!("of {HELD}")
    );
}
