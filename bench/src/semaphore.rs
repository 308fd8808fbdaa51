//! The semaphore scenario (issue 28): 64 tasks share K = 8 permits, each holding one for
//! `HOLD` and giving it back, for a few seconds (`SEMA_S`, default 4). Beside it, the same
//! 64 tasks on 8 ordinary mutexes, task `i` always on mutex `i mod 8` (the work split up
//! front): the same capacity, but a waiter knows which lock to wait for and is told when it
//! is free, where a semaphore's waiter must find a free slot.
//!
//! The semaphore runs three times: its tasks on one client, spread over four clients (as four
//! processes, whose waiters do not take turns with each other's), and over four clients in fair
//! mode (the waiters of all four take turns through the semaphore's line).
//!
//! Figures: permits granted per second against the ideal (K / HOLD), the wait p50/p99/max, the
//! most holders seen at one instant (by validity windows: at most K), and each side's ratio to
//! the split mutexes; then one permit's uncontended acquire + release against a mutex's.

use super::*;

const TASKS: usize = 64;
const PERMITS: u32 = 8;
const HOLD: Duration = Duration::from_millis(5);
const LEASE: Duration = Duration::from_secs(5);

fn seconds() -> u64 {
    std::env::var("SEMA_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
}

/// What one side's tasks saw.
#[derive(Default)]
struct Report {
    /// Each acquisition's wait.
    waits: Vec<Duration>,
    /// Each hold as (granted, released), on this process's clock.
    holds: Vec<(Instant, Instant)>,
}

impl Report {
    /// The most holds that overlap at one instant.
    fn most_at_once(&self) -> usize {
        let mut edges: Vec<(Instant, i32)> = Vec::with_capacity(self.holds.len() * 2);
        for (start, end) in &self.holds {
            edges.push((*start, 1));
            edges.push((*end, -1));
        }
        // At equal instants, ends first: a hand-off is not an overlap.
        edges.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        let (mut now, mut most) = (0_i32, 0_i32);
        for (_, step) in edges {
            now += step;
            most = most.max(now);
        }
        most as usize
    }
}

/// Which lock a task takes: a permit of one semaphore, or its own share of split mutexes.
#[derive(Clone, Copy)]
enum Side {
    Semaphore,
    SplitMutexes,
}

/// Runs `side` for the scenario's seconds, task `i` on client `i mod clients.len()`.
async fn run(clients: &[Redlock], side: Side, name: &str) -> Report {
    let until = Instant::now() + Duration::from_secs(seconds());
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let redlock = clients[task % clients.len()].clone();
            let semaphore = redlock.semaphore(name, PERMITS).expect("semaphore");
            let mutex = format!("{name}:mutex:{}", task % PERMITS as usize);
            tokio::spawn(async move {
                let mut report = Report::default();
                while Instant::now() < until {
                    let asked = Instant::now();
                    // The hold counts from the grant to the release's start: the lock is
                    // ours in between (the release's reply comes later).
                    let release = match side {
                        Side::Semaphore => match semaphore.acquire(LEASE).await {
                            Ok(permit) => {
                                let granted = Instant::now();
                                tokio::time::sleep(HOLD).await;
                                let end = Instant::now();
                                let _ = permit.release().await;
                                (granted, end)
                            }
                            Err(_) => continue,
                        },
                        Side::SplitMutexes => match redlock.acquire(&[&mutex], LEASE).await {
                            Ok(lock) => {
                                let granted = Instant::now();
                                tokio::time::sleep(HOLD).await;
                                let end = Instant::now();
                                let _ = lock.release().await;
                                (granted, end)
                            }
                            Err(_) => continue,
                        },
                    };
                    report.waits.push(release.0 - asked);
                    report.holds.push(release);
                }
                report
            })
        })
        .collect();
    let mut all = Report::default();
    for task in tasks {
        let report = task.await.expect("semaphore bench task");
        all.waits.extend(report.waits);
        all.holds.extend(report.holds);
    }
    all
}

/// A client for the scenario: waiters keep trying for the whole run, with the default delays.
fn client(urls: &[String], fair: bool) -> Redlock {
    Redlock::builder()
        .nodes(urls.to_vec())
        .fair(fair)
        .backoff(redfence::Backoff::DEFAULT.retries(10_000))
        .build()
        .expect("config")
}

/// Uncontended, one at a time: a permit's acquire + release against a mutex's, on one
/// client, in alternating blocks of 50 (so that a machine whose speed drifts weighs on both).
async fn uncontended(redlock: &Redlock, name: &str) -> (Stats, Stats) {
    let semaphore = redlock.semaphore(name, PERMITS).expect("semaphore");
    let mutex = format!("{name}:mutex");
    let (mut permits, mut mutexes) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        for _ in 0..50 {
            let start = Instant::now();
            let permit = semaphore.acquire(LEASE).await.expect("permit");
            permit.release().await.expect("release");
            permits.push(start.elapsed());
        }
        for _ in 0..50 {
            let start = Instant::now();
            let lock = redlock.acquire(&[&mutex], LEASE).await.expect("mutex");
            lock.release().await.expect("release");
            mutexes.push(start.elapsed());
        }
    }
    (stats(permits), stats(mutexes))
}

/// Runs every side on `urls`, the semaphore's first, and prints them side by side.
pub async fn scenario(urls: &[String]) {
    let one = [client(urls, false)];
    let four: Vec<Redlock> = (0..4).map(|_| client(urls, false)).collect();
    let fair: Vec<Redlock> = (0..4).map(|_| client(urls, true)).collect();
    let stamp = format!("{:?}", Instant::now()).replace(|c: char| !c.is_ascii_digit(), "");
    let sides = [
        (
            "1 client",
            run(&one, Side::Semaphore, &format!("bench:sema:{stamp}")).await,
        ),
        (
            "4 clients",
            run(&four, Side::Semaphore, &format!("bench:sema4:{stamp}")).await,
        ),
        (
            "4 fair",
            run(&fair, Side::Semaphore, &format!("bench:semaf:{stamp}")).await,
        ),
    ];
    let split = run(&one, Side::SplitMutexes, &format!("bench:split:{stamp}")).await;
    let secs = seconds() as f64;
    let ideal = f64::from(PERMITS) / HOLD.as_secs_f64();
    println!(
        "semaphore: {TASKS} tasks, K = {PERMITS}, hold {} ms, {} s each side; ideal {ideal:.0} grants/s",
        HOLD.as_millis(),
        seconds()
    );
    println!("each semaphore side's figure, then its ratio to 8 split mutexes (1 client):");
    print!("{:<22}", "measure");
    for (label, _) in &sides {
        print!(" {label:>20}");
    }
    println!(" {:>12}", "8 mutexes");
    let rate = |r: &Report| r.holds.len() as f64 / secs;
    print!("{:<22}", "grants/s");
    for (_, report) in &sides {
        let cell = format!("{:.0} ({:.2}x)", rate(report), rate(report) / rate(&split));
        print!(" {cell:>20}");
    }
    println!(" {:>12.0}", rate(&split));
    print!("{:<22}", "of the ideal");
    for (_, report) in &sides {
        print!(" {:>19.0}%", 100.0 * rate(report) / ideal);
    }
    println!(" {:>11.0}%", 100.0 * rate(&split) / ideal);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    // Each side's wait p50, p99 and max.
    let waits = |r: &Report| {
        let quantiles = stats(r.waits.clone());
        let max = r.waits.iter().copied().max().unwrap_or_default();
        [quantiles.p50, quantiles.p99, max]
    };
    for (row, q) in ["wait p50", "wait p99", "wait max"].into_iter().enumerate() {
        print!("{q:<22}");
        let base = ms(waits(&split)[row]);
        for (_, report) in &sides {
            let wait = ms(waits(report)[row]);
            let cell = format!("{wait:.1} ms ({:.2}x)", wait / base);
            print!(" {cell:>20}");
        }
        println!(" {:>12}", format!("{base:.1} ms"));
    }
    print!("{:<22}", "most holders at once");
    for (_, report) in &sides {
        print!(" {:>20}", report.most_at_once());
    }
    println!(" {:>12}", split.most_at_once());
    let (permit, mutex) = uncontended(&one[0], &format!("bench:semau:{stamp}")).await;
    for (q, a, b) in [
        ("p50", permit.p50, mutex.p50),
        ("p99", permit.p99, mutex.p99),
    ] {
        println!(
            "uncontended acquire+release {q}: permit {} vs mutex {} ({:.2}x)",
            micros(a),
            micros(b),
            a.as_secs_f64() / b.as_secs_f64()
        );
    }
}
