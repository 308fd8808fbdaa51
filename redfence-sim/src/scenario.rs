//! One run's settings and fault schedule, all drawn from its seed.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redfence::testing::{Profile, SimFault};

/// What a run does: its clients, their settings, the faults and when.
#[derive(Debug)]
pub struct Scenario {
    /// The seed it was drawn from.
    pub seed: u64,
    /// Which server every simulated server answers as (Valkey 9.1 and Redis 8.6 take the
    /// plain commands).
    pub profile: Profile,
    /// Whether single-key locks go as plain commands where the servers have them.
    pub native_commands: bool,
    /// How many servers vote.
    pub servers: usize,
    /// How many clients (each its own `Redlock`) compete.
    pub clients: usize,
    /// Operations per client.
    pub ops: usize,
    /// The TTL of every lock (extensions take from a quarter to twice it).
    pub ttl: Duration,
    /// When `using()` extends: this long before the validity ends.
    pub threshold: Duration,
    /// The clients' node timeout.
    pub node_timeout: Duration,
    /// The clients' overall deadline for an acquire.
    pub acquire_timeout: Duration,
    /// The clients' bound on the fencing counter.
    pub fencing_timeout: Duration,
    /// Which clients use the fair line.
    pub fair: Vec<bool>,
    /// The resources the clients lock.
    pub resources: Vec<String>,
    /// The semaphore's permits (K).
    pub permits: u32,
    /// How likely a write follows a stall of the process.
    pub stall_chance: f64,
    /// The restart quarantine (on, as by default, unless the run breaks the assumptions).
    pub quarantine: bool,
    /// Each server's one-way latency range.
    pub latency: Vec<(Duration, Duration)>,
    /// The faults, by the time since the start.
    pub faults: Vec<(Duration, Fault)>,
    /// Why the run breaks the algorithm's stated assumptions, if it does: it is then checked
    /// against the weaker promise (the fenced store never takes a stale write).
    pub weakened: Option<&'static str>,
}

/// One fault, on server `server`.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Paused (requests wait), for this long.
    Pause(usize, Duration),
    /// Restarted without persistence.
    Restart(usize),
    /// Its connections reset.
    Reset(usize),
    /// Its next request answered with a fault.
    Next(usize, SimFault),
    /// Its clock's rate from now on.
    Rate(usize, f64),
    /// Its clock jumps forward by this many ms (beyond the drift bound: a weakened run).
    Jump(usize, i64),
    /// Its latency range from now on.
    Latency(usize, Duration, Duration),
}

impl Scenario {
    /// The run of `seed`.
    pub fn of(seed: u64) -> Scenario {
        let mut rng = StdRng::seed_from_u64(seed);
        let servers = 5;
        let clients = rng.random_range(2..=4);
        let ttl = Duration::from_millis(rng.random_range(200..=1_500));
        let node_timeout = Duration::from_millis(rng.random_range(10..=60));
        let weakened = match rng.random_range(0..20) {
            0 => Some("a server clock jumps beyond the drift bound"),
            1 => Some("restarts with the quarantine off"),
            _ => None,
        };
        let latencies: Vec<_> = (0..servers).map(|_| latency(&mut rng)).collect();
        let horizon = ttl * 12;
        let mut faults = Vec::new();
        let count = rng.random_range(0..=12);
        for _ in 0..count {
            let at = horizon.mul_f64(rng.random_range(0.0..1.0));
            // Server 4 never restarts in a run that keeps the assumptions: a memory lost on
            // every server at once is what the quarantine cannot see.
            let server = rng.random_range(0..servers);
            let fault = match rng.random_range(0..10) {
                0 | 1 => Fault::Pause(
                    server,
                    Duration::from_millis(rng.random_range(5..=ttl.as_millis() as u64 * 2)),
                ),
                2 if weakened.is_some() || server < servers - 1 => Fault::Restart(server),
                3 => Fault::Reset(server),
                4 => Fault::Next(
                    server,
                    match rng.random_range(0..5) {
                        0 => SimFault::Busy,
                        1 => SimFault::Loading,
                        2 => SimFault::Oom,
                        n => SimFault::Reset { applied: n == 3 },
                    },
                ),
                // Within the drift bound (1 %).
                5 => Fault::Rate(server, rng.random_range(0.995..1.005)),
                6 if weakened == Some("a server clock jumps beyond the drift bound") => {
                    Fault::Jump(server, ttl.as_millis() as i64 / 2)
                }
                7 => {
                    let (min, max) = latency(&mut rng);
                    Fault::Latency(server, min, max)
                }
                // Longer than the queue's patience (5 s), now and then.
                8 if rng.random_bool(0.3) => Fault::Pause(
                    server,
                    Duration::from_millis(rng.random_range(5_000..=8_000)),
                ),
                // Slower than the node timeout: calls time out, yet the server runs them.
                9 => Fault::Latency(server, node_timeout / 2, node_timeout * 2),
                _ => Fault::Pause(server, Duration::from_millis(rng.random_range(1..=30))),
            };
            faults.push((at, fault));
        }
        faults.sort_by_key(|(at, _)| *at);
        let threshold = ttl.mul_f64(rng.random_range(0.2..0.5));
        let profile = match rng.random_range(0..3) {
            0 => Profile::Redis7,
            1 => Profile::Valkey9,
            _ => Profile::Redis8,
        };
        let native_commands = rng.random_bool(0.6);
        let permits = rng.random_range(1..=3);
        Scenario {
            seed,
            profile,
            native_commands,
            servers,
            clients,
            ops: rng.random_range(3..=8),
            ttl,
            threshold,
            node_timeout,
            acquire_timeout: ttl * 2,
            fencing_timeout: Duration::from_millis(50),
            fair: (0..clients).map(|_| rng.random_bool(0.3)).collect(),
            resources: vec!["r0".to_owned(), "r1".to_owned()],
            permits,
            stall_chance: 0.1,
            quarantine: weakened != Some("restarts with the quarantine off"),
            latency: latencies,
            faults,
            weakened,
        }
    }

    /// How long an acquire may take: its deadline, then the attempt under way: its round
    /// (the nodes' timeout, and as much again for a call it waited behind in a node's queue)
    /// and the counter's timeout, with a millisecond of slack.
    pub fn acquire_bound(&self) -> Duration {
        self.acquire_timeout
            + self.node_timeout * 2
            + self.fencing_timeout
            + Duration::from_millis(1)
    }
}

/// A latency range: mostly fast, sometimes slow.
fn latency(rng: &mut StdRng) -> (Duration, Duration) {
    let min = Duration::from_micros(rng.random_range(20..=300));
    let max = if rng.random_bool(0.2) {
        min + Duration::from_millis(rng.random_range(1..=40))
    } else {
        min + Duration::from_micros(rng.random_range(0..=700))
    };
    (min, max)
}
