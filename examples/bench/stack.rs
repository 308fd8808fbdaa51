//! The connection-stack A/B (issue 27): the same node queue, batching and lock logic over
//! three stacks, one knob apart (`RedlockBuilder::connection_stack`), on the same five nodes in
//! one run. Each measure runs in alternating rounds (`BENCH_ROUNDS`, default 5), the arms in a
//! different order each round, and each arm's ratio to the own socket is taken within a round:
//! the median and range of the rounds are printed.
//!
//! - `own socket + natives`: the queue's own socket, single-key acquires as native `SET NX`;
//! - `own socket, scripts`: the same socket, every operation in the batch script;
//! - `redis-rs multiplexed`: redis-rs's multiplexed connection, the batch script (how TLS and
//!   Unix-socket nodes are served).
//!
//! Ratios are to the redis-rs arm, within each round. Socket alone: the second arm against the
//! third. Natives alone: the first against the second.

use std::time::{Duration, Instant};

use redfence::{ConnectionStack, Redlock};

use crate::{PARALLEL, cpu, lock_once, throughput};

const ARMS: [(&str, ConnectionStack); 3] = [
    ("own socket + natives", ConnectionStack::Own),
    ("own socket, scripts", ConnectionStack::OwnScriptsOnly),
    ("redis-rs multiplexed", ConnectionStack::Multiplexed),
];

/// One arm's figures in one round.
#[derive(Clone, Copy, Default)]
struct Round {
    seq_p50: Duration,
    throughput: f64,
    client_cpu_per_op: Duration,
}

pub async fn scenario(urls: &[String], ops: usize, rounds: usize) {
    let redlocks: Vec<Redlock> = ARMS
        .iter()
        .map(|(_, stack)| {
            Redlock::builder()
                .nodes(urls.to_vec())
                .connection_stack(*stack)
                .build()
                .expect("config")
        })
        .collect();
    for (arm, redlock) in redlocks.iter().enumerate() {
        for i in 0..500 {
            lock_once(redlock, &format!("bench:stack:warm:{arm}:{i}"))
                .await
                .expect("warm-up");
        }
    }
    let seq_ops = (ops / 5).max(200);
    let per_task = (ops / PARALLEL).max(20);
    let mut results = vec![Vec::new(); ARMS.len()];
    for round in 0..rounds {
        for step in 0..ARMS.len() {
            let arm = (round + step) % ARMS.len();
            let redlock = &redlocks[arm];
            let mut samples = Vec::with_capacity(seq_ops);
            for i in 0..seq_ops {
                let t = Instant::now();
                lock_once(redlock, &format!("bench:stack:seq:{arm}:{round}:{i}"))
                    .await
                    .expect("sequential");
                samples.push(t.elapsed());
            }
            samples.sort();
            let before = cpu::Usage::now();
            let tp = {
                let redlock = redlock.clone();
                throughput(per_task, move |r| {
                    let redlock = redlock.clone();
                    async move { lock_once(&redlock, &r).await.expect("64-way") }
                })
                .await
            };
            let mut used = cpu::Usage::default();
            used.add(&before, &cpu::Usage::now());
            results[arm].push(Round {
                seq_p50: samples[samples.len() / 2],
                throughput: tp,
                client_cpu_per_op: used.client / (PARALLEL * per_task) as u32,
            });
        }
    }

    println!(
        "connection-stack A/B: {rounds} rounds, {seq_ops} sequential and {} {PARALLEL}-way ops per arm per round",
        PARALLEL * per_task
    );
    println!(
        "{:<22} {:>12} {:>18} {:>12} {:>18} {:>12} {:>18}",
        "arm", "seq p50", "vs redis-rs", "64-way/s", "vs redis-rs", "client/op", "vs redis-rs"
    );
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let spread = |v: &[f64]| {
        let (low, high) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), r| (l.min(*r), h.max(*r)));
        format!("{:.2}x ({low:.2}-{high:.2})", median(v.to_vec()))
    };
    // The decision's baseline: redis-rs multiplexed (the last arm).
    let base = &results[ARMS.len() - 1];
    for (arm, (name, _)) in ARMS.iter().enumerate() {
        let rows = &results[arm];
        let ratio = |f: &dyn Fn(&Round) -> f64| -> Vec<f64> {
            rows.iter().zip(base).map(|(a, b)| f(a) / f(b)).collect()
        };
        let seq = |r: &Round| r.seq_p50.as_secs_f64();
        let tp = |r: &Round| r.throughput;
        let cpu = |r: &Round| r.client_cpu_per_op.as_secs_f64().max(1e-9);
        println!(
            "{name:<22} {:>9.0} µs {:>18} {:>12.0} {:>18} {:>9.1} µs {:>18}",
            median(rows.iter().map(|r| seq(r) * 1e6).collect()),
            spread(&ratio(&seq)),
            median(rows.iter().map(tp).collect()),
            spread(&ratio(&tp)),
            median(rows.iter().map(|r| cpu(r) * 1e6).collect()),
            spread(&ratio(&cpu)),
        );
    }
    println!(
        "decision rule (issue 27): keep the own socket only if it wins by 15 % or more on one \
         measure against redis-rs multiplexed"
    );
}
