//! [`SimServers`]: simulated Redis servers behind simulated connections, for tests and the
//! deterministic simulation. Each server runs redfence's real scripts ([`SimServer`]) on a
//! clock of its own; requests reach it in order after a latency and run one at a time;
//! faults (a pause, a restart without persistence, a reset connection, `BUSY` / `LOADING` /
//! `OOM` replies, a clock that drifts or jumps) are injected by the test.
//!
//! Everything runs on Tokio's clock: under a paused clock (`start_paused`) a run is decided by
//! its seed alone.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use redis::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::SimServer;
use super::network::{EPOCH_MS, Network, Node, SimFault, lock};
use super::profile::Profile;
use super::wire::SimEndpoint;

/// A set of simulated Redis servers (7.0 by default; Valkey 9.1 or Redis 8.6 by
/// [`with_profile`](Self::with_profile)) for a `Redlock` to vote over, driven by Tokio's clock.
///
/// Build a client over them with [`SimServers::addrs`] and the usual builder, then steer the
/// servers: pause one, restart it, expire a lock, shift its clock. Create the set inside the
/// Tokio runtime that will use it (its clocks start at Tokio's now).
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), redfence::Error> {
/// use std::time::Duration;
/// use redfence::Redlock;
/// use redfence::testing::SimServers;
///
/// let servers = SimServers::new(3);
/// let redlock = Redlock::builder().nodes(servers.addrs()).build()?;
/// let lock = redlock.acquire(&["invoice:42"], Duration::from_secs(10)).await?;
/// assert_eq!(servers.holders("invoice:42"), 3);
/// lock.release().await?;
/// assert_eq!(servers.holders("invoice:42"), 0);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SimServers {
    pub(super) net: Arc<Network>,
}

impl SimServers {
    /// `n` healthy servers with a latency of 50–500 µs each way.
    pub fn new(n: usize) -> Self {
        Self::with_seed(n, 0)
    }

    /// `n` healthy servers whose latencies are drawn from `seed`.
    pub fn with_seed(n: usize, seed: u64) -> Self {
        Self::with_profile(n, seed, Profile::Redis7)
    }

    /// `n` healthy servers that answer as `profile` does (its plain commands, its `INFO`),
    /// their latencies drawn from `seed`.
    pub fn with_profile(n: usize, seed: u64, profile: Profile) -> Self {
        let now = Instant::now();
        let nodes = (0..n)
            .map(|index| {
                let mut server = SimServer::with_profile(profile, EPOCH_MS);
                server.set_serial(index as u64);
                Mutex::new(Node {
                    server,
                    inbox: VecDeque::new(),
                    wake: Arc::new(Notify::new()),
                    driver: None,
                    paused: false,
                    incarnation: 0,
                    lines: BTreeMap::new(),
                    latency: (Duration::from_micros(50), Duration::from_micros(500)),
                    offset_ms: 0,
                    rate: 1.0,
                    faults: VecDeque::new(),
                    released: std::collections::BTreeSet::new(),
                })
            })
            .collect();
        SimServers {
            net: Arc::new(Network {
                nodes,
                rng: Mutex::new(StdRng::seed_from_u64(seed)),
                started: now,
                trace: Mutex::new(None),
                ghosts: Mutex::new(Vec::new()),
                connections: AtomicU64::new(0),
            }),
        }
    }

    /// How many servers there are.
    pub fn len(&self) -> usize {
        self.net.nodes.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.net.nodes.is_empty()
    }

    /// The servers' addresses, for [`RedlockBuilder::nodes`](crate::RedlockBuilder::nodes).
    pub fn addrs(&self) -> Vec<crate::NodeAddr> {
        (0..self.len())
            .map(|index| {
                crate::NodeAddr::simulated(SimEndpoint {
                    net: Arc::clone(&self.net),
                    index,
                })
            })
            .collect()
    }

    /// Server `index`, or a panic naming the index (a test's mistake).
    fn node(&self, index: usize) -> MutexGuard<'_, Node> {
        match self.net.nodes.get(index) {
            Some(node) => lock(node),
            None => panic!("no simulated server {index} (there are {})", self.len()),
        }
    }

    /// Stops server `index` from running anything: requests wait for [`resume`](Self::resume)
    /// (as behind a `SIGSTOP`), their callers time out meanwhile.
    pub fn pause(&self, index: usize) {
        self.node(index).paused = true;
    }

    /// Lets server `index` run again, the requests that waited first, in order.
    pub fn resume(&self, index: usize) {
        let mut node = self.node(index);
        node.paused = false;
        node.wake.notify_one();
    }

    /// Restarts server `index` without persistence: every key and loaded script is gone, its
    /// `run_id` is new and its uptime starts again; its connections break, and the requests
    /// still on their way are lost.
    pub fn restart(&self, index: usize) {
        let mut node = self.node(index);
        node.server.restart();
        node.incarnation += 1;
    }

    /// Breaks every connection to server `index` (its keys stay): requests on their way are
    /// lost, the next call reconnects.
    pub fn reset_connections(&self, index: usize) {
        self.node(index).incarnation += 1;
    }

    /// Answers server `index`'s next request with `fault` (after any faults already set).
    pub fn fail_next(&self, index: usize, fault: SimFault) {
        self.node(index).faults.push_back(fault);
    }

    /// Sets server `index`'s one-way latency: each request and each reply takes a time drawn
    /// uniformly between `min` and `max` (the order of a connection is kept).
    pub fn set_latency(&self, index: usize, min: Duration, max: Duration) {
        self.node(index).latency = (min, max.max(min));
    }

    /// Moves server `index`'s clock by `by_ms` milliseconds at once (a jump; keys with a TTL
    /// expire by that clock).
    pub fn shift_clock(&self, index: usize, by_ms: i64) {
        let mut node = self.node(index);
        node.offset_ms = node.offset_ms.saturating_add(by_ms);
    }

    /// Makes server `index`'s clock run at `rate` times the true rate from now on (1.01: 1 %
    /// fast), its reading continuous.
    pub fn set_clock_rate(&self, index: usize, rate: f64) {
        let elapsed = self.net.elapsed_ms() as f64;
        let mut node = self.node(index);
        let now = node.offset_ms as f64 + node.rate * elapsed;
        node.rate = rate;
        node.offset_ms = (now - rate * elapsed).round() as i64;
    }

    /// Runs `f` on server `index`, its clock set to now.
    fn with_server<R>(&self, index: usize, f: impl FnOnce(&mut SimServer) -> R) -> R {
        let mut node = self.node(index);
        let now = self.net.server_ms(&node);
        node.server.set_time(now);
        f(&mut node.server)
    }

    /// Expires `key` at once on every server (as its TTL running out would).
    pub fn expire(&self, key: &str) {
        for index in 0..self.len() {
            self.with_server(index, |server| {
                server.command(&[b"DEL".to_vec(), key.as_bytes().to_vec()])
            });
        }
    }

    /// The string value at `key` on server `index`, if it holds one that has not expired.
    pub fn get(&self, index: usize, key: &str) -> Option<Vec<u8>> {
        self.with_server(index, |server| server.get(key))
    }

    /// On how many servers `key` holds a value that has not expired.
    pub fn holders(&self, key: &str) -> usize {
        (0..self.len())
            .filter(|&index| self.get(index, key).is_some())
            .count()
    }

    /// The keys of server `index` that have not expired, sorted.
    pub fn keys(&self, index: usize) -> Vec<String> {
        let reply = self.with_server(index, |server| {
            server.command(&[b"SCAN".to_vec(), b"0".to_vec()])
        });
        // One reply holds every key: [cursor 0, keys].
        let mut keys: Vec<String> = match reply {
            Value::Array(mut reply) if reply.len() == 2 => match reply.pop() {
                Some(Value::Array(keys)) => keys,
                _ => Vec::new(),
            }
            .into_iter()
            .filter_map(|key| match key {
                Value::BulkString(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
                _ => None,
            })
            .collect(),
            _ => Vec::new(),
        };
        keys.sort();
        keys
    }

    /// Keys that were set to a lock's token after that lock's release had run on their
    /// server (a release overtaken by its own acquire or extension): (server, key, token).
    pub fn ghosts(&self) -> Vec<(usize, String, String)> {
        lock(&self.net.ghosts).clone()
    }

    /// Starts recording every request the servers run (see [`take_trace`](Self::take_trace)).
    pub fn trace(&self) {
        *lock(&self.net.trace) = Some(Vec::new());
    }

    /// The requests run since the last call, one line each: the simulated time, the server,
    /// the commands and the replies.
    pub fn take_trace(&self) -> Vec<String> {
        lock(&self.net.trace)
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }
}

impl std::fmt::Debug for SimServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimServers")
            .field("servers", &self.len())
            .finish_non_exhaustive()
    }
}
