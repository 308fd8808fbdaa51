//! A Sentinel group for the sentinel-voter tests: one master, one replica and three
//! sentinels watching the master as `mymaster` (quorum 2), all local processes.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::servers::Launch;
use crate::{DEADLINE, Servers, free_port};

/// The name the sentinels know the master by.
pub const MASTER: &str = "mymaster";

/// Server 0 starts as the master and server 1 as its replica; three sentinels watch them.
pub struct SentinelGroup {
    /// The master (0) and the replica (1), reachable on their own for inspection.
    pub servers: Servers,
    sentinels: Vec<(u16, Child, tempfile::TempDir)>,
}

/// The replication role of server `i` (`master` or `slave`).
pub fn role(servers: &Servers, i: usize) -> String {
    let info: String = servers.cmd(i, &["INFO", "replication"]);
    info.lines()
        .find_map(|l| l.strip_prefix("role:"))
        .unwrap_or("")
        .trim()
        .to_owned()
}

impl SentinelGroup {
    /// Starts everything and waits until every sentinel knows the master and its replica.
    pub fn start() -> Self {
        Self::start_launched(Launch::default)
    }

    /// The same, every server and sentinel started as `launch` says (another binary: Valkey 9,
    /// Redis 8).
    pub fn start_launched(launch: impl Fn() -> Launch) -> Self {
        let servers = Servers::start_launched(2, &[], |_| launch());
        let master_port = servers.port(0).to_string();
        servers.cmd::<()>(1, &["REPLICAOF", "127.0.0.1", &master_port]);
        // The master lists its replica before the sentinels start, so that each one's first
        // look at the master (`INFO`, then every 10 s) finds it.
        let listed = || {
            let info: String = servers.cmd(0, &["INFO", "replication"]);
            info.lines().any(|l| l.trim() == "connected_slaves:1")
        };
        let deadline = Instant::now() + DEADLINE * 3;
        while !listed() {
            assert!(
                Instant::now() < deadline,
                "the master never listed its replica"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let sentinels = (0..3)
            .map(|_| {
                let dir = tempfile::tempdir().expect("temp dir");
                let port = free_port();
                let conf = dir.path().join("sentinel.conf");
                std::fs::write(
                    &conf,
                    format!(
                        "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\n\
                         dir {dir}\nlogfile {dir}/sentinel.log\n\
                         sentinel monitor {MASTER} 127.0.0.1 {master_port} 2\n\
                         sentinel down-after-milliseconds {MASTER} 1000\n\
                         sentinel failover-timeout {MASTER} 5000\n",
                        dir = dir.path().display()
                    ),
                )
                .expect("write sentinel.conf");
                let launch = launch();
                let child = Command::new(&launch.binary)
                    .envs(launch.env.iter().map(|(k, v)| (k, v)))
                    .arg(&conf)
                    .arg("--sentinel")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("start a sentinel");
                (port, child, dir)
            })
            .collect();
        let group = SentinelGroup { servers, sentinels };
        group.wait_until(|g| {
            (0..3).all(|i| {
                g.query::<Vec<redis::Value>>(i, &["SENTINEL", "REPLICAS", MASTER])
                    .is_some_and(|r| r.len() == 1)
            }) && role(&g.servers, 1) == "slave"
        });
        group
    }

    /// The sentinels' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|(port, _, _)| format!("redis://127.0.0.1:{port}"))
            .collect()
    }

    fn query<T: redis::FromRedisValue>(&self, i: usize, args: &[&str]) -> Option<T> {
        let client = redis::Client::open(self.urls()[i].as_str()).ok()?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut conn).ok()
    }

    /// The port of the master the sentinels report now.
    pub fn master_port(&self) -> Option<u16> {
        let addr: Vec<String> = self.query(0, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER])?;
        addr.get(1)?.parse().ok()
    }

    /// Polls `cond` until it holds, or panics after six times [`DEADLINE`] (sentinels look
    /// at their master every 10 s), saying what each sentinel knows.
    pub fn wait_until(&self, cond: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + DEADLINE * 6;
        while !cond(self) {
            if Instant::now() >= deadline {
                let seen: Vec<String> = (0..self.sentinels.len())
                    .map(|i| {
                        let master = self.query::<Vec<String>>(
                            i,
                            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER],
                        );
                        let replicas = self
                            .query::<Vec<redis::Value>>(i, &["SENTINEL", "REPLICAS", MASTER])
                            .map(|r| r.len());
                        format!("sentinel {i}: master {master:?}, replicas {replicas:?}")
                    })
                    .collect();
                panic!("the sentinel group did not settle: {}", seen.join("; "));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills the master (SIGKILL) and waits until the sentinels have promoted the replica
    /// (server 1).
    pub fn kill_master(&mut self) {
        self.servers.kill(0);
        self.wait_for_promotion();
    }

    /// Pauses the master (SIGSTOP: its connections stay open, nothing answers) and waits
    /// until the sentinels have promoted the replica (server 1). The old master stays paused.
    pub fn pause_master(&mut self) {
        self.servers.pause(0);
        self.wait_for_promotion();
    }

    /// Pauses sentinel `i` (SIGSTOP: it accepts connections, nothing answers); it is killed
    /// with the group.
    pub fn pause_sentinel(&self, i: usize) {
        let pid = self.sentinels[i].1.id().to_string();
        let status = Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -STOP {pid}");
    }

    /// Makes every sentinel wait `ms` before it calls the master down (1 s at start): a
    /// test that pauses the master for longer than a second without a failover.
    pub fn set_down_after(&self, ms: u64) {
        let ms = ms.to_string();
        for i in 0..self.sentinels.len() {
            let set: Option<String> = self.query(
                i,
                &["SENTINEL", "SET", MASTER, "down-after-milliseconds", &ms],
            );
            assert!(set.is_some(), "SENTINEL SET on sentinel {i}");
        }
    }

    fn wait_for_promotion(&self) {
        let replica = self.servers.port(1);
        self.wait_until(|g| g.master_port() == Some(replica) && role(&g.servers, 1) == "master");
    }
}

impl Drop for SentinelGroup {
    fn drop(&mut self) {
        for (_, child, _) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
