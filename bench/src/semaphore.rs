//! The semaphore scenario (issue 28): 64 tasks share K = 8 permits, each holding one for
//! `HOLD` and giving it back, for a few seconds (`SEMA_S`, default 4). Beside it, the same
//! 64 tasks on 8 ordinary mutexes, task `i` always on mutex `i mod 8` (the work split up
//! front): the same capacity, but a waiter knows which lock to wait for and is told when it
//! is free, where a semaphore's waiter must find a free slot.
//!
//! Figures: permits granted per second against the ideal (K / HOLD), the wait p50/p99, the
//! most holders seen at one instant (by validity windows: at most K), and the ratios of the
//! semaphore to the split mutexes.

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

async fn run(redlock: &Redlock, side: Side, name: &str) -> Report {
    let until = Instant::now() + Duration::from_secs(seconds());
    let semaphore = redlock.semaphore(name, PERMITS).expect("semaphore");
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (redlock, semaphore) = (redlock.clone(), semaphore.clone());
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

/// Runs both sides on `urls`, the semaphore first, and prints them side by side.
pub async fn scenario(urls: &[String]) {
    let redlock = Redlock::builder()
        .nodes(urls.to_vec())
        // Waiters keep trying for the whole run, with the default delays.
        .backoff(redfence::Backoff::DEFAULT.retries(10_000))
        .build()
        .expect("config");
    let stamp = format!("{:?}", Instant::now()).replace(|c: char| !c.is_ascii_digit(), "");
    let semaphore = run(&redlock, Side::Semaphore, &format!("bench:sema:{stamp}")).await;
    let split = run(
        &redlock,
        Side::SplitMutexes,
        &format!("bench:split:{stamp}"),
    )
    .await;
    let secs = seconds() as f64;
    let ideal = f64::from(PERMITS) / HOLD.as_secs_f64();
    println!(
        "semaphore: {TASKS} tasks, K = {PERMITS}, hold {} ms, {} s each side; ideal {ideal:.0} grants/s",
        HOLD.as_millis(),
        seconds()
    );
    println!(
        "{:<28} {:>14} {:>14} {:>8}",
        "measure", "semaphore", "8 mutexes", "ratio"
    );
    let (a, b) = (
        semaphore.holds.len() as f64 / secs,
        split.holds.len() as f64 / secs,
    );
    println!("{:<28} {:>14.0} {:>14.0} {:>7.2}x", "grants/s", a, b, a / b);
    println!(
        "{:<28} {:>13.0}% {:>13.0}%",
        "of the ideal",
        100.0 * a / ideal,
        100.0 * b / ideal
    );
    let (sa, sb) = (stats(semaphore.waits.clone()), stats(split.waits.clone()));
    for (q, x, y) in [("wait p50", sa.p50, sb.p50), ("wait p99", sa.p99, sb.p99)] {
        println!(
            "{q:<28} {:>14} {:>14} {:>7.2}x",
            format!("{:.1} ms", x.as_secs_f64() * 1e3),
            format!("{:.1} ms", y.as_secs_f64() * 1e3),
            x.as_secs_f64() / y.as_secs_f64()
        );
    }
    println!(
        "{:<28} {:>14} {:>14}",
        "most holders at once",
        semaphore.most_at_once(),
        split.most_at_once()
    );
}
