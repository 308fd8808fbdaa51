//! Fencing costs: no counter, `RedisCounter`, `PostgresCounter` (fsync on), in one run.
use super::*;

use redfence::RedisCounter;

/// A measured configuration: its name and its lock manager.
type Row = (&'static str, Redlock);

pub async fn scenario(servers: &Servers, ops: usize) {
    let ops = ops.min(3_000);
    let store = Servers::start(1);
    let builder = || Redlock::builder().nodes(servers.urls());
    #[cfg_attr(not(feature = "postgres"), allow(unused_mut))]
    let mut rows: Vec<Row> = vec![
        ("none", builder().build().expect("config")),
        (
            "RedisCounter",
            builder()
                .fencing(RedisCounter::open(&store.url(0)).expect("url"))
                .build()
                .expect("config"),
        ),
    ];
    #[cfg(feature = "postgres")]
    let pg = support::postgres::Postgres::start();
    #[cfg(feature = "postgres")]
    {
        let counter = || redfence::PostgresCounter::connect(&pg.url()).expect("config");
        rows.push((
            "PostgresCounter",
            builder().fencing(counter()).build().expect("config"),
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
    // Warm up: connections, scripts, tables.
    sequential(&rows, 300).await;

    let seq = sequential(&rows, ops).await;
    // Throughput: three rounds over every row, the median of each (the machine is shared).
    let mut rounds: Vec<Vec<f64>> = rows.iter().map(|_| Vec::new()).collect();
    for _ in 0..3 {
        for (i, &(name, ref redlock)) in rows.iter().enumerate() {
            let per_task = (ops / PARALLEL).max(20);
            let redlock = redlock.clone();
            let tp = throughput(per_task, move |r| {
                let redlock = redlock.clone();
                async move { lock_once(&redlock, &r).await.expect(name) }
            })
            .await;
            rounds[i].push(tp);
        }
    }
    let par: Vec<f64> = rounds
        .into_iter()
        .map(|mut r| {
            r.sort_by(f64::total_cmp);
            r[1]
        })
        .collect();
    println!("fencing: acquire+release on 5 nodes, {ops} sequential ops, {PARALLEL}-way parallel");
    println!(
        "{:<26} {:>10} {:>10} {:>14} {:>9}",
        "counter", "seq p50", "seq p99", "64-way ops/s", "vs none"
    );
    for (i, (name, _)) in rows.iter().enumerate() {
        println!(
            "{name:<26} {:>10} {:>10} {:>14.0} {:>8.2}x",
            micros(seq[i].p50),
            micros(seq[i].p99),
            par[i],
            par[i] / par[0]
        );
    }
    #[cfg(feature = "postgres")]
    {
        let (token, commit) = postgres::token_and_commit(&pg, ops.min(1_000)).await;
        let overhead = seq[2].p50.saturating_sub(seq[0].p50);
        println!(
            "PostgreSQL: one commit round trip p50 {}, PostgresCounter::next_fence p50 {} \
             ({:.2}x), fenced acquire+release p50 overhead {} ({:.2}x)",
            micros(commit),
            micros(token),
            token.as_secs_f64() / commit.as_secs_f64(),
            micros(overhead),
            overhead.as_secs_f64() / commit.as_secs_f64()
        );
    }
    #[cfg(not(feature = "postgres"))]
    println!("(PostgresCounter: run with --features postgres)");
    println!(
        "targets: PostgresCounter 64-way >= 0.80x none, its p50 overhead <= 1.5x one commit \
         round trip; RedisCounter 64-way >= 0.95x none"
    );
}

/// Sequential latency of every row, interleaved in blocks of 100 so that all see the
/// same machine conditions.
async fn sequential(rows: &[Row], ops: usize) -> Vec<Stats> {
    let mut samples: Vec<Vec<Duration>> = rows.iter().map(|_| Vec::new()).collect();
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
    }
    samples.into_iter().map(stats).collect()
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use futures::future::BoxFuture;
    use redfence::{BoxError, FencingCounter, PostgresCounter};

    use crate::support::postgres::Postgres;

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

    /// The p50 of one token request straight to a counter (a new resource each time),
    /// and of one committed single-row upsert sent alone (what a token costs at least),
    /// interleaved.
    pub async fn token_and_commit(pg: &Postgres, ops: usize) -> (Duration, Duration) {
        let counter = PostgresCounter::connect(&pg.url()).expect("config");
        let client = pg.client().await;
        client
            .batch_execute("CREATE TABLE IF NOT EXISTS bench_commit (id int PRIMARY KEY, n bigint)")
            .await
            .expect("create");
        let (mut tokens, mut samples) = (Vec::with_capacity(ops), Vec::with_capacity(ops));
        for i in 0..ops {
            let names = vec![format!("bench:alone:{i}")];
            let t = Instant::now();
            counter.next_fence(&names).await.expect("fence");
            tokens.push(t.elapsed());
            let t = Instant::now();
            // The simple query protocol: one round trip, one commit.
            client
                .batch_execute(
                    "INSERT INTO bench_commit VALUES (1, 1) \
                     ON CONFLICT (id) DO UPDATE SET n = bench_commit.n + 1",
                )
                .await
                .expect("commit");
            samples.push(t.elapsed());
        }
        tokens.sort();
        samples.sort();
        (tokens[ops / 2], samples[ops / 2])
    }
}
