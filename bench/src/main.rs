//! Measures redfence against the floor, side by side, in one run.
//!
//! The floor is the same acquire and release scripts sent straight to the same five nodes,
//! in parallel, with no lock logic: no validation, no vote counting, no validity, no tokens.
//!
//! The fencing scenario runs the same acquire+release with no counter, a `RedisCounter` and
//! a `PostgresCounter` (redfence-postgres) on a local PostgreSQL with `fsync` on, side by
//! side.
//!
//! The workspace member `bench/` (package `redfence-bench`, unpublished), run from the
//! workspace root:
//!
//! ```sh
//! cargo run --release -p redfence-bench            # starts five local redis-server processes
//! BENCH_OPS=20000 BENCH_ROUNDS=9 cargo run --release -p redfence-bench
//! cargo run --release -p redfence-bench -- fencing   # the fencing scenario only
//! cargo run --release -p redfence-bench -- fence-ranges  # counters per resource vs striped (A/B)
//! cargo run --release -p redfence-bench -- load      # burst, idle, extension CPU, held locks
//! cargo run --release -p redfence-bench -- held      # 10,000 held using() locks alone
//! cargo run --release -p redfence-bench -- plain     # plain commands vs the script (A/B)
//! cargo run --release -p redfence-bench -- rwlock    # 64 tasks, 95 % reads, vs one mutex
//! cargo run --release -p redfence-bench -- semaphore # 64 tasks on K = 8 permits vs 8 mutexes
//! cargo run --release -p redfence-bench -- hotspot   # 16 waiters on one resource, beside node-redlock
//! cargo run --release -p redfence-bench --features metrics -- metrics   # recording cost
//! # on given masters (e.g. those ../shared/peers/run.sh uses), for figures beside the peers':
//! BENCH_NODES=127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005 \
//!   cargo run --release -p redfence-bench
//! ```
//!
//! Figures are printed, never asserted: speed is measured, not tested.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use futures::future::join_all;
use redfence::Redlock;
use redfence_testkit::Servers;
use redfence_testkit::proxy::{Mode, Proxy};
use redis::Script;
use redis::aio::ConnectionManager;

static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/acquire.lua")));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/release.lua")));

const TTL: Duration = Duration::from_secs(10);
const PARALLEL: usize = 64;

/// The same scripts, straight to every node in parallel, waiting for every reply.
#[derive(Clone)]
struct Floor {
    pub conns: Vec<ConnectionManager>,
}

impl Floor {
    async fn connect(urls: &[String]) -> redis::RedisResult<Floor> {
        let mut conns = Vec::new();
        for url in urls {
            conns.push(ConnectionManager::new(redis::Client::open(url.as_str())?).await?);
        }
        Ok(Floor { conns })
    }

    async fn acquire_release(&self, resource: &str, token: &str) -> redis::RedisResult<()> {
        let ttl_ms = TTL.as_millis() as u64;
        let acquired = join_all(self.conns.iter().map(|c| {
            let mut c = c.clone();
            async move {
                ACQUIRE
                    .key(resource)
                    .arg(token)
                    .arg(ttl_ms)
                    .invoke_async::<i64>(&mut c)
                    .await
            }
        }))
        .await;
        for r in acquired {
            r?;
        }
        let released = join_all(self.conns.iter().map(|c| {
            let mut c = c.clone();
            async move {
                RELEASE
                    .key(resource)
                    .arg(token)
                    .invoke_async::<i64>(&mut c)
                    .await
            }
        }))
        .await;
        for r in released {
            r?;
        }
        Ok(())
    }
}

async fn lock_once(redlock: &Redlock, resource: &str) -> Result<(), redfence::Error> {
    redlock.acquire(&[resource], TTL).await?.release().await
}

struct Stats {
    p50: Duration,
    p99: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    Stats {
        p50: at(0.50),
        p99: at(0.99),
    }
}

fn micros(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

/// Sequential latency of redfence and of the floor, interleaved in blocks so that both see
/// the same machine conditions.
async fn latency(redlock: &Redlock, floor: &Floor, ops: usize) -> (Stats, Stats) {
    let (mut ours, mut theirs) = (Vec::with_capacity(ops), Vec::with_capacity(ops));
    for block in 0..ops / 100 {
        for i in 0..100 {
            let resource = format!("bench:seq:{block}:{i}");
            let t = Instant::now();
            lock_once(redlock, &resource)
                .await
                .expect("redfence acquire+release");
            ours.push(t.elapsed());
            let t = Instant::now();
            floor
                .acquire_release(&resource, "floor-token")
                .await
                .expect("floor acquire+release");
            theirs.push(t.elapsed());
        }
    }
    (stats(ours), stats(theirs))
}

/// Operations per second with `PARALLEL` tasks on distinct resources.
async fn throughput<F, Fut>(ops_per_task: usize, op: F) -> f64
where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..PARALLEL)
        .map(|t| {
            let op = op.clone();
            tokio::spawn(async move {
                for i in 0..ops_per_task {
                    op(format!("bench:par:{t}:{i}")).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("bench task");
    }
    (PARALLEL * ops_per_task) as f64 / started.elapsed().as_secs_f64()
}

/// `BENCH_NODES=host:port,...`: the masters to measure on instead of the five the bench starts
/// (the fencing scenario keeps its own). The slowed-node scenario proxies the fifth, which
/// must then be local.
fn bench_nodes() -> Option<Vec<String>> {
    let nodes = std::env::var("BENCH_NODES").ok()?;
    let urls: Vec<String> = nodes
        .split(',')
        .filter(|n| !n.is_empty())
        .map(|n| format!("redis://{n}"))
        .collect();
    assert_eq!(urls.len(), 5, "BENCH_NODES takes five host:port");
    Some(urls)
}

/// The `host:port` of a `redis://host:port` URL.
fn host_port(url: &str) -> String {
    url.trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned()
}

/// The port of a `redis://host:port` URL.
fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .expect("a redis://host:port URL")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let ops: usize = std::env::var("BENCH_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000)
        .max(100);
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("hotspot-worker") {
        hotspot::worker(&args[1..]).await;
        return;
    }
    let servers = Servers::start(5);
    let only = |name: &str| std::env::args().skip(1).any(|a| a == name);
    if only("fencing") {
        fencing::scenario(&servers, ops).await;
        return;
    }
    if only("fence-ranges") {
        ranges::scenario(&servers, ops).await;
        return;
    }
    let urls = bench_nodes().unwrap_or_else(|| servers.urls());
    let redlock = Redlock::builder()
        .nodes(urls.clone())
        .build()
        .expect("config");
    let floor = Floor::connect(&urls).await.expect("connect the floor");

    // Warm up both: connections, loaded scripts, allocator.
    latency(&redlock, &floor, 500).await;
    if only("hotspot") {
        hotspot::scenario(&urls).await;
        return;
    }
    if only("held") {
        // The held-locks scenario alone (10,000 held `using()` locks: % of a core, memory).
        load::held_using(&urls).await;
        return;
    }
    if only("rwlock") {
        rwlock::scenario(&urls).await;
        return;
    }
    if only("semaphore") {
        semaphore::scenario(&urls).await;
        return;
    }
    if only("plain") {
        plain::scenario(&urls, ops).await;
        return;
    }
    if only("load") {
        load::scenarios(&urls, &redlock, &floor, ops).await;
        return;
    }
    if only("metrics") {
        #[cfg(feature = "metrics")]
        recording::scenario(&redlock, ops).await;
        #[cfg(not(feature = "metrics"))]
        println!("the metrics scenario needs the `metrics` feature");
        return;
    }

    println!(
        "redfence bench: 5 local redis-server nodes, {ops} sequential ops, {PARALLEL}-way parallel"
    );
    println!(
        "{:<34} {:>14} {:>14} {:>8}",
        "measure", "redfence", "floor", "ratio"
    );
    let row = |name: &str, a: String, b: String, ratio: f64| {
        println!("{name:<34} {a:>14} {b:>14} {ratio:>7.2}x");
    };
    let latency_rows = |prefix: &str, ours: &Stats, theirs: &Stats| {
        for (q, a, b) in [("p50", ours.p50, theirs.p50), ("p99", ours.p99, theirs.p99)] {
            row(
                &format!("{prefix} {q}"),
                micros(a),
                micros(b),
                a.as_secs_f64() / b.as_secs_f64(),
            );
        }
    };
    let (ours, theirs) = latency(&redlock, &floor, ops).await;
    latency_rows("acquire+release", &ours, &theirs);
    // The same from a spawned task (as a request handler runs), where the node queues' tasks
    // can run on the caller's own worker thread; above, the caller is `main` under
    // `block_on`, outside the workers, and every round crosses threads.
    let (ours, theirs) = {
        let (redlock, floor) = (redlock.clone(), floor.clone());
        tokio::spawn(async move { latency(&redlock, &floor, ops).await })
            .await
            .expect("latency task")
    };
    latency_rows("in a spawned task:", &ours, &theirs);

    // In alternating rounds (`BENCH_ROUNDS`, default 5), so that a machine whose speed drifts
    // during the run (a shared host) weighs on both sides alike; the ratio is taken within
    // each round and printed as the median and range.
    let rounds = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_usize)
        .max(1);
    let per_task = (ops / PARALLEL).max(20);
    let (mut ours_used, mut floor_used) = (cpu::Usage::default(), cpu::Usage::default());
    let (mut ours_tps, mut floor_tps, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let before = cpu::Usage::now();
        let ours_tp = {
            let redlock = redlock.clone();
            throughput(per_task, move |r| {
                let redlock = redlock.clone();
                async move { lock_once(&redlock, &r).await.expect("redfence") }
            })
            .await
        };
        ours_used.add(&before, &cpu::Usage::now());
        let before = cpu::Usage::now();
        let floor_tp = {
            let floor = Arc::new(floor.clone());
            throughput(per_task, move |r| {
                let floor = Arc::clone(&floor);
                async move {
                    floor
                        .acquire_release(&r, "floor-token")
                        .await
                        .expect("floor")
                }
            })
            .await
        };
        floor_used.add(&before, &cpu::Usage::now());
        ours_tps.push(ours_tp);
        floor_tps.push(floor_tp);
        ratios.push(ours_tp / floor_tp);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (low, high) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), r| (l.min(*r), h.max(*r)));
    println!(
        "{:<34} {:>14} {:>14} {:>7.2}x  (rounds {low:.2}-{high:.2}x)",
        format!("{PARALLEL}-way throughput (ops/s)"),
        format!("{:.0}", median(ours_tps)),
        format!("{:.0}", median(floor_tps)),
        median(ratios),
    );
    // Both sides do the same number of operations: CPU per operation, where the cores went.
    let ops_done = (rounds * PARALLEL * per_task) as f64;
    let per_op = |d: Duration| Duration::from_secs_f64(d.as_secs_f64() / ops_done);
    for (name, a, b) in [
        (
            "64-way: client CPU per op",
            ours_used.client,
            floor_used.client,
        ),
        (
            "64-way: redis-server CPU per op",
            ours_used.redis,
            floor_used.redis,
        ),
    ] {
        let (a, b) = (per_op(a), per_op(b));
        row(
            name,
            micros(a),
            micros(b),
            a.as_secs_f64() / b.as_secs_f64().max(1e-12),
        );
    }
    println!(
        "{:<34} {:>13.0}% {:>13.0}%",
        "64-way: cores busy",
        100.0 * ours_used.busy_share(),
        100.0 * floor_used.busy_share()
    );

    // One node behind a proxy that adds 50 ms each way: the majority answers first.
    let proxy = Proxy::start(port_of(&urls[4])).await;
    proxy.set(Mode::Delay(Duration::from_millis(50)));
    let mut slowed_urls = urls[..4].to_vec();
    slowed_urls.push(proxy.url());
    let slowed = Redlock::builder()
        .nodes(slowed_urls)
        .build()
        .expect("config");
    let healthy = {
        let mut samples = Vec::new();
        for i in 0..ops.min(2_000) {
            let t = Instant::now();
            lock_once(&redlock, &format!("bench:healthy:{i}"))
                .await
                .expect("healthy");
            samples.push(t.elapsed());
        }
        stats(samples)
    };
    let slow = {
        lock_once(&slowed, "bench:slow:warm").await.expect("warm");
        let mut samples = Vec::new();
        for i in 0..ops.min(2_000) {
            let t = Instant::now();
            lock_once(&slowed, &format!("bench:slow:{i}"))
                .await
                .expect("slowed");
            samples.push(t.elapsed());
        }
        stats(samples)
    };
    println!(
        "{:<34} {:>14} {:>14} {:>7.2}x",
        "one node +50 ms: p50 vs healthy",
        micros(slow.p50),
        micros(healthy.p50),
        slow.p50.as_secs_f64() / healthy.p50.as_secs_f64()
    );
    println!(
        "{:<34} {:>14} {:>14} {:>7.2}x",
        "one node +50 ms: p99 vs healthy",
        micros(slow.p99),
        micros(healthy.p99),
        slow.p99.as_secs_f64() / healthy.p99.as_secs_f64()
    );
    println!("targets: p50 ratio <= 1.0x, throughput ratio >= 2x, slowed p50 <= 1.3x of healthy");
    load::scenarios(&urls, &redlock, &floor, ops).await;
    hotspot::scenario(&urls).await;
    println!();
    fencing::scenario(&servers, ops).await;
}

mod cpu;
mod fencing;
mod hotspot;
mod load;
mod plain;
mod ranges;
#[cfg(feature = "metrics")]
mod recording;
mod rwlock;
mod semaphore;
