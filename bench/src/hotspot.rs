//! The hotspot scenario (issue: hot resources): 16 waiters contend for ONE resource, each
//! holding it 20 ms, for a few seconds, with the default retry schedule (200 ms ± 100 ms);
//! once with all 16 in this process, once spread over 4 processes (4 waiters each, started
//! as `bench hotspot-worker`). Printed beside node-redlock's hotspot run on the same nodes
//! when `../shared/peers` is there (or `PEERS=<dir>`).
//!
//! Figures: hand-offs/s, wait p50/p99 against the ideal FIFO wait (15 × (hold + hand-off)),
//! the per-waiter share of acquisitions against the mean, the median idle gap between two
//! holders, and Redis commands per hand-off against one uncontended acquire+release.

use super::*;

use std::process::Stdio;
use std::time::{SystemTime, UNIX_EPOCH};

const WAITERS: usize = 16;
const PROCESSES: usize = 4;
const HOLD: Duration = Duration::from_millis(20);

fn seconds() -> u64 {
    std::env::var("HOT_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6)
}

/// What one process's waiters saw.
#[derive(Default)]
struct Report {
    /// Each acquisition's wait, in ms.
    waits: Vec<f64>,
    /// Acquisitions per waiter.
    shares: Vec<usize>,
    /// Each hold as (start, end) in µs since the Unix epoch (one clock for all processes).
    holds: Vec<(u128, u128)>,
}

fn unix_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

/// `waiters` tasks over one `Redlock`, each acquiring, holding `HOLD` and releasing until
/// `until` (Unix µs).
async fn waiters(
    urls: &[String],
    resource: &str,
    waiters: usize,
    until: u128,
    fair: bool,
) -> Report {
    let redlock = Redlock::builder()
        .nodes(urls.to_vec())
        .fair(fair)
        // node-redlock's hotspot run retries up to 1000 times with its default delay.
        .backoff(redfence::Backoff::DEFAULT.retries(1000))
        .build()
        .expect("config");
    lock_once(&redlock, &format!("{resource}:warm"))
        .await
        .expect("warm");
    let tasks: Vec<_> = (0..waiters)
        .map(|_| {
            let redlock = redlock.clone();
            let resource = resource.to_owned();
            tokio::spawn(async move {
                let mut report = Report::default();
                let mut mine = 0;
                while unix_micros() < until {
                    let asked = Instant::now();
                    let Ok(lock) = redlock.acquire(&[&resource], Duration::from_secs(5)).await
                    else {
                        continue;
                    };
                    report.waits.push(asked.elapsed().as_secs_f64() * 1e3);
                    let start = unix_micros();
                    tokio::time::sleep(HOLD).await;
                    report.holds.push((start, unix_micros()));
                    let _ = lock.release().await;
                    mine += 1;
                }
                report.shares.push(mine);
                report
            })
        })
        .collect();
    let mut all = Report::default();
    for task in tasks {
        let report = task.await.expect("waiter");
        all.waits.extend(report.waits);
        all.shares.extend(report.shares);
        all.holds.extend(report.holds);
    }
    all
}

/// `bench hotspot-worker <urls,> <resource> <waiters> <until µs> <fair|plain>`: one of the
/// processes, printing its report as one JSON line.
pub async fn worker(args: &[String]) {
    let [urls, resource, count, until, mode] = args else {
        panic!("usage: bench hotspot-worker <urls,> <resource> <waiters> <until> <fair|plain>");
    };
    let urls: Vec<String> = urls.split(',').map(str::to_owned).collect();
    let report = waiters(
        &urls,
        resource,
        count.parse().expect("waiters"),
        until.parse().expect("until"),
        mode == "fair",
    )
    .await;
    let line = serde_json::json!({
        "waits": report.waits,
        "shares": report.shares,
        "holds": report.holds.iter().map(|(s, e)| [*s as u64, *e as u64]).collect::<Vec<_>>(),
    });
    println!("{line}");
}

/// Commands clients sent to every node so far (from `INFO commandstats`): everything but
/// `info` itself and the commands the lock scripts run inside a call (`get`, `pexpire`,
/// `del`, `publish`, and the fair queue's sorted-set commands). `set` counts too: every lock
/// operation is a script call, so the `SET`s counted are the ones its scripts run inside (a
/// grant, a waiting mark), which over-counts every mode alike.
fn commands(urls: &[String]) -> u64 {
    urls.iter()
        .map(|url| {
            let mut conn = redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .expect("connect");
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut conn)
                .expect("INFO");
            info.lines()
                .filter(|l| {
                    l.strip_prefix("cmdstat_")
                        .and_then(|l| l.split(':').next())
                        .is_some_and(|name| !INSIDE_SCRIPTS.contains(&name))
                })
                .filter_map(|l| {
                    l.split("calls=")
                        .nth(1)?
                        .split(',')
                        .next()?
                        .parse::<u64>()
                        .ok()
                })
                .sum::<u64>()
        })
        .sum()
}

const INSIDE_SCRIPTS: &[&str] = &[
    "info",
    "get",
    "pexpire",
    "del",
    "publish",
    "zadd",
    "zrem",
    "zrange",
    "zrangebyscore",
    "zremrangebyscore",
    "zscore",
    "pttl",
    "time",
    "exists",
    "type",
];

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

struct Figures {
    handoffs_per_s: f64,
    wait_p50: f64,
    wait_p99: f64,
    ideal: f64,
    min_share: f64,
    max_share: f64,
    gap_p50: f64,
    commands_per_handoff: f64,
}

fn figures(mut report: Report, secs: f64, commands: u64) -> Figures {
    report.waits.sort_by(f64::total_cmp);
    report.holds.sort();
    let mut gaps: Vec<f64> = report
        .holds
        .windows(2)
        .map(|w| (w[1].0.saturating_sub(w[0].1)) as f64 / 1e3)
        .collect();
    gaps.sort_by(f64::total_cmp);
    let handoffs = report.holds.len();
    let mean = handoffs as f64 / report.shares.len().max(1) as f64;
    let gap_p50 = percentile(&gaps, 0.5);
    Figures {
        handoffs_per_s: handoffs as f64 / secs,
        wait_p50: percentile(&report.waits, 0.5),
        wait_p99: percentile(&report.waits, 0.99),
        ideal: (WAITERS - 1) as f64 * (HOLD.as_secs_f64() * 1e3 + gap_p50),
        min_share: report.shares.iter().copied().min().unwrap_or(0) as f64 / mean,
        max_share: report.shares.iter().copied().max().unwrap_or(0) as f64 / mean,
        gap_p50,
        commands_per_handoff: commands as f64 / handoffs.max(1) as f64,
    }
}

/// Redis commands of one uncontended acquire+release, over all nodes.
async fn uncontended_commands(urls: &[String]) -> f64 {
    let redlock = Redlock::builder()
        .nodes(urls.to_vec())
        .build()
        .expect("config");
    lock_once(&redlock, "hot:uncontended:warm")
        .await
        .expect("warm");
    // Let the warm-up's stragglers land before counting.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = commands(urls);
    for i in 0..200 {
        lock_once(&redlock, &format!("hot:uncontended:{i}"))
            .await
            .expect("uncontended");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    (commands(urls) - before) as f64 / 200.0
}

async fn in_one_process(urls: &[String]) -> Figures {
    let secs = seconds();
    let before = commands(urls);
    let started = Instant::now();
    let until = unix_micros() + u128::from(secs) * 1_000_000;
    let report = waiters(urls, "hot:one", WAITERS, until, false).await;
    let elapsed = started.elapsed().as_secs_f64();
    figures(report, elapsed, commands(urls) - before)
}

async fn over_processes(urls: &[String], fair: bool) -> Figures {
    let secs = seconds();
    let exe = std::env::current_exe().expect("the bench's own path");
    let before = commands(urls);
    let started = Instant::now();
    let until = unix_micros() + u128::from(secs) * 1_000_000;
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "hotspot-worker",
                    &urls.join(","),
                    if fair { "hot:fair" } else { "hot:spread" },
                    &(WAITERS / PROCESSES).to_string(),
                    &until.to_string(),
                    if fair { "fair" } else { "plain" },
                ])
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a worker process")
        })
        .collect();
    let mut report = Report::default();
    for child in children {
        let out = child.wait_with_output().expect("worker process");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().last().unwrap_or("{}");
        let json: serde_json::Value = serde_json::from_str(line).expect("worker report");
        let floats = |k: &str| -> Vec<f64> {
            json[k]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_f64()).collect())
                .unwrap_or_default()
        };
        report.waits.extend(floats("waits"));
        report
            .shares
            .extend(floats("shares").into_iter().map(|s| s as usize));
        if let Some(holds) = json["holds"].as_array() {
            report.holds.extend(
                holds
                    .iter()
                    .filter_map(|h| Some((h[0].as_u64()? as u128, h[1].as_u64()? as u128))),
            );
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    figures(report, elapsed, commands(urls) - before)
}

/// node-redlock's hotspot run on the same nodes, if the peers are there: its JSON line.
fn node_redlock(urls: &[String]) -> Option<serde_json::Value> {
    let dir = std::env::var("PEERS").unwrap_or_else(|_| "../shared/peers".into());
    let script = std::path::Path::new(&dir).join("run.sh");
    if !script.exists() {
        println!(
            "(node-redlock: {} not found; set PEERS=<dir> to compare)",
            script.display()
        );
        return None;
    }
    let nodes: Vec<String> = urls.iter().map(|u| host_port(u)).collect();
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg("node")
        .env("NODES", nodes.join(","))
        .env("SEQ", "1")
        .env("PAR_OPS", "1")
        .env("BURST", "0")
        .env("HOT_WORKERS", WAITERS.to_string())
        .env("HOT_HOLD_MS", HOLD.as_millis().to_string())
        .env("HOT_S", seconds().to_string())
        .stderr(Stdio::inherit())
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["scenario"] == "hotspot")
}

pub async fn scenario(urls: &[String]) {
    println!();
    println!(
        "hotspot: {WAITERS} waiters on one resource, hold {} ms, {} s, default retry schedule",
        HOLD.as_millis(),
        seconds()
    );
    let baseline = uncontended_commands(urls).await;
    let one = in_one_process(urls).await;
    let spread = over_processes(urls, false).await;
    let fair = over_processes(urls, true).await;
    let peer = node_redlock(urls);
    let peer_f = |k: &str| peer.as_ref().and_then(|p| p[k].as_f64());
    let show = |v: Option<f64>, unit: &str| v.map_or("—".to_owned(), |v| format!("{v:.1}{unit}"));
    println!(
        "{:<36} {:>12} {:>12} {:>12} {:>13}",
        "measure", "1 process", "4 processes", "4 proc. fair", "node-redlock"
    );
    let row = |name: &str, [a, b, c]: [f64; 3], peer: Option<f64>, unit: &str| {
        println!(
            "{name:<36} {:>12} {:>12} {:>12} {:>13}",
            format!("{a:.1}{unit}"),
            format!("{b:.1}{unit}"),
            format!("{c:.1}{unit}"),
            show(peer, unit)
        );
    };
    let all = |f: fn(&Figures) -> f64| [f(&one), f(&spread), f(&fair)];
    row(
        "hand-offs/s",
        all(|f| f.handoffs_per_s),
        peer_f("handoffs_per_s"),
        "",
    );
    row(
        "wait p50",
        all(|f| f.wait_p50),
        peer_f("wait_p50_ms"),
        " ms",
    );
    row(
        "wait p99",
        all(|f| f.wait_p99),
        peer_f("wait_p99_ms"),
        " ms",
    );
    row(
        "ideal FIFO wait (15 x (hold+gap))",
        all(|f| f.ideal),
        None,
        " ms",
    );
    row("wait p99 / ideal", all(|f| f.wait_p99 / f.ideal), None, "x");
    let peer_mean = peer_f("handoffs_per_s").map(|h| h * seconds() as f64 / WAITERS as f64);
    row(
        "min share / mean",
        all(|f| f.min_share),
        peer_f("min_share").zip(peer_mean).map(|(m, mean)| m / mean),
        "x",
    );
    row(
        "max share / mean",
        all(|f| f.max_share),
        peer_f("max_share").zip(peer_mean).map(|(m, mean)| m / mean),
        "x",
    );
    row(
        "median idle gap between holders",
        all(|f| f.gap_p50),
        None,
        " ms",
    );
    row(
        "commands per hand-off / uncontended",
        all(|f| f.commands_per_handoff).map(|c| c / baseline),
        None,
        "x",
    );
    println!(
        "targets: wait p99 <= 2x ideal, shares within 0.5x-2x of the mean, idle gap p50 <= 2 ms, commands per hand-off <= 2x ({baseline:.1} per uncontended acquire+release)"
    );
}
