//! The simulated network under [`SimServers`](super::SimServers): each server's requests arrive after their
//! latency, in each connection's order, and run one at a time on its driver task while it is
//! not paused; faults apply as they run; replies travel back after their own latency.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use redis::{RedisError, Value};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::SimServer;
use super::requests::{adds_data, describe, refuse, releases, summarize};

/// What a simulated server's clock reads when the set starts (some day in 2023, in ms since
/// the Unix epoch), so that `TIME` looks like a real clock.
pub(super) const EPOCH_MS: u64 = 1_700_000_000_000;

/// A fault a simulated server answers its next request with (see [`SimServers::fail_next`](super::SimServers::fail_next)).
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

/// A connection reset by the peer.
pub(super) fn reset() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "simulated connection reset",
    ))
}

/// What the servers, their connections and their drivers share.
pub(crate) struct Network {
    pub(super) nodes: Vec<Mutex<Node>>,
    /// The latencies' generator (seeded: see [`SimServers::with_seed`]).
    pub(super) rng: Mutex<StdRng>,
    /// Tokio's instant at which every server's clock read [`EPOCH_MS`].
    pub(super) started: Instant,
    /// The requests run, as lines, when tracing.
    pub(super) trace: Mutex<Option<Vec<String>>>,
    /// Keys set to a token after its release ran on the server: (server, key, token).
    pub(super) ghosts: Mutex<Vec<(usize, String, String)>>,
    /// Numbers the connections.
    pub(super) connections: AtomicU64,
}

/// One simulated server and what is on its way to it.
pub(super) struct Node {
    pub(super) server: SimServer,
    /// Requests that have not run yet, in the order they were sent (each connection's in its
    /// order; between connections, those ready together run in an order drawn from the seed,
    /// as a server that resumes reads its sockets).
    pub(super) inbox: VecDeque<Delivery>,
    /// Wakes the driver: a request arrived, the server resumed.
    pub(super) wake: Arc<Notify>,
    pub(super) driver: Option<JoinHandle<()>>,
    pub(super) paused: bool,
    /// Counts the restarts and resets: a connection of an older one is broken.
    pub(super) incarnation: u64,
    /// Each connection's latest arrival and reply so far (both keep its order).
    pub(super) lines: BTreeMap<u64, (Instant, Instant)>,
    /// The one-way latency, drawn uniformly in this range for each request and each reply.
    pub(super) latency: (Duration, Duration),
    /// The server's clock: `EPOCH_MS + offset_ms + rate × elapsed`.
    pub(super) offset_ms: i64,
    pub(super) rate: f64,
    /// Faults for the next requests, in order.
    pub(super) faults: VecDeque<SimFault>,
    /// The tokens whose release has run here: a key set to one of them afterwards is a
    /// ghost (a lock's release overtaken by its own earlier request).
    pub(super) released: std::collections::BTreeSet<Vec<u8>>,
}

/// A request on its way to a server: its commands (a pipeline, or one).
pub(super) struct Delivery {
    arrive_at: Instant,
    commands: Vec<Vec<Vec<u8>>>,
    pub(super) incarnation: u64,
    /// The connection it was sent on.
    line: u64,
    fault: Option<SimFault>,
    reply: oneshot::Sender<(Vec<Value>, Instant)>,
}

/// `mutex`'s guard, poisoned or not (a panic holding it has failed the test already).
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Network {
    /// Milliseconds since the set started, on Tokio's clock.
    pub(super) fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// `node`'s clock now, in ms since the Unix epoch.
    pub(super) fn server_ms(&self, node: &Node) -> u64 {
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
    pub(super) async fn send(
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
