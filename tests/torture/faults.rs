//! The fault schedule of the torture runs: kills, pauses, cuts, restarts without persistence
//! and flushes (one node, or now and then a majority in sequence), clock faults where the
//! clocks can be faked.

use std::time::{Duration, Instant};

use rand::Rng;

use super::TTL;
use super::history::FaultLog;
use super::support::cluster::Cluster;
use super::support::faketime::Clocks;

/// The chance that a fault is a clock fault, where clocks can be faked.
const CLOCK_PERCENT: u32 = 35;
/// Every this many clock faults, one hits a majority of the nodes (the second one first, so
/// that a short run has one too).
const CLOCK_MAJORITY_EVERY: u32 = 4;
/// Every this many restarts, a majority of the nodes restarts, one after another (the second
/// one first); the others restart one node.
const RESTART_MAJORITY_EVERY: u32 = 3;
/// Injects faults on random nodes until `until`, then heals everything: a minority for
/// kills, pauses, cuts and restarts; for clock faults (where `clocks` is given) a minority
/// most of the time and a majority every [`CLOCK_MAJORITY_EVERY`]th time.
pub(crate) async fn schedule(
    cluster: &mut dyn Cluster,
    clocks: Option<&Clocks>,
    log: &FaultLog,
    until: Instant,
) {
    let mut rng = rand::rng();
    let (mut clock_faults, mut restarts) = (0, 0);
    while Instant::now() < until {
        let clock = clocks.filter(|_| rng.random_range(0..100) < CLOCK_PERCENT);
        let kind = match clock {
            Some(_) => ["fast", "jump"][rng.random_range(0..2)],
            None => ["kill", "pause", "disconnect", "restart", "flush"][rng.random_range(0..5)],
        };
        let count = if clock.is_some() {
            clock_faults += 1;
            if clock_faults % CLOCK_MAJORITY_EVERY == 2 {
                cluster.len() / 2 + 1
            } else {
                rng.random_range(1..=2)
            }
        } else if kind == "restart" || kind == "flush" {
            // Restarts without persistence and flushes: one node, or now and then a majority
            // in sequence.
            restarts += 1;
            if restarts % RESTART_MAJORITY_EVERY == 2 {
                cluster.len() / 2 + 1
            } else {
                1
            }
        } else {
            rng.random_range(1..=2)
        };
        let mut nodes: Vec<usize> = (0..cluster.len()).collect();
        for i in (1..nodes.len()).rev() {
            nodes.swap(i, rng.random_range(0..=i));
        }
        let nodes = &nodes[..count];
        let hold = Duration::from_millis(rng.random_range(300..2_500));
        let rate = [2.0, 4.0][rng.random_range(0..2)];
        let jump = TTL + Duration::from_millis(rng.random_range(0..1_000));
        let start = Instant::now();
        for &i in nodes {
            match (kind, clock) {
                ("fast", Some(clocks)) => clocks.set_rate(i, rate),
                ("jump", Some(clocks)) => clocks.jump(i, jump),
                ("kill", _) => cluster.kill(i),
                ("pause", _) => cluster.pause(i),
                ("disconnect", _) => cluster.disconnect(i),
                (lost, _) => {
                    if lost == "flush" {
                        cluster.flush(i);
                    } else {
                        cluster.kill(i);
                        cluster.restart(i);
                    }
                    if count > 1 {
                        // In sequence: the next one a little later.
                        tokio::time::sleep(Duration::from_millis(rng.random_range(100..600))).await;
                    }
                }
            }
        }
        tokio::time::sleep(hold).await;
        for &i in nodes {
            match (kind, clock) {
                ("fast", Some(clocks)) => clocks.set_rate(i, 1.0),
                ("kill", _) => cluster.restart(i),
                ("pause", _) => cluster.resume(i),
                ("disconnect", _) => cluster.connect(i),
                _ => {}
            }
        }
        // A node that restarted empty, or whose clock ran ahead, forgot its locks early: their
        // owners may be shadowed until the longest lease has run out. Queued commands also land
        // a little after a heal.
        let end = Instant::now() + TTL + Duration::from_millis(500);
        let majority = count > cluster.len() / 2;
        log.record(
            format!("{kind}{}", if majority { " (majority)" } else { "" }),
            start,
            end,
            kind != "restart" && kind != "flush",
        );
        // Every other fault or so, a quiet spell past the end of its window: without one, the
        // windows would cover the whole run and nothing would be checked outside faults.
        let next = if rng.random_bool(0.5) {
            end + Duration::from_millis(rng.random_range(300..1_500))
        } else {
            Instant::now() + Duration::from_millis(rng.random_range(200..1_500))
        };
        tokio::time::sleep_until(next.into()).await;
    }
}
