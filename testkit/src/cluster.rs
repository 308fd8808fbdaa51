//! One face for two harnesses, so that the safety scenarios run against both:
//! local `redis-server` processes behind fault proxies ([`LocalCluster`]), and the five-node
//! docker-compose project of `docker/` ([`ComposeCluster`]).

use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::Servers;
use crate::proxy::{Mode, Proxy};

/// Five (or N) independent masters with faults to inject. Node indexes start at 0.
#[allow(clippy::len_without_is_empty)] // never empty: a harness starts one node at least
pub trait Cluster {
    /// A short name for messages.
    fn name(&self) -> &'static str;
    /// The URLs a `Redlock` should use.
    fn urls(&self) -> Vec<String>;
    /// How many nodes there are.
    fn len(&self) -> usize;
    /// Kills node `i` (its data is lost unless it persists).
    fn kill(&mut self, i: usize);
    /// Starts a killed node again (or restarts a running one).
    fn restart(&mut self, i: usize);
    /// Freezes node `i`: connections stay open, nothing is answered.
    fn pause(&mut self, i: usize);
    /// Thaws node `i`; the queued commands run.
    fn resume(&mut self, i: usize);
    /// Cuts node `i` off the network: traffic is held (TCP retransmits), nothing answered.
    fn disconnect(&mut self, i: usize);
    /// Heals the cut.
    fn connect(&mut self, i: usize);
    /// A blocking connection to node `i` for inspection (not through any fault).
    fn conn(&self, i: usize) -> redis::RedisResult<redis::Connection>;

    /// Empties node `i` (`FLUSHALL`): it forgets every lock, as after a restart without
    /// persistence, but keeps running (same `run_id`, same connections).
    fn flush(&self, i: usize) {
        if let Ok(mut conn) = self.conn(i) {
            let _: redis::RedisResult<()> = redis::cmd("FLUSHALL").query(&mut conn);
        }
    }

    /// The value at `key` on node `i` (`None` also when the node cannot be inspected).
    fn get(&self, i: usize, key: &str) -> Option<String> {
        let mut conn = self.conn(i).ok()?;
        redis::cmd("GET").arg(key).query(&mut conn).ok()?
    }

    /// The keys on node `i` but the restart quarantine's memory (see [`Servers::keys`]);
    /// empty when it cannot be inspected.
    fn keys(&self, i: usize) -> Vec<String> {
        self.conn(i)
            .and_then(|mut c| redis::cmd("KEYS").arg("*").query::<Vec<String>>(&mut c))
            .unwrap_or_default()
            .into_iter()
            .filter(|key| !crate::servers::is_memory_key(key))
            .collect()
    }
}

/// Local `redis-server` processes, each behind an in-process proxy that provides the
/// network faults (disconnect = blackhole).
pub struct LocalCluster {
    servers: Servers,
    proxies: Vec<Proxy>,
}

impl LocalCluster {
    /// Starts `n` servers and a proxy in front of each, on the current runtime.
    pub async fn start(n: usize) -> Self {
        Self::start_with(n, &[]).await
    }

    /// The same, with extra `redis-server` arguments.
    pub async fn start_with(n: usize, args: &[&str]) -> Self {
        Self::over(Servers::start_with(n, args)).await
    }

    /// Puts a proxy in front of each of `servers`, on the current runtime.
    pub async fn over(servers: Servers) -> Self {
        let mut proxies = Vec::new();
        for i in 0..servers.len() {
            proxies.push(Proxy::start(servers.port(i)).await);
        }
        LocalCluster { servers, proxies }
    }

    /// The proxy in front of node `i`, for latency.
    pub fn proxy(&self, i: usize) -> &Proxy {
        &self.proxies[i]
    }
}

impl Cluster for LocalCluster {
    fn name(&self) -> &'static str {
        "local processes"
    }
    fn urls(&self) -> Vec<String> {
        self.proxies.iter().map(Proxy::url).collect()
    }
    fn len(&self) -> usize {
        self.servers.len()
    }
    fn kill(&mut self, i: usize) {
        self.servers.kill(i);
    }
    fn restart(&mut self, i: usize) {
        self.servers.restart(i);
    }
    fn pause(&mut self, i: usize) {
        self.servers.pause(i);
    }
    fn resume(&mut self, i: usize) {
        self.servers.resume(i);
    }
    fn disconnect(&mut self, i: usize) {
        self.proxies[i].set(Mode::Blackhole);
    }
    fn connect(&mut self, i: usize) {
        self.proxies[i].set(Mode::Pass);
    }
    fn conn(&self, i: usize) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(self.servers.url(i))?;
        let conn = client.get_connection_with_timeout(Duration::from_millis(500))?;
        conn.set_read_timeout(Some(Duration::from_secs(1)))?;
        Ok(conn)
    }
}

/// The docker-compose project of `docker/` (five nodes on 127.0.0.1:7001..7005), driven by
/// `docker/nodes.sh`. Only one can be up at a time: each value holds the harness until dropped.
pub struct ComposeCluster {
    fsync: bool,
    _guard: MutexGuard<'static, ()>,
}

static COMPOSE: Mutex<()> = Mutex::new(());

fn nodes_sh(fsync: bool, args: &[&str]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../docker/nodes.sh");
    let out = Command::new("bash")
        .arg(script)
        .args(args)
        .env("REDFENCE_FSYNC", if fsync { "1" } else { "0" })
        .output()
        .expect("run docker/nodes.sh");
    assert!(
        out.status.success(),
        "docker/nodes.sh {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl ComposeCluster {
    /// Why the compose harness cannot be used here, if it cannot.
    pub fn unavailable() -> Option<String> {
        if std::env::var_os("REDFENCE_DOCKER").is_none() {
            return Some(
                "REDFENCE_DOCKER is not set (scripts/test.sh sets it when Docker and docker-compose work)".into(),
            );
        }
        None
    }

    /// Brings the five nodes up, all healthy and empty, and holds the harness for this test.
    /// Returns `None` (after printing why) where Docker is not available.
    pub fn up(test: &str) -> Option<ComposeCluster> {
        Self::up_with(test, false)
    }

    /// The same; with `fsync`, the nodes persist every write (`appendfsync always`).
    pub fn up_with(test: &str, fsync: bool) -> Option<ComposeCluster> {
        if let Some(why) = Self::unavailable() {
            eprintln!("skipping {test} against docker-compose: {why}");
            return None;
        }
        let guard = COMPOSE.lock().unwrap_or_else(|e| e.into_inner());
        nodes_sh(fsync, &["up"]);
        let mut cluster = ComposeCluster {
            fsync,
            _guard: guard,
        };
        for i in 0..5 {
            // Idempotent: heal whatever an earlier scenario left behind, and empty the node.
            cluster.sh(&["connect", &(i + 1).to_string()]);
            cluster.sh(&["unpause", &(i + 1).to_string()]);
            if cluster.conn(i).is_err() {
                cluster.restart(i);
            }
            let mut conn = cluster.conn(i).expect("compose node answers");
            let _: () = redis::cmd("FLUSHALL").query(&mut conn).expect("FLUSHALL");
        }
        Some(cluster)
    }
}

impl ComposeCluster {
    fn sh(&self, args: &[&str]) {
        nodes_sh(self.fsync, args);
    }

    fn node_sh(&self, command: &str, i: usize) {
        self.sh(&[command, &(i + 1).to_string()]);
    }
}

impl Cluster for ComposeCluster {
    fn name(&self) -> &'static str {
        "docker-compose"
    }
    fn urls(&self) -> Vec<String> {
        (1..=5)
            .map(|n| format!("redis://127.0.0.1:700{n}"))
            .collect()
    }
    fn len(&self) -> usize {
        5
    }
    fn kill(&mut self, i: usize) {
        self.node_sh("kill", i);
    }
    fn restart(&mut self, i: usize) {
        self.node_sh("restart", i);
        self.node_sh("wait", i);
    }
    fn pause(&mut self, i: usize) {
        self.node_sh("pause", i);
    }
    fn resume(&mut self, i: usize) {
        self.node_sh("unpause", i);
    }
    fn disconnect(&mut self, i: usize) {
        self.node_sh("disconnect", i);
    }
    fn connect(&mut self, i: usize) {
        self.node_sh("connect", i);
    }
    fn conn(&self, i: usize) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:700{}", i + 1))?;
        let conn = client.get_connection_with_timeout(Duration::from_millis(500))?;
        conn.set_read_timeout(Some(Duration::from_secs(1)))?;
        Ok(conn)
    }
}
