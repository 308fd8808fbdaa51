//! [`SimServers`]: simulated Redis servers behind simulated connections, for tests and the
//! deterministic simulation. Each server runs redfence's real scripts ([`SimServer`]) on a
//! clock of its own; requests reach it in order after a latency and run one at a time;
//! faults (a pause, a restart without persistence, a reset connection, `BUSY` / `LOADING` /
//! `OOM` replies, a clock that drifts or jumps) are injected by the test.
//!
//! Everything runs on Tokio's clock: under a paused clock (`start_paused`) a run is decided by
//! its seed alone.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::{RedisError, Value};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::SimServer;
use super::profile::Profile;

/// What a simulated server's clock reads when the set starts (some day in 2023, in ms since
/// the Unix epoch), so that `TIME` looks like a real clock.
const EPOCH_MS: u64 = 1_700_000_000_000;

/// A fault a simulated server answers its next request with (see [`SimServers::fail_next`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SimFault {
    /// `BUSY`: a script is running (every command of the request is refused).
    Busy,
    /// `LOADING`: the server is loading its data set.
    Loading,
    /// `OOM`: the server is out of memory (commands that would add data are refused).
    Oom,
    /// The connection is reset with the request on the way: the server ran it (`applied`) or
    /// never saw it, and its reply is lost either way. Every request sent on the server's
    /// connections before it and not yet answered is lost with it.
    Reset {
        /// Whether the server ran the request before the connection broke.
        applied: bool,
    },
}

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
    net: Arc<Network>,
}

/// What the servers, their connections and their drivers share.
pub(crate) struct Network {
    nodes: Vec<Mutex<Node>>,
    /// The latencies' generator (seeded: see [`SimServers::with_seed`]).
    rng: Mutex<StdRng>,
    /// Tokio's instant at which every server's clock read [`EPOCH_MS`].
    started: Instant,
    /// The requests run, as lines, when tracing.
    trace: Mutex<Option<Vec<String>>>,
    /// Keys set to a token after its release ran on the server: (server, key, token).
    ghosts: Mutex<Vec<(usize, String, String)>>,
    /// Numbers the connections.
    connections: AtomicU64,
}

/// One simulated server and what is on its way to it.
struct Node {
    server: SimServer,
    /// Requests that have not run yet, in the order they were sent (each connection's in its
    /// order; between connections, those ready together run in an order drawn from the seed,
    /// as a server that resumes reads its sockets).
    inbox: VecDeque<Delivery>,
    /// Wakes the driver: a request arrived, the server resumed.
    wake: Arc<Notify>,
    driver: Option<JoinHandle<()>>,
    paused: bool,
    /// Counts the restarts and resets: a connection of an older one is broken.
    incarnation: u64,
    /// Each connection's latest arrival and reply so far (both keep its order).
    lines: BTreeMap<u64, (Instant, Instant)>,
    /// The one-way latency, drawn uniformly in this range for each request and each reply.
    latency: (Duration, Duration),
    /// The server's clock: `EPOCH_MS + offset_ms + rate × elapsed`.
    offset_ms: i64,
    rate: f64,
    /// Faults for the next requests, in order.
    faults: VecDeque<SimFault>,
    /// The tokens whose release has run here: a key set to one of them afterwards is a
    /// ghost (a lock's release overtaken by its own earlier request).
    released: std::collections::BTreeSet<Vec<u8>>,
}

/// A request on its way to a server: its commands (a pipeline, or one).
struct Delivery {
    arrive_at: Instant,
    commands: Vec<Vec<Vec<u8>>>,
    incarnation: u64,
    /// The connection it was sent on.
    line: u64,
    fault: Option<SimFault>,
    reply: oneshot::Sender<(Vec<Value>, Instant)>,
}

/// `mutex`'s guard, poisoned or not (a panic holding it has failed the test already).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
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

impl Network {
    /// Milliseconds since the set started, on Tokio's clock.
    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// `node`'s clock now, in ms since the Unix epoch.
    fn server_ms(&self, node: &Node) -> u64 {
        let reading = node.offset_ms as f64 + node.rate * self.elapsed_ms() as f64;
        EPOCH_MS.saturating_add_signed(reading.round() as i64)
    }

    /// A latency drawn in `range`.
    fn draw(&self, (min, max): (Duration, Duration)) -> Duration {
        if max <= min {
            return min;
        }
        lock(&self.rng).random_range(min..=max)
    }

    /// Sends `commands` to server `index` on connection `line` of `incarnation`: their
    /// replies, or a lost connection.
    async fn send(
        self: &Arc<Self>,
        index: usize,
        (incarnation, line): (u64, u64),
        commands: Vec<Vec<Vec<u8>>>,
    ) -> Result<Vec<Value>, RedisError> {
        let (tx, rx) = oneshot::channel();
        {
            let Some(node) = self.nodes.get(index) else {
                return Err(reset());
            };
            let mut node = lock(node);
            if node.incarnation != incarnation {
                return Err(reset());
            }
            let fault = node.faults.pop_front();
            let now = Instant::now();
            let latency = self.draw(node.latency);
            let order = node.lines.entry(line).or_insert((now, now));
            order.0 = (now + latency).max(order.0);
            let arrive_at = order.0;
            node.inbox.push_back(Delivery {
                arrive_at,
                commands,
                incarnation,
                line,
                fault,
                reply: tx,
            });
            if node.driver.as_ref().is_none_or(JoinHandle::is_finished) {
                let net = Arc::clone(self);
                node.driver = Some(tokio::spawn(async move { net.drive(index).await }));
            }
            node.wake.notify_one();
        }
        let (replies, at) = rx.await.map_err(|_| reset())?;
        tokio::time::sleep_until(at).await;
        Ok(replies)
    }

    /// Runs server `index`'s requests as they arrive, one at a time, while it is not paused.
    async fn drive(self: Arc<Self>, index: usize) {
        let Some(slot) = self.nodes.get(index) else {
            return;
        };
        loop {
            let (wake, next) = {
                let node = lock(slot);
                let next = (!node.paused)
                    .then(|| node.inbox.iter().map(|d| d.arrive_at).min())
                    .flatten();
                (Arc::clone(&node.wake), next)
            };
            let Some(arrive_at) = next else {
                wake.notified().await;
                continue;
            };
            tokio::select! {
                () = tokio::time::sleep_until(arrive_at) => {}
                // Something arrived sooner, or the server was paused.
                () = wake.notified() => continue,
            }
            let mut node = lock(slot);
            if node.paused {
                continue;
            }
            if let Some(delivery) = self.next_ready(&mut node) {
                self.run(index, &mut node, delivery);
            }
        }
    }

    /// The next request to run on `node`: of the connections whose first request has arrived,
    /// one drawn from the seed (the only one, unless the server was paused).
    fn next_ready(&self, node: &mut Node) -> Option<Delivery> {
        let now = Instant::now();
        let mut heads: Vec<usize> = Vec::new();
        let mut seen: Vec<u64> = Vec::new();
        for (position, delivery) in node.inbox.iter().enumerate() {
            if seen.contains(&delivery.line) {
                continue;
            }
            seen.push(delivery.line);
            if delivery.arrive_at <= now {
                heads.push(position);
            }
        }
        let pick = match heads.len() {
            0 => return None,
            1 => heads[0],
            n => heads[lock(&self.rng).random_range(0..n)],
        };
        node.inbox.remove(pick)
    }

    /// Runs one request on `node` (server `index`) and sends its replies, at their time.
    fn run(&self, index: usize, node: &mut Node, delivery: Delivery) {
        let broken = delivery.incarnation != node.incarnation;
        let applied = match delivery.fault {
            Some(SimFault::Reset { applied }) => {
                node.incarnation += 1;
                applied && !broken
            }
            _ => !broken,
        };
        let now = self.server_ms(node);
        node.server.set_time(now);
        let replies: Vec<Value> = match delivery.fault {
            _ if !applied => Vec::new(),
            Some(SimFault::Busy) => refuse(
                &delivery.commands,
                "BUSY Redis is busy running a script. You can only call SCRIPT KILL or \
                 SHUTDOWN NOSCRIPT.",
            ),
            Some(SimFault::Loading) => refuse(
                &delivery.commands,
                "LOADING Redis is loading the dataset in memory",
            ),
            // Over maxmemory a server refuses what adds data (a `SET`, a script that sets a
            // key); it still deletes and expires, so releases and extensions go through.
            Some(SimFault::Oom) if delivery.commands.iter().any(|args| adds_data(args)) => refuse(
                &delivery.commands,
                "OOM command not allowed when used memory > 'maxmemory'.",
            ),
            _ => {
                let replies = delivery
                    .commands
                    .iter()
                    .map(|args| node.server.command(args))
                    .collect();
                self.watch(index, node, &delivery.commands);
                replies
            }
        };
        self.record(index, &delivery, &replies, applied, broken);
        if broken || matches!(delivery.fault, Some(SimFault::Reset { .. })) {
            // The reply is lost with the connection: the caller's channel closes.
            return;
        }
        let now = Instant::now();
        let latency = self.draw(node.latency);
        let order = node.lines.entry(delivery.line).or_insert((now, now));
        order.1 = (now + latency).max(order.1);
        let _ = delivery.reply.send((replies, order.1));
    }

    /// Notes the releases among `commands` (run on `node`, server `index`) and any key they
    /// name that now holds a token released there before: a ghost.
    fn watch(&self, index: usize, node: &mut Node, commands: &[Vec<Vec<u8>>]) {
        let mut named: Vec<&[u8]> = Vec::new();
        for args in commands {
            let (keys, released) = releases(args);
            named.extend(keys);
            let holds = |node: &Node, key: &[u8]| {
                node.server
                    .get(&String::from_utf8_lossy(key))
                    .filter(|value| node.released.contains(value))
            };
            for key in &named {
                if let Some(token) = holds(node, key) {
                    let ghost = (
                        index,
                        String::from_utf8_lossy(key).into_owned(),
                        String::from_utf8_lossy(&token).into_owned(),
                    );
                    let mut ghosts = lock(&self.ghosts);
                    if !ghosts.contains(&ghost) {
                        ghosts.push(ghost);
                    }
                }
            }
            named.clear();
            node.released.extend(released);
        }
    }

    /// Records one request in the trace, when tracing.
    fn record(
        &self,
        index: usize,
        delivery: &Delivery,
        replies: &[Value],
        ran: bool,
        broken: bool,
    ) {
        let mut trace = lock(&self.trace);
        let Some(lines) = trace.as_mut() else {
            return;
        };
        let mut line = format!(
            "{:>10.3}ms s{index} c{} ",
            self.started.elapsed().as_secs_f64() * 1000.0,
            delivery.line
        );
        let names: Vec<String> = delivery
            .commands
            .iter()
            .map(|args| describe(args))
            .collect();
        line.push_str(&names.join(" | "));
        match (delivery.fault, ran, broken) {
            (_, _, true) => line.push_str(" -> lost (connection broken before it arrived)"),
            (Some(SimFault::Reset { applied }), _, _) => {
                let _ = write!(line, " -> reset (applied: {applied})");
            }
            (_, false, _) => line.push_str(" -> not run"),
            _ => {
                let _ = write!(line, " -> {}", summarize(replies));
            }
        }
        lines.push(line);
    }
}

/// A command, shortly: its name, and for a script call its keys and arguments (tokens cut
/// to 8 characters).
fn describe(args: &[Vec<u8>]) -> String {
    let word = |arg: &Vec<u8>| {
        let text = String::from_utf8_lossy(arg);
        if text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            text[..8].to_owned()
        } else {
            text.chars().take(24).collect()
        }
    };
    let name = args
        .first()
        .map(word)
        .unwrap_or_default()
        .to_ascii_uppercase();
    match name.as_str() {
        "EVALSHA" | "EVAL" => {
            let keys = args
                .get(2)
                .and_then(|n| String::from_utf8_lossy(n).parse::<usize>().ok())
                .unwrap_or(0);
            let listed = |from: usize, to: usize| {
                args.get(from..to.min(args.len()))
                    .unwrap_or_default()
                    .iter()
                    .map(word)
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let sha = args.get(1).map(word).unwrap_or_default();
            let mut text = format!(
                "{name} {} [{}] {}",
                sha.get(..8).unwrap_or(&sha),
                listed(3, 3 + keys),
                listed(3 + keys, args.len())
            );
            if text.len() > 140 {
                text = text.chars().take(140).collect::<String>() + "…";
            }
            text
        }
        "INFO" | "SCRIPT" => name,
        _ => args.iter().take(4).map(word).collect::<Vec<_>>().join(" "),
    }
}

/// Replies, shortly.
fn summarize(replies: &[Value]) -> String {
    let text = format!("{replies:?}");
    if text.len() > 100 {
        let cut: String = text.chars().take(100).collect();
        format!("{cut}…")
    } else {
        text
    }
}

/// The keys a command names and the tokens it releases: a call of the batch script
/// (`r`, `R` and `n` operations; see `scripts/batch.lua`) or a plain compare-and-delete.
fn releases(args: &[Vec<u8>]) -> (Vec<&[u8]>, Vec<Vec<u8>>) {
    let name = args
        .first()
        .map(|n| n.to_ascii_uppercase())
        .unwrap_or_default();
    let arg = |i: usize| args.get(i).map(Vec::as_slice).unwrap_or_default();
    match name.as_slice() {
        b"DELIFEQ" => (vec![arg(1)], vec![arg(2).to_vec()]),
        b"DELEX" if arg(2).eq_ignore_ascii_case(b"IFEQ") => (vec![arg(1)], vec![arg(3).to_vec()]),
        b"SET" => (vec![arg(1)], Vec::new()),
        b"EVALSHA" | b"EVAL" => {
            let count = |i: usize| {
                std::str::from_utf8(arg(i))
                    .ok()
                    .and_then(|n| n.parse::<usize>().ok())
                    .unwrap_or(0)
            };
            let keys = count(2);
            let named: Vec<&[u8]> = (3..3 + keys).map(arg).collect();
            let mut released = Vec::new();
            // Only the batch script's operations have this shape; other scripts name keys.
            let mut i = 3 + keys;
            let mut key = 0;
            while i + 3 < args.len() {
                let kind = arg(i);
                let n = count(i + 3);
                if matches!(kind, b"r" | b"R" | b"n") {
                    released.push(arg(i + 1).to_vec());
                }
                key += n;
                i += 4 + match kind {
                    b"f" | b"l" | b"R" => 3,
                    k if k.len() == 2 => 2,
                    _ => 0,
                };
            }
            let _ = key;
            (named, released)
        }
        _ => (Vec::new(), Vec::new()),
    }
}

/// Whether a command may add data (what a server over its memory limit refuses): a `SET`,
/// or a call of redfence's scripts that acquires (batch operations `a`, `f`, `ra`, `wa`), sets
/// missing keys again (`E`) or writes the memory marker (`scripts/memory.lua`, whose first key
/// is the marker).
fn adds_data(args: &[Vec<u8>]) -> bool {
    let name = args
        .first()
        .map(|n| n.to_ascii_uppercase())
        .unwrap_or_default();
    match name.as_slice() {
        b"SET" => true,
        b"EVALSHA" | b"EVAL" => {
            let keys = args
                .get(2)
                .and_then(|n| std::str::from_utf8(n).ok()?.parse::<usize>().ok())
                .unwrap_or(0);
            let marker_first = args
                .get(3)
                .is_some_and(|key| key.ends_with(b"redfence:memory"));
            let argv = args.get(3 + keys..).unwrap_or_default();
            marker_first
                || argv
                    .iter()
                    .any(|arg| matches!(arg.as_slice(), b"a" | b"f" | b"E" | b"ra" | b"wa"))
        }
        _ => false,
    }
}

/// The error reply `message` for each of `commands`.
fn refuse(commands: &[Vec<Vec<u8>>], message: &str) -> Vec<Value> {
    commands
        .iter()
        .map(|_| super::reply::error(message))
        .collect()
}

/// A connection reset by the peer.
fn reset() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "simulated connection reset",
    ))
}

/// One simulated server, as a node address names it.
#[derive(Clone)]
pub(crate) struct SimEndpoint {
    net: Arc<Network>,
    index: usize,
}

impl SimEndpoint {
    /// How the server is named in messages and rosters.
    pub(crate) fn name(&self) -> String {
        format!("sim:{}", self.index)
    }

    /// A connection to the server (as redis-rs's connection manager: after a lost
    /// connection, the next call reconnects).
    pub(crate) fn connect(&self) -> Wire {
        let wire = Wire {
            net: Arc::clone(&self.net),
            index: self.index,
            line: Arc::new(Mutex::new((0, 0))),
        };
        wire.reconnect();
        wire
    }
}

impl std::fmt::Debug for SimEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// A connection to a simulated server, shared by its clones (a multiplexed connection).
#[derive(Clone)]
pub(crate) struct Wire {
    net: Arc<Network>,
    index: usize,
    /// The server incarnation it is connected to, and the connection's number: a reset or a
    /// restart breaks it once, then the next call is on a new connection.
    line: Arc<Mutex<(u64, u64)>>,
}

impl Wire {
    /// Connects again: to the server's current incarnation, as a new connection.
    fn reconnect(&self) {
        let incarnation = self
            .net
            .nodes
            .get(self.index)
            .map_or(0, |node| lock(node).incarnation);
        let number = self.net.connections.fetch_add(1, Ordering::Relaxed);
        *lock(&self.line) = (incarnation, number);
    }

    /// Sends `commands`; a lost connection fails this call, and the next reconnects.
    async fn call(&self, commands: Vec<Vec<Vec<u8>>>) -> Result<Vec<Value>, RedisError> {
        let line = *lock(&self.line);
        let result = self.net.send(self.index, line, commands).await;
        if result.is_err() && *lock(&self.line) == line {
            self.reconnect();
        }
        result
    }
}

/// A command's arguments as bytes.
fn args_of(cmd: &redis::Cmd) -> Vec<Vec<u8>> {
    cmd.args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => bytes.to_vec(),
            // A cursor argument (the only other kind): the simulated scans end at once.
            _ => b"0".to_vec(),
        })
        .collect()
}

impl redis::aio::ConnectionLike for Wire {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut replies = self.call(vec![args_of(cmd)]).await?;
            match replies.pop() {
                Some(Value::ServerError(err)) => Err(err.into()),
                Some(value) => Ok(value),
                None => Err(reset()),
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let commands = pipeline.cmd_iter().map(args_of).collect();
            let replies = self.call(commands).await?;
            Ok(replies.into_iter().skip(offset).take(count).collect())
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
