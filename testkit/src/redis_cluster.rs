//! Small Redis Clusters for the cluster-voter tests: two cluster-enabled masters splitting
//! the 16384 hash slots, joined with `CLUSTER MEET` (no replicas: one cluster per voter is
//! what the tests need, and it keeps 2 cores enough).

use std::time::{Duration, Instant};

use crate::{DEADLINE, Launch, Servers, free_port};

/// Two masters of one cluster: server 0 owns slots 0–8191, server 1 owns 8192–16383.
pub struct RedisCluster {
    /// The members, each also reachable on its own for inspection.
    pub servers: Servers,
    ids: Vec<String>,
}

fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

impl RedisCluster {
    /// Starts the two members, assigns the slots, joins them and waits until both agree
    /// that the cluster is up.
    pub fn start() -> Self {
        let servers = Servers::start_each(
            2,
            |_| {
                [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-port",
                    &free_port().to_string(),
                ]
                .iter()
                .map(|s| s.to_string())
                .collect()
            },
            |_| Launch::default(),
        );
        servers.cmd::<()>(0, &["CLUSTER", "ADDSLOTSRANGE", "0", "8191"]);
        servers.cmd::<()>(1, &["CLUSTER", "ADDSLOTSRANGE", "8192", "16383"]);
        let port = servers.port(1).to_string();
        // CLUSTER MEET needs the bus port when it is not port + 10000.
        let cluster_port: Vec<String> = servers.cmd(1, &["CONFIG", "GET", "cluster-port"]);
        servers.cmd::<()>(
            0,
            &["CLUSTER", "MEET", "127.0.0.1", &port, &cluster_port[1]],
        );
        let ids = (0..2)
            .map(|i| servers.cmd::<String>(i, &["CLUSTER", "MYID"]))
            .collect();
        let cluster = RedisCluster { servers, ids };
        cluster.wait_ok();
        cluster
    }

    fn wait_ok(&self) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let ok = (0..2).all(|i| {
                let info: String = self.servers.cmd(i, &["CLUSTER", "INFO"]);
                info_field(&info, "cluster_state").as_deref() == Some("ok")
                    && info_field(&info, "cluster_known_nodes").as_deref() == Some("2")
                    && info_field(&info, "cluster_slots_assigned").as_deref() == Some("16384")
            });
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The members' URLs, to seed a cluster voter with.
    pub fn seeds(&self) -> Vec<String> {
        self.servers.urls()
    }

    /// The member that serves `key` now (the one that answers without `MOVED`).
    pub fn owner(&self, key: &str) -> usize {
        (0..2)
            .find(|&i| {
                redis::cmd("GET")
                    .arg(key)
                    .query::<Option<String>>(&mut self.servers.conn(i))
                    .is_ok()
            })
            .expect("some member serves the key")
    }

    /// The value at `key`, read from the member that serves it.
    pub fn get(&self, key: &str) -> Option<String> {
        self.servers.get(self.owner(key), key)
    }

    /// The remaining TTL of `key` in ms, from the member that serves it.
    pub fn pttl(&self, key: &str) -> i64 {
        self.servers.pttl(self.owner(key), key)
    }

    /// Starts moving `key`'s slot to the other member and moves its keys (`MIGRATE`), but
    /// leaves the slot in the migrating state: the old owner now answers `ASK`. Returns the
    /// slot and the two members (from, to) for [`finish_migration`](Self::finish_migration).
    pub fn start_migration(&self, key: &str) -> (String, usize, usize) {
        let from = self.owner(key);
        let to = 1 - from;
        let slot: i64 = self.servers.cmd(from, &["CLUSTER", "KEYSLOT", key]);
        let slot = slot.to_string();
        self.servers.cmd::<()>(
            to,
            &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &self.ids[from]],
        );
        self.servers.cmd::<()>(
            from,
            &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &self.ids[to]],
        );
        let keys: Vec<String> = self
            .servers
            .cmd(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "1000"]);
        let port = self.servers.port(to).to_string();
        let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        migrate.extend(keys.iter().map(String::as_str));
        if !keys.is_empty() {
            self.servers.cmd::<()>(from, &migrate);
        }
        (slot, from, to)
    }

    /// Ends a migration: the slot belongs to `to` on both members.
    pub fn finish_migration(&self, (slot, from, to): (String, usize, usize)) {
        for i in [to, from] {
            self.servers
                .cmd::<()>(i, &["CLUSTER", "SETSLOT", &slot, "NODE", &self.ids[to]]);
        }
    }

    /// Gives `key`'s slot (holding no keys) to the other member without its owner, as a
    /// failover would when the owner hangs: the owner is paused (SIGSTOP) and the other
    /// member takes the slot on its own (an import ended there, which bumps its epoch).
    /// Returns the paused member, for [`Servers::resume`]. The other member then waits a
    /// minute, not the usual 2 s, before it finds itself cut off from the majority of the
    /// two masters and refuses every call (`CLUSTERDOWN`).
    pub fn take_slot_from_hung_owner(&self, key: &str) -> usize {
        let from = self.owner(key);
        let to = 1 - from;
        let slot: i64 = self.servers.cmd(from, &["CLUSTER", "KEYSLOT", key]);
        let slot = slot.to_string();
        self.servers
            .cmd::<()>(to, &["CONFIG", "SET", "cluster-node-timeout", "60000"]);
        self.servers.cmd::<()>(
            to,
            &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &self.ids[from]],
        );
        self.servers.pause(from);
        self.servers
            .cmd::<()>(to, &["CLUSTER", "SETSLOT", &slot, "NODE", &self.ids[to]]);
        from
    }

    /// Kills both members: the whole cluster is gone.
    pub fn kill(&mut self) {
        self.servers.kill(0);
        self.servers.kill(1);
    }
}
