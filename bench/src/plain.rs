//! The one-knob A/B of plain commands (`RedlockBuilder::native_commands`): the same `Redlock`
//! options but that one, on the same servers, in alternating rounds (the order swapped each
//! round): sequential acquire + release p50, 64-way throughput, and client and server CPU per
//! operation. On a server without compare-and-delete both arms run the script: the figures
//! then show what asking the server costs (nothing per lock).
//!
//! ```sh
//! REDIS_SERVER=/opt/redfence-valkey9/bin/valkey-server cargo run --release -p redfence-bench -- plain
//! ```

use super::*;

/// One arm's figures in one round.
struct Arm {
    p50: Duration,
    ops_per_s: f64,
    client: Duration,
    server: Duration,
}

async fn arm(redlock: &Redlock, round: usize, sequential: usize, per_task: usize) -> Arm {
    let mut samples = Vec::with_capacity(sequential);
    for i in 0..sequential {
        let t = Instant::now();
        lock_once(redlock, &format!("bench:plain:seq:{round}:{i}"))
            .await
            .expect("sequential");
        samples.push(t.elapsed());
    }
    let before = cpu::Usage::now();
    let ops_per_s = {
        let redlock = redlock.clone();
        throughput(per_task, move |r| {
            let redlock = redlock.clone();
            async move { lock_once(&redlock, &r).await.expect("64-way") }
        })
        .await
    };
    let mut used = cpu::Usage::default();
    used.add(&before, &cpu::Usage::now());
    let ops = (PARALLEL * per_task) as u32;
    Arm {
        p50: stats(samples).p50,
        ops_per_s,
        client: used.client / ops,
        server: used.redis / ops,
    }
}

pub async fn scenario(urls: &[String], ops: usize) {
    let rounds = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_usize)
        .max(1);
    let build = |native: bool| {
        Redlock::builder()
            .nodes(urls.to_vec())
            .native_commands(native)
            .build()
            .expect("config")
    };
    let (plain, script) = (build(true), build(false));
    for redlock in [&plain, &script] {
        // Connections, the script loaded, and plain acquires turned on (after a plain release).
        for i in 0..200 {
            lock_once(redlock, &format!("bench:plain:warm:{i}"))
                .await
                .expect("warm");
        }
    }
    let sequential = (ops / 5).max(200);
    let per_task = (ops / PARALLEL).max(20);
    println!(
        "plain commands vs the script (native_commands(true) / (false)), {rounds} rounds, \
         {sequential} sequential + {} at {PARALLEL}-way each; servers counted: {}",
        per_task * PARALLEL,
        cpu::server_name()
    );
    let mut ratios: [Vec<f64>; 4] = Default::default();
    let mut arms = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let (p, s) = if round % 2 == 0 {
            let p = arm(&plain, round, sequential, per_task).await;
            (p, arm(&script, round, sequential, per_task).await)
        } else {
            let s = arm(&script, round, sequential, per_task).await;
            (arm(&plain, round, sequential, per_task).await, s)
        };
        ratios[0].push(p.p50.as_secs_f64() / s.p50.as_secs_f64());
        ratios[1].push(p.ops_per_s / s.ops_per_s);
        ratios[2].push(p.client.as_secs_f64() / s.client.as_secs_f64().max(1e-12));
        ratios[3].push(p.server.as_secs_f64() / s.server.as_secs_f64().max(1e-12));
        arms.0.push(p);
        arms.1.push(s);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    println!(
        "{:<34} {:>14} {:>14} {:>8}",
        "measure (median of rounds)", "plain", "script", "ratio"
    );
    let names = [
        "acquire+release p50",
        "64-way throughput (ops/s)",
        "64-way: client CPU per op",
        "64-way: server CPU per op",
    ];
    let show = |arm: &[Arm], i: usize| -> String {
        let values: Vec<f64> = arm
            .iter()
            .map(|a| match i {
                0 => a.p50.as_secs_f64() * 1e6,
                1 => a.ops_per_s,
                2 => a.client.as_secs_f64() * 1e6,
                _ => a.server.as_secs_f64() * 1e6,
            })
            .collect();
        let (m, _, _) = median(values);
        if i == 1 {
            format!("{m:.0}")
        } else {
            format!("{m:.1} µs")
        }
    };
    for (i, name) in names.iter().enumerate() {
        let (m, low, high) = median(ratios[i].clone());
        println!(
            "{name:<34} {:>14} {:>14} {m:>7.2}x  (rounds {low:.2}-{high:.2}x)",
            show(&arms.0, i),
            show(&arms.1, i),
        );
    }
}
