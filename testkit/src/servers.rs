//! N independent `redis-server` processes on free loopback ports.
//!
//! `REDIS_SERVER` names the binary (default `redis-server` on `PATH`; a Valkey server works
//! too). Every server runs in its own temp dir, without persistence unless asked, and is
//! killed when the [`Servers`] value is dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::{DEADLINE, free_port};

/// N independent redis-server processes.
pub struct Servers {
    servers: Vec<Server>,
}

struct Server {
    port: u16,
    dir: tempfile::TempDir,
    args: Vec<String>,
    launch: Launch,
    child: Option<Child>,
}

/// How to start one server: which binary, with which extra environment.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The server binary (default: `REDIS_SERVER`, or `redis-server` on `PATH`).
    pub binary: String,
    /// Extra environment variables for the process.
    pub env: Vec<(String, String)>,
    /// Told when each process is spawned (first start and every restart).
    pub spawned: Option<Arc<Mutex<SystemTime>>>,
}

impl Default for Launch {
    fn default() -> Self {
        Launch {
            binary: binary(),
            env: Vec::new(),
            spawned: None,
        }
    }
}

/// Redis 8 (8.4 and later have compare-and-delete, `DELEX … IFEQ`): `REDFENCE_REDIS8`, or the
/// one `scripts/setup.sh` unpacks (`$REDFENCE_REDIS8_DIR`, default `/opt/redfence-redis8`).
/// Panics, saying how to install it, when it is not there.
pub fn redis8() -> Launch {
    installed(Installed {
        what: "Redis 8",
        binary_var: "REDFENCE_REDIS8",
        dir_var: "REDFENCE_REDIS8_DIR",
        default_dir: "/opt/redfence-redis8",
        name: "redis-server",
    })
}

/// Valkey 9 (the first with compare-and-delete, `DELIFEQ`): `REDFENCE_VALKEY9`, or the venv
/// `scripts/setup.sh` makes (`$REDFENCE_VALKEY9_VENV`, default `/opt/redfence-valkey9`).
/// Panics, saying how to install it, when it is not there.
pub fn valkey9() -> Launch {
    installed(Installed {
        what: "Valkey 9",
        binary_var: "REDFENCE_VALKEY9",
        dir_var: "REDFENCE_VALKEY9_VENV",
        default_dir: "/opt/redfence-valkey9",
        name: "valkey-server",
    })
}

/// Where `scripts/setup.sh` installs a server other than the system's `redis-server`.
struct Installed {
    /// The server's name in the panic message.
    what: &'static str,
    /// The variable that names the binary itself.
    binary_var: &'static str,
    /// The variable that names the install directory (the binary is in its `bin/`).
    dir_var: &'static str,
    default_dir: &'static str,
    /// The binary's file name.
    name: &'static str,
}

/// The launch of an installed server; panics, saying how to install it, when it is not there.
fn installed(server: Installed) -> Launch {
    let binary = std::env::var(server.binary_var).unwrap_or_else(|_| {
        let dir = std::env::var(server.dir_var).unwrap_or_else(|_| server.default_dir.into());
        format!("{dir}/bin/{}", server.name)
    });
    assert!(
        std::path::Path::new(&binary).exists(),
        "{} not found at {binary}: run scripts/setup.sh (or set {})",
        server.what,
        server.binary_var
    );
    Launch {
        binary,
        ..Launch::default()
    }
}

/// The server binary: `REDIS_SERVER`, or `redis-server` on `PATH`.
pub(crate) fn binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

impl Server {
    fn spawn(&mut self) -> std::io::Result<()> {
        let log: PathBuf = self.dir.path().join("redis.log");
        let child = Command::new(&self.launch.binary)
            .envs(self.launch.env.iter().map(|(k, v)| (k, v)))
            .arg("--port")
            .arg(self.port.to_string())
            .args([
                "--bind",
                "127.0.0.1",
                "--protected-mode",
                "no",
                "--daemonize",
                "no",
            ])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        if let Some(spawned) = &self.launch.spawned {
            *spawned.lock().expect("spawn time") = SystemTime::now();
        }
        self.child = Some(child);
        Ok(())
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(self.url())?;
        let conn = client.get_connection_with_timeout(Duration::from_millis(500))?;
        conn.set_read_timeout(Some(Duration::from_secs(2)))?;
        conn.set_write_timeout(Some(Duration::from_secs(2)))?;
        Ok(conn)
    }

    fn ping(&self) -> bool {
        self.connection()
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok()
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + DEADLINE;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                return false; // exited: the port was probably taken
            }
            if self.ping() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn signal(&self, sig: &str) {
        if let Some(child) = &self.child {
            let status = Command::new("kill")
                .arg(sig)
                .arg(child.id().to_string())
                .status()
                .expect("run kill");
            assert!(status.success(), "kill {sig} failed");
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Servers {
    /// Starts `n` servers without persistence.
    pub fn start(n: usize) -> Self {
        Self::start_with(n, &[])
    }

    /// Starts `n` servers with extra `redis-server` arguments (e.g. `--appendonly yes`).
    pub fn start_with(n: usize, args: &[&str]) -> Self {
        Self::start_launched(n, args, |_| Launch::default())
    }

    /// Starts `n` servers, server `i` as `launch(i)` says (another binary, extra environment).
    pub fn start_launched(n: usize, args: &[&str], launch: impl Fn(usize) -> Launch) -> Self {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        Self::start_each(n, |_| args.clone(), launch)
    }

    /// Starts `n` servers, server `i` with the extra arguments `args(i)` (called again for
    /// every try, so it may pick fresh ports) and as `launch(i)` says.
    pub fn start_each(
        n: usize,
        args: impl Fn(usize) -> Vec<String>,
        launch: impl Fn(usize) -> Launch,
    ) -> Self {
        let servers = (0..n)
            .map(|i| {
                for _ in 0..5 {
                    let mut server = Server {
                        port: free_port(),
                        dir: tempfile::tempdir().expect("temp dir"),
                        args: args(i),
                        launch: launch(i),
                        child: None,
                    };
                    server.spawn().unwrap_or_else(|e| {
                        panic!(
                            "cannot start {}: {e}; set REDIS_SERVER",
                            server.launch.binary
                        )
                    });
                    if server.wait_ready() {
                        return server;
                    }
                    server.kill();
                }
                panic!("redis-server did not come up after 5 tries");
            })
            .collect();
        Servers { servers }
    }

    /// How many servers there are.
    #[allow(clippy::len_without_is_empty)] // never empty: `start(0)` is no test
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// The URL of server `i`.
    pub fn url(&self, i: usize) -> String {
        self.servers[i].url()
    }

    /// The port of server `i`.
    pub fn port(&self, i: usize) -> u16 {
        self.servers[i].port
    }

    /// Every server's URL.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(Server::url).collect()
    }

    /// Kills server `i` (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self, i: usize) {
        self.servers[i].kill();
    }

    /// Pauses server `i` (SIGSTOP): its socket accepts, but nothing is answered.
    pub fn pause(&self, i: usize) {
        self.servers[i].signal("-STOP");
    }

    /// Resumes a paused server (SIGCONT).
    pub fn resume(&self, i: usize) {
        self.servers[i].signal("-CONT");
    }

    /// Starts server `i` again on the same port and directory (empty, unless it persists).
    pub fn restart(&mut self, i: usize) {
        let server = &mut self.servers[i];
        server.kill();
        let deadline = Instant::now() + DEADLINE;
        loop {
            server.spawn().expect("respawn redis-server");
            if server.wait_ready() {
                return;
            }
            server.kill();
            assert!(Instant::now() < deadline, "server {i} did not restart");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Counts the connections server `i` accepts from now on, read on one connection of its
    /// own (opened here), so that reading adds none.
    pub fn accepted_connections(&self, i: usize) -> AcceptedConnections {
        AcceptedConnections(std::sync::Mutex::new(self.conn(i)))
    }

    /// A blocking connection to server `i`, for inspection.
    pub fn conn(&self, i: usize) -> redis::Connection {
        self.servers[i]
            .connection()
            .expect("connect to test server")
    }

    /// The value at `key` on server `i`.
    pub fn get(&self, i: usize, key: &str) -> Option<String> {
        redis::cmd("GET")
            .arg(key)
            .query(&mut self.conn(i))
            .expect("GET")
    }

    /// Whether the value at `key` passes `check` on every server (`None`: no such key). A
    /// lock call returns once a majority answered, so a test that looks at every node waits
    /// for this with `eventually`, e.g. `eventually(|| servers.on_every_node("job",
    /// Option::is_none))`.
    pub fn on_every_node(&self, key: &str, check: impl Fn(&Option<String>) -> bool) -> bool {
        (0..self.len()).all(|i| check(&self.get(i, key)))
    }

    /// The remaining TTL of `key` on server `i`, in ms (`-2` when absent).
    pub fn pttl(&self, i: usize, key: &str) -> i64 {
        redis::cmd("PTTL")
            .arg(key)
            .query(&mut self.conn(i))
            .expect("PTTL")
    }

    /// Every key on server `i` but the restart quarantine's memory, which every client keeps
    /// on every server and never deletes (`<prefix>redfence:memory`, the marker, and
    /// `<prefix>redfence:roster:<server>`; see redfence's `src/memory.rs`): the keys locks
    /// leave behind.
    pub fn keys(&self, i: usize) -> Vec<String> {
        self.all_keys(i)
            .into_iter()
            .filter(|key| !is_memory_key(key))
            .collect()
    }

    /// Every key on server `i`, the restart quarantine's memory included.
    pub fn all_keys(&self, i: usize) -> Vec<String> {
        redis::cmd("KEYS")
            .arg("*")
            .query(&mut self.conn(i))
            .expect("KEYS")
    }

    /// Runs a command on server `i`.
    pub fn cmd<T: redis::FromRedisValue>(&self, i: usize, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.conn(i)).expect("command")
    }

    /// Clients subscribed on server `i` to the release channel of lock key `key`
    /// (`redfence:released:<key>`, where a release announces itself to waiters).
    pub fn release_subscribers(&self, i: usize, key: &str) -> i64 {
        let channel = format!("redfence:released:{key}");
        let (_, count): (String, i64) = self.cmd(i, &["PUBSUB", "NUMSUB", &channel]);
        count
    }

    /// Server `i`'s `EVALSHA` counts from `INFO commandstats`: calls and failed calls (0 and
    /// 0 before the first).
    pub fn evalsha_stats(&self, i: usize) -> (u64, u64) {
        (
            self.command_stat(i, "evalsha", "calls"),
            self.command_stat(i, "evalsha", "failed_calls"),
        )
    }

    /// Server `i`'s `field` (`calls`, `failed_calls`, `rejected_calls`...) for `command`
    /// (lower case) from `INFO commandstats`; 0 before its first call.
    pub fn command_stat(&self, i: usize, command: &str, field: &str) -> u64 {
        let info: String = self.cmd(i, &["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:");
        let line = info.lines().find(|l| l.starts_with(&prefix)).unwrap_or("");
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(field)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Which live servers hold `key` with value `token`.
    pub fn holders(
        &self,
        key: &str,
        token: &str,
        live: impl IntoIterator<Item = usize>,
    ) -> Vec<usize> {
        live.into_iter()
            .filter(|&i| self.get(i, key).as_deref() == Some(token))
            .collect()
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for server in &mut self.servers {
            // SIGKILL also ends a SIGSTOPped process.
            server.kill();
        }
    }
}

/// The connections one server has accepted (`total_connections_received`), read on a
/// connection of its own: see [`Servers::accepted_connections`].
pub struct AcceptedConnections(std::sync::Mutex<redis::Connection>);

impl AcceptedConnections {
    /// How many connections the server has accepted since it started.
    pub fn count(&self) -> i64 {
        let mut conn = self.0.lock().expect("probe connection");
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query(&mut *conn)
            .expect("INFO stats");
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("total_connections_received")
    }
}

/// Whether `key` is one of the restart quarantine's memory keys (see [`Servers::keys`]).
pub(crate) fn is_memory_key(key: &str) -> bool {
    key.ends_with("redfence:memory") || key.contains("redfence:roster:")
}
