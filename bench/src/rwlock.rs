//! The read-write lock scenario (issue 28): 64 tasks on one name for a few seconds (`RW_S`,
//! default 4), 95 % of holds reads and 5 % writes, each held `HOLD`; beside it, the same tasks
//! on one mutex (every hold exclusive), the design a read-write lock replaces.
//!
//! Figures: holds per second, the wait p50/p99 of reads and of writes, and the ratios of the
//! read-write lock to the mutex; the most readers seen at once, and whether a writer ever
//! overlapped another hold (by hold windows: it must not).

use super::*;

const TASKS: usize = 64;
const HOLD: Duration = Duration::from_millis(2);
const LEASE: Duration = Duration::from_secs(5);
/// One hold in this many is a write.
const WRITE_EVERY: u32 = 20;

fn seconds() -> u64 {
    std::env::var("RW_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
}

/// What one side's tasks saw: per hold, whether it wrote, its wait and its window.
#[derive(Default)]
struct Report {
    holds: Vec<(bool, Duration, Instant, Instant)>,
}

impl Report {
    fn waits(&self, write: bool) -> Vec<Duration> {
        self.holds
            .iter()
            .filter(|h| h.0 == write)
            .map(|h| h.1)
            .collect()
    }

    /// The most reads held at one instant, and whether a write overlapped any other hold.
    fn overlaps(&self) -> (usize, bool) {
        let mut edges: Vec<(Instant, i32)> = Vec::new();
        for h in self.holds.iter().filter(|h| !h.0) {
            edges.push((h.2, 1));
            edges.push((h.3, -1));
        }
        // At equal instants, ends first.
        edges.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        let (mut now, mut most) = (0_i32, 0_i32);
        for (_, step) in edges {
            now += step;
            most = most.max(now);
        }
        let writer_overlap = self.holds.iter().enumerate().any(|(i, a)| {
            a.0 && self
                .holds
                .iter()
                .enumerate()
                .any(|(j, b)| j != i && b.2 < a.3 && a.2 < b.3)
        });
        (most as usize, writer_overlap)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    ReadWrite,
    Mutex,
}

async fn run(redlock: &Redlock, side: Side, name: &str) -> Report {
    let until = Instant::now() + Duration::from_secs(seconds());
    let rwlock = redlock.rwlock(name).expect("rwlock");
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (redlock, rwlock, name) = (redlock.clone(), rwlock.clone(), name.to_owned());
            tokio::spawn(async move {
                let mut report = Report::default();
                let mut n: u32 = task as u32;
                while Instant::now() < until {
                    n = n.wrapping_add(1);
                    let write = n.is_multiple_of(WRITE_EVERY);
                    let asked = Instant::now();
                    let window = match (side, write) {
                        (Side::Mutex, _) => match redlock.acquire(&[&name], LEASE).await {
                            Ok(lock) => hold(asked, lock.release()).await,
                            Err(_) => continue,
                        },
                        (Side::ReadWrite, false) => match rwlock.acquire_read(LEASE).await {
                            Ok(read) => hold(asked, read.release()).await,
                            Err(_) => continue,
                        },
                        (Side::ReadWrite, true) => match rwlock.acquire_write(LEASE).await {
                            Ok(write) => hold(asked, write.release()).await,
                            Err(_) => continue,
                        },
                    };
                    report.holds.push((write, window.0, window.1, window.2));
                }
                report
            })
        })
        .collect();
    let mut all = Report::default();
    for task in tasks {
        all.holds
            .extend(task.await.expect("rwlock bench task").holds);
    }
    all
}

/// Holds for `HOLD` from now, then releases: (the wait since `asked`, the hold's window).
async fn hold<F: std::future::Future>(asked: Instant, release: F) -> (Duration, Instant, Instant) {
    let granted = Instant::now();
    tokio::time::sleep(HOLD).await;
    let end = Instant::now();
    let _ = release.await;
    (granted - asked, granted, end)
}

/// Runs both sides on `urls`, the read-write lock first, and prints them side by side.
pub async fn scenario(urls: &[String]) {
    let redlock = Redlock::builder()
        .nodes(urls.to_vec())
        .backoff(redfence::Backoff::DEFAULT.retries(10_000))
        .build()
        .expect("config");
    let stamp = format!("{:?}", Instant::now()).replace(|c: char| !c.is_ascii_digit(), "");
    let rw = run(&redlock, Side::ReadWrite, &format!("bench:rw:{stamp}")).await;
    let mutex = run(&redlock, Side::Mutex, &format!("bench:rwmutex:{stamp}")).await;
    let secs = seconds() as f64;
    println!(
        "read-write lock: {TASKS} tasks, 1 hold in {WRITE_EVERY} a write, hold {} ms, {} s each side",
        HOLD.as_millis(),
        seconds()
    );
    println!(
        "{:<28} {:>14} {:>14} {:>8}",
        "measure", "rwlock", "one mutex", "ratio"
    );
    let (a, b) = (
        rw.holds.len() as f64 / secs,
        mutex.holds.len() as f64 / secs,
    );
    println!("{:<28} {a:>14.0} {b:>14.0} {:>7.2}x", "holds/s", a / b);
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
    for (what, write) in [("read", false), ("write", true)] {
        let (x, y) = (stats(rw.waits(write)), stats(mutex.waits(write)));
        for (q, p, r) in [("p50", x.p50, y.p50), ("p99", x.p99, y.p99)] {
            println!(
                "{:<28} {:>14} {:>14} {:>7.2}x",
                format!("{what} wait {q}"),
                ms(p),
                ms(r),
                p.as_secs_f64() / r.as_secs_f64()
            );
        }
    }
    let (readers, overlap) = rw.overlaps();
    println!("{:<28} {:>14} {:>14}", "most readers at once", readers, 1);
    println!(
        "{:<28} {:>14} {:>14}",
        "a writer beside a hold",
        if overlap { "YES" } else { "never" },
        if mutex.overlaps().1 { "YES" } else { "never" }
    );
}
