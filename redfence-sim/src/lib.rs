#![warn(missing_docs)]
//! Deterministic simulation of redfence: the real client (`Redlock`, its node queues with
//! batching and resends, the restart quarantine, the lease keeper, `using()`, fencing) over
//! simulated Redis servers that run the real Lua scripts ([`redfence::testing::SimServers`]),
//! on a current-thread Tokio runtime whose clock is paused. Every choice — the clients'
//! tokens and jitter, the latencies, the faults and their times — comes from one seed, so a
//! run that fails is replayed exactly from it.
//!
//! Each run draws a [`Scenario`], runs its clients beside its faults,
//! closes the clients, and checks the [`History`] on true time
//! ([`check::violations`]).

pub mod check;
pub mod history;
pub mod scenario;
pub mod workload;

use std::sync::Arc;
use std::time::Duration;

use redfence::testing::{Plant, SimServers};
use redfence::{Backoff, MemoryCounter, Redlock};

use crate::history::History;
use crate::scenario::{Fault, Scenario};
use crate::workload::{Client, ELECTION, FencedStore, RWLOCK, SEMAPHORE, client_rng};

/// What one run found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The seed run.
    pub seed: u64,
    /// What the checkers found (empty: the run passed).
    pub violations: Vec<String>,
    /// Locks, permits and scopes granted.
    pub grants: u64,
    /// Faults injected.
    pub faults: u64,
    /// Whether the run broke the algorithm's assumptions (and was checked against the weaker
    /// promise).
    pub weakened: bool,
    /// The run's events and the servers' requests, in time order, when traced.
    pub trace: Vec<String>,
}

/// How to run a seed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// A historical bug put back.
    pub plant: Option<Plant>,
    /// Record the trace.
    pub trace: bool,
    /// The servers' profile for every seed (by default each seed draws one).
    pub profile: Option<redfence::testing::Profile>,
}

/// Runs the seed `seed`.
pub fn run_seed(seed: u64, options: Options) -> Outcome {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time().start_paused(true);
    // The order in which `tokio::select!` polls its branches, from the seed too.
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()));
    let runtime = match builder.build() {
        Ok(runtime) => runtime,
        Err(err) => {
            return Outcome {
                seed,
                violations: vec![format!("no runtime: {err}")],
                ..Outcome::default()
            };
        }
    };
    redfence::testing::plant_thread(options.plant);
    let outcome = runtime.block_on(async {
        redfence::testing::seed_thread(Some(seed));
        run(seed, options).await
    });
    redfence::testing::plant_thread(None);
    redfence::testing::seed_thread(None);
    outcome
}

async fn run(seed: u64, options: Options) -> Outcome {
    let mut scenario = Scenario::of(seed);
    if let Some(profile) = options.profile {
        scenario.profile = profile;
    }
    let scenario = Arc::new(scenario);
    let servers = SimServers::with_profile(scenario.servers, seed, scenario.profile);
    if options.trace {
        servers.trace();
    }
    for (index, (min, max)) in scenario.latency.iter().enumerate() {
        servers.set_latency(index, *min, *max);
    }
    let history = History::new(options.trace);
    let store = Arc::new(FencedStore::default());
    let counter = Arc::new(MemoryCounter::new());
    let mut clients = Vec::new();
    for index in 0..scenario.clients {
        let mut builder = Redlock::builder()
            .nodes(servers.addrs())
            .node_timeout(scenario.node_timeout)
            .automatic_extension_threshold(scenario.threshold)
            .native_commands(scenario.native_commands)
            .acquire_timeout(scenario.acquire_timeout)
            .backoff(Backoff::fixed(scenario.ttl / 8, scenario.ttl / 16).retries(1_000))
            .fencing(Arc::clone(&counter))
            .fencing_timeout(scenario.fencing_timeout)
            .fair(scenario.fair[index]);
        if !scenario.quarantine {
            builder = builder.restart_quarantine(Duration::ZERO);
        }
        match builder.build() {
            Ok(redlock) => clients.push(redlock),
            Err(err) => {
                return Outcome {
                    seed,
                    violations: vec![format!("client {index} not built: {err}")],
                    ..Outcome::default()
                };
            }
        }
    }
    let faults = tokio::spawn(inject(
        servers.clone(),
        Arc::clone(&scenario),
        history.clone(),
    ));
    let mut tasks = Vec::new();
    for (index, redlock) in clients.iter().enumerate() {
        let client = Client {
            name: format!("c{index}"),
            redlock: redlock.clone(),
            rng: client_rng(seed, index),
            history: history.clone(),
            store: Arc::clone(&store),
            scenario: Arc::clone(&scenario),
        };
        tasks.push(tokio::spawn(client.run()));
    }
    let mut violations = Vec::new();
    for (index, task) in tasks.into_iter().enumerate() {
        if let Err(err) = task.await {
            violations.push(format!("client c{index} panicked: {err}"));
        }
    }
    let _ = faults.await;
    for index in 0..scenario.servers {
        servers.resume(index);
    }
    for redlock in &clients {
        redlock.close().await;
    }
    for (server, key, token) in servers.ghosts() {
        violations.push(format!(
            "server {server} set {key} to {} after its release had run there",
            token.get(..8).unwrap_or(&token)
        ));
    }
    // Past the longest TTL (an extension may double it) and any server clock's drift over it:
    // every key a release gave up on has expired by then.
    tokio::time::sleep(scenario.ttl * 2 + scenario.ttl / 25 + Duration::from_millis(2)).await;
    let leftovers: Vec<String> = (0..scenario.servers)
        .flat_map(|index| {
            servers
                .keys(index)
                .into_iter()
                .filter(|key| {
                    // The lock keys (not the semaphore's size claim, kept by design).
                    scenario.resources.contains(key)
                        || key
                            .strip_prefix(&format!("{SEMAPHORE}:semaphore:slot:"))
                            .is_some_and(|slot| slot.bytes().all(|b| b.is_ascii_digit()))
                        || *key == format!("{RWLOCK}:rwlock:writer")
                        || *key == format!("{RWLOCK}:rwlock:readers")
                        || *key == format!("election:{ELECTION}")
                })
                .map(move |key| {
                    format!("server {index} still holds {key} after close() and the longest TTL")
                })
        })
        .collect();
    let record = history.record();
    violations.extend(check::violations(
        &record,
        scenario.weakened.is_some(),
        scenario.permits,
        &leftovers,
    ));
    let mut trace = Vec::new();
    if options.trace {
        trace.push(format!("{scenario:?}"));
        let mut lines: Vec<(f64, String)> = record.events.clone();
        for line in servers.take_trace() {
            let at = line
                .trim_start()
                .split("ms")
                .next()
                .and_then(|t| t.trim().parse::<f64>().ok())
                .unwrap_or(0.0);
            lines.push((at, line));
        }
        lines.sort_by(|a, b| a.0.total_cmp(&b.0));
        trace.extend(lines.into_iter().map(|(at, line)| {
            if line.contains("ms s") {
                line
            } else {
                format!("{at:>10.3}ms {line}")
            }
        }));
    }
    Outcome {
        seed,
        violations,
        grants: record.grants,
        faults: record.faults,
        weakened: scenario.weakened.is_some(),
        trace,
    }
}

/// Injects the scenario's faults at their times, then lets every server run again.
async fn inject(servers: SimServers, scenario: Arc<Scenario>, history: History) {
    let start = tokio::time::Instant::now();
    let mut resumes: Vec<(tokio::time::Instant, usize)> = Vec::new();
    for (at, fault) in scenario.faults.iter().copied() {
        let when = start + at;
        // Resume what is due before this fault.
        resumes.sort();
        while let Some(&(due, server)) = resumes.first()
            && due <= when
        {
            tokio::time::sleep_until(due).await;
            servers.resume(server);
            history.event(|| format!("fault: server {server} resumes"));
            resumes.remove(0);
        }
        tokio::time::sleep_until(when).await;
        history.record().faults += 1;
        history.event(|| format!("fault: {fault:?}"));
        match fault {
            Fault::Pause(server, length) => {
                servers.pause(server);
                resumes.push((tokio::time::Instant::now() + length, server));
            }
            Fault::Restart(server) => servers.restart(server),
            Fault::Reset(server) => servers.reset_connections(server),
            Fault::Next(server, fault) => servers.fail_next(server, fault),
            Fault::Rate(server, rate) => servers.set_clock_rate(server, rate),
            Fault::Jump(server, ms) => servers.shift_clock(server, ms),
            Fault::Latency(server, min, max) => servers.set_latency(server, min, max),
        }
    }
    resumes.sort();
    for (due, server) in resumes {
        tokio::time::sleep_until(due).await;
        servers.resume(server);
        history.event(|| format!("fault: server {server} resumes"));
    }
}
