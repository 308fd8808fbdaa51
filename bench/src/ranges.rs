//! Fencing by the batch (issue 30, part 2): the 64-way throughput of acquire+release with no
//! counter, and with `RedisCounter` and `PostgresCounter` (fsync on) each per resource (one
//! key or row per resource, the default) and striped (`striped(Stripes)`: a range per batch
//! from 16 stripes, and from 1), side by side in one run.
//!
//! Rounds over every row back to back; each row's ratio to `none` is taken within a round
//! (the machine is shared, conditions drift), and the median and range of those ratios are
//! printed. `BENCH_ROUNDS` (default 5) and `BENCH_OPS` as for the other scenarios.
use super::*;

use redfence::RedisCounter;
use redfence::fence::Stripes;
use redfence_postgres::PostgresCounter;

use crate::fencing::{rounds_of, spread};

pub async fn scenario(servers: &Servers, ops: usize) {
    let rounds = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_usize)
        .max(1);
    let store = Servers::start(1);
    let pg = redfence_testkit::postgres::Postgres::start();
    let one = Stripes::new(1).expect("one stripe");
    let builder = || Redlock::builder().nodes(servers.urls());
    let redis = || RedisCounter::open(&store.url(0)).expect("url");
    // Separate tables: a striped table refuses per-resource writes.
    let postgres = |table: &str| {
        PostgresCounter::connect(&pg.url())
            .expect("config")
            .table(table)
    };
    let rows: Vec<(&str, Redlock)> = vec![
        ("none", builder().build()),
        (
            "RedisCounter per resource",
            builder().fencing(redis()).build(),
        ),
        (
            "RedisCounter striped 16",
            builder()
                .fencing(redis().prefix("s16:").striped(Stripes::DEFAULT))
                .build(),
        ),
        (
            "RedisCounter striped 1",
            builder()
                .fencing(redis().prefix("s1:").striped(one))
                .build(),
        ),
        (
            "PostgresCounter per resource",
            builder().fencing(postgres("fences")).build(),
        ),
        (
            "PostgresCounter striped 16",
            builder()
                .fencing(postgres("fences_s16").striped(Stripes::DEFAULT))
                .build(),
        ),
        (
            "PostgresCounter striped 1",
            builder()
                .fencing(postgres("fences_s1").striped(one))
                .build(),
        ),
    ]
    .into_iter()
    .map(|(name, redlock)| (name, redlock.expect("config")))
    .collect();
    // Warm up: connections, scripts, tables, stripes.
    for (name, redlock) in &rows {
        for i in 0..200 {
            lock_once(redlock, &format!("bench:ranges:warm:{i}"))
                .await
                .expect(name);
        }
    }
    let per_task = (ops / PARALLEL).max(20);
    let (tps, used) = rounds_of(&rows, per_task, rounds).await;
    println!(
        "fence ranges: acquire+release on 5 nodes, {PARALLEL}-way parallel, {per_task} ops per \
         task, {rounds} rounds; PostgreSQL fsync on"
    );
    println!(
        "{:<30} {:>14} {:>9} {:>12} {:>12} {:>14} {:>12}",
        "counter",
        "64-way ops/s",
        "vs none",
        "per round",
        "client / op",
        "redis-srv / op",
        "postgres / op"
    );
    let acquisitions = (rounds * per_task * PARALLEL) as f64;
    let per_op = |d: Duration| micros(Duration::from_secs_f64(d.as_secs_f64() / acquisitions));
    for (i, (name, _)) in rows.iter().enumerate() {
        let per_round: Vec<f64> = tps[i].iter().zip(&tps[0]).map(|(t, n)| t / n).collect();
        let (low, ratio, high) = spread(per_round);
        let (_, tp, _) = spread(tps[i].clone());
        let u = &used[i];
        println!(
            "{name:<30} {tp:>14.0} {ratio:>8.2}x {:>12} {:>12} {:>14} {:>12}",
            format!("{low:.2}-{high:.2}x"),
            per_op(u.client),
            per_op(u.redis),
            per_op(u.postgres),
        );
    }
}
