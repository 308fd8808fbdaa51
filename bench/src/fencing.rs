//! Fencing costs: no counter, `MemoryCounter` (the lock manager's fencing path with no I/O),
//! `RedisCounter`, `PostgresCounter` (fsync on), side by side in one run.
//!
//! Throughput runs in rounds over every row back to back, and each row's ratio to `none` is
//! taken within a round: the machine is shared, so conditions drift between rounds. The
//! median and the range of those per-round ratios are printed, with the time each counter
//! adds to one acquisition at 64-way and, for PostgreSQL, what one WAL flush took meanwhile.
use super::*;

use redfence::{MemoryCounter, RedisCounter};

/// A measured configuration: its name and its lock manager.
type Row = (&'static str, Redlock);

/// Issue 15's throughput targets: the least 64-way ratio to `none` for a counter.
const TARGETS: [(&str, f64); 2] = [("RedisCounter", 0.95), ("PostgresCounter", 0.80)];

pub async fn scenario(servers: &Servers, ops: usize) {
    let ops = ops.min(3_000);
    let rounds = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_usize)
        .max(1);
    let store = Servers::start(1);
    let builder = || Redlock::builder().nodes(servers.urls());
    let mut rows: Vec<Row> = vec![
        ("none", builder().build().expect("config")),
        (
            "MemoryCounter",
            builder()
                .fencing(MemoryCounter::new())
                .build()
                .expect("config"),
        ),
        (
            "RedisCounter",
            builder()
                .fencing(RedisCounter::open(&store.url(0)).expect("url"))
                .build()
                .expect("config"),
        ),
    ];
    let mut seq_only: Vec<Row> = Vec::new();
    let pg = redfence_testkit::postgres::Postgres::start();
    {
        postgres::time_wal_flushes(&pg).await;
        let counter = || redfence_postgres::PostgresCounter::connect(&pg.url()).expect("config");
        rows.push((
            "PostgresCounter",
            builder().fencing(counter()).build().expect("config"),
        ));
        // Over this direct connection, statements may be prepared (the opt-in).
        rows.push((
            "PostgresCounter prepared",
            builder()
                .fencing(counter().prepare_statements(true))
                .build()
                .expect("config"),
        ));
        // Sequential only: a bare commit round trip as the counter, no batching (the floor of
        // a durable token where a lock takes it).
        seq_only.push((
            "bare commit as counter",
            builder()
                .fencing(postgres::CommitCounter::new(&pg).await)
                .build()
                .expect("config"),
        ));
        // Two connections (requests alternate): does a second backend help?
        rows.push((
            "PostgresCounter x2 conns",
            builder()
                .fencing(postgres::Alternate::new([counter(), counter()]))
                .build()
                .expect("config"),
        ));
    }
    // The sequential baseline of PostgresCounter: one committed single-row upsert sent alone
    // (what a token costs at least), measured in the same blocks.
    let commit = postgres::Commit::new(&pg).await;
    let probe = async || {
        commit.once().await;
    };
    let all: Vec<Row> = rows.iter().chain(&seq_only).cloned().collect();
    // Warm up: connections, scripts, tables.
    sequential(&all, 300, probe).await;
    let (seq, commit) = sequential(&all, ops, probe).await;
    let wal_before = postgres::wal_flushes(&pg).await;
    let per_task = (ops / PARALLEL).max(20);
    let (tps, used) = rounds_of(&rows, per_task, rounds).await;
    println!(
        "fencing: acquire+release on 5 nodes, {ops} sequential ops, {PARALLEL}-way parallel \
         in {rounds} rounds"
    );
    println!(
        "{:<26} {:>10} {:>10} {:>14} {:>9} {:>12} {:>12}",
        "counter", "seq p50", "seq p99", "64-way ops/s", "vs none", "per round", "adds (64-way)"
    );
    let mut ratios = Vec::with_capacity(rows.len());
    for (i, (name, _)) in rows.iter().enumerate() {
        let per_round: Vec<f64> = tps[i].iter().zip(&tps[0]).map(|(t, n)| t / n).collect();
        let (low, ratio, high) = spread(per_round);
        // In a closed loop of PARALLEL tasks, one acquisition takes PARALLEL / throughput:
        // the difference to `none` is what the counter adds to each one.
        let added: Vec<f64> = tps[i]
            .iter()
            .zip(&tps[0])
            .map(|(t, n)| PARALLEL as f64 / t - PARALLEL as f64 / n)
            .collect();
        let (_, added, _) = spread(added);
        let (_, tp, _) = spread(tps[i].clone());
        println!(
            "{name:<26} {:>10} {:>10} {tp:>14.0} {ratio:>8.2}x {:>12} {:>12}",
            micros(seq[i].p50),
            micros(seq[i].p99),
            format!("{low:.2}-{high:.2}x"),
            micros(Duration::from_secs_f64(added.max(0.0))),
        );
        ratios.push((*name, ratio));
    }
    for (i, (name, _)) in all.iter().enumerate().skip(rows.len()) {
        println!(
            "{name:<26} {:>10} {:>10} {:>14} {:>9} {:>12} {:>12}",
            micros(seq[i].p50),
            micros(seq[i].p99),
            "-",
            "-",
            "-",
            "-"
        );
    }
    // Where the cores went: on a machine the servers share with the client, a counter's
    // server work is taken from the lock rounds.
    let acquisitions = (rounds * per_task * PARALLEL) as f64;
    let per_op = |d: Duration| micros(Duration::from_secs_f64(d.as_secs_f64() / acquisitions));
    println!(
        "{:<26} {:>10} {:>12} {:>14} {:>12}",
        "CPU in the 64-way rounds",
        "cores busy",
        "client / op",
        "redis-server / op",
        "postgres / op"
    );
    for (i, (name, _)) in rows.iter().enumerate() {
        let u = &used[i];
        println!(
            "{name:<26} {:>9.0}% {:>12} {:>14} {:>12}",
            100.0 * u.busy_share(),
            per_op(u.client),
            per_op(u.redis),
            per_op(u.postgres),
        );
    }
    // What one acquisition takes without a counter, and so what a counter may add.
    let (_, none_tp, _) = spread(tps[0].clone());
    let per_acquisition = Duration::from_secs_f64(PARALLEL as f64 / none_tp);
    for (name, least) in TARGETS {
        let Some(&(_, ratio)) = ratios.iter().find(|(row, _)| *row == name) else {
            continue;
        };
        println!(
            "target: {name} 64-way >= {least:.2}x none: {ratio:.2}x ({}); it may add at most \
             {} to an acquisition that takes {} without a counter",
            if ratio >= least { "met" } else { "missed" },
            micros(per_acquisition.mul_f64(1.0 / least - 1.0)),
            micros(per_acquisition),
        );
    }
    {
        let (flushes, millis) = postgres::wal_flushes(&pg).await;
        let (flushes, millis) = (flushes - wal_before.0, millis - wal_before.1);
        println!(
            "PostgreSQL during the 64-way rounds: {flushes} WAL flushes (fsync), {} each on \
             average; every batch commits, so waits for one",
            micros(Duration::from_secs_f64(
                millis / 1e3 / flushes.max(1) as f64
            ))
        );
        let at = |name: &str| all.iter().position(|(row, _)| *row == name);
        if let (Some(none), Some(fenced), Some(bare)) = (
            at("none"),
            at("PostgresCounter"),
            at("bare commit as counter"),
        ) {
            let overhead = seq[fenced].p50.saturating_sub(seq[none].p50);
            let floor = seq[bare].p50.saturating_sub(seq[none].p50);
            let ratio = overhead.as_secs_f64() / commit.p50.as_secs_f64();
            println!(
                "PostgreSQL: one commit round trip p50 {} (in the sequential blocks); fenced \
                 acquire+release p50 overhead {} ({ratio:.2}x), with a bare commit as the \
                 counter {} ({:.2}x)",
                micros(commit.p50),
                micros(overhead),
                micros(floor),
                floor.as_secs_f64() / commit.p50.as_secs_f64(),
            );
            if let Some(prepared) = at("PostgresCounter prepared") {
                let overhead = seq[prepared].p50.saturating_sub(seq[none].p50);
                println!(
                    "PostgreSQL: with prepared statements, fenced acquire+release p50 overhead \
                     {} ({:.2}x one commit round trip)",
                    micros(overhead),
                    overhead.as_secs_f64() / commit.p50.as_secs_f64(),
                );
            }
            let (token, commit) = postgres::token_and_commit(&pg, ops.min(1_000)).await;
            println!(
                "PostgreSQL: PostgresCounter::next_fence alone p50 {} ({:.2}x one commit round \
                 trip {}, interleaved)",
                micros(token),
                token.as_secs_f64() / commit.as_secs_f64(),
                micros(commit),
            );
            println!(
                "target: PostgresCounter sequential p50 overhead <= 1.5x one commit round trip: \
                 {ratio:.2}x ({})",
                if ratio <= 1.5 { "met" } else { "missed" }
            );
        }
    }
}

/// The smallest, median and largest of `values` (not empty).
/// `PARALLEL`-way throughput of every row, the rows one after another in each of `rounds`
/// rounds (so that a machine whose speed drifts weighs on all alike): each row's figure per
/// round, and the CPU it used over all rounds.
pub(crate) async fn rounds_of(
    rows: &[Row],
    per_task: usize,
    rounds: usize,
) -> (Vec<Vec<f64>>, Vec<cpu::Usage>) {
    let mut tps: Vec<Vec<f64>> = rows.iter().map(|_| Vec::new()).collect();
    let mut used: Vec<cpu::Usage> = rows.iter().map(|_| cpu::Usage::default()).collect();
    for _ in 0..rounds {
        for (i, &(name, ref redlock)) in rows.iter().enumerate() {
            let redlock = redlock.clone();
            let before = cpu::Usage::now();
            let tp = throughput(per_task, move |r| {
                let redlock = redlock.clone();
                async move { lock_once(&redlock, &r).await.expect(name) }
            })
            .await;
            used[i].add(&before, &cpu::Usage::now());
            tps[i].push(tp);
        }
    }
    (tps, used)
}

pub(crate) fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[0],
        values[values.len() / 2],
        values[values.len() - 1],
    )
}

/// Sequential latency of every row, and of `probe` (a baseline), interleaved in blocks of 100
/// so that all see the same machine conditions.
async fn sequential(rows: &[Row], ops: usize, mut probe: impl AsyncFnMut()) -> (Vec<Stats>, Stats) {
    let mut samples: Vec<Vec<Duration>> = rows.iter().map(|_| Vec::new()).collect();
    let mut probes = Vec::new();
    for block in 0..ops.div_ceil(100) {
        for (r, (name, redlock)) in rows.iter().enumerate() {
            for i in 0..100 {
                let t = Instant::now();
                lock_once(redlock, &format!("bench:fence:{r}:{block}:{i}"))
                    .await
                    .expect(name);
                samples[r].push(t.elapsed());
            }
        }
        for _ in 0..100 {
            let t = Instant::now();
            probe().await;
            probes.push(t.elapsed());
        }
    }
    (samples.into_iter().map(stats).collect(), stats(probes))
}

mod postgres {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use futures::future::BoxFuture;
    use redfence::{BoxError, FencingCounter};
    use redfence_postgres::PostgresCounter;
    use redfence_postgres::tokio_postgres::Client;

    use redfence_testkit::postgres::Postgres;

    /// Counters used in turn: one backend each.
    pub struct Alternate<const N: usize> {
        counters: [PostgresCounter; N],
        next: AtomicUsize,
    }

    impl<const N: usize> Alternate<N> {
        pub fn new(counters: [PostgresCounter; N]) -> Self {
            Alternate {
                counters,
                next: AtomicUsize::new(0),
            }
        }
    }

    impl<const N: usize> FencingCounter for Alternate<N> {
        fn next_fence<'a>(
            &'a self,
            resources: &'a [String],
        ) -> BoxFuture<'a, Result<u64, BoxError>> {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % N;
            self.counters[i].next_fence(resources)
        }
    }

    /// Times WAL flushes (`track_wal_io_timing`: a statistics setting, durability is
    /// unchanged), for [`wal_flushes`].
    pub async fn time_wal_flushes(pg: &Postgres) {
        let client = pg.client().await;
        // ALTER SYSTEM cannot run in the implicit transaction of a multi-statement batch.
        for sql in [
            "ALTER SYSTEM SET track_wal_io_timing = on",
            "SELECT pg_reload_conf()",
        ] {
            client
                .batch_execute(sql)
                .await
                .expect("track_wal_io_timing");
        }
    }

    /// WAL flushes so far and the milliseconds they took (`pg_stat_wal`).
    pub async fn wal_flushes(pg: &Postgres) -> (i64, f64) {
        let client = pg.client().await;
        let row = client
            .query_one("SELECT wal_sync, wal_sync_time FROM pg_stat_wal", &[])
            .await
            .expect("pg_stat_wal");
        (row.get(0), row.get(1))
    }

    /// One committed single-row upsert, sent alone over the simple query protocol (one round
    /// trip, one commit): the least a token costs.
    pub struct Commit(Client);

    impl Commit {
        pub async fn new(pg: &Postgres) -> Self {
            let client = pg.client().await;
            client
                .batch_execute(
                    "CREATE TABLE IF NOT EXISTS bench_commit (id int PRIMARY KEY, n bigint)",
                )
                .await
                .expect("create");
            Commit(client)
        }

        pub async fn once(&self) {
            self.0
                .batch_execute(
                    "INSERT INTO bench_commit VALUES (1, 1) \
                     ON CONFLICT (id) DO UPDATE SET n = bench_commit.n + 1",
                )
                .await
                .expect("commit");
        }
    }

    /// A counter that is one bare commit round trip per request ([`Commit`]), no batching:
    /// the floor of a durable token. Not a real counter: its tokens come from memory.
    pub struct CommitCounter {
        commit: Commit,
        last: AtomicU64,
    }

    impl CommitCounter {
        pub async fn new(pg: &Postgres) -> Self {
            CommitCounter {
                commit: Commit::new(pg).await,
                last: AtomicU64::new(0),
            }
        }
    }

    impl FencingCounter for CommitCounter {
        fn next_fence<'a>(&'a self, _: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>> {
            Box::pin(async move {
                self.commit.once().await;
                Ok(self.last.fetch_add(1, Ordering::Relaxed) + 1)
            })
        }
    }

    /// The p50 of one token request straight to a counter (a new resource each time),
    /// and of one committed single-row upsert sent alone (what a token costs at least),
    /// interleaved.
    pub async fn token_and_commit(pg: &Postgres, ops: usize) -> (Duration, Duration) {
        let counter = PostgresCounter::connect(&pg.url()).expect("config");
        let commit = Commit::new(pg).await;
        let (mut tokens, mut samples) = (Vec::with_capacity(ops), Vec::with_capacity(ops));
        for i in 0..ops {
            let names = vec![format!("bench:alone:{i}")];
            let t = Instant::now();
            counter.next_fence(&names).await.expect("fence");
            tokens.push(t.elapsed());
            let t = Instant::now();
            commit.once().await;
            samples.push(t.elapsed());
        }
        tokens.sort();
        samples.sort();
        (tokens[ops / 2], samples[ops / 2])
    }
}
