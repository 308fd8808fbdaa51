//! A throwaway PostgreSQL cluster, started from the server binaries.
//!
//! The binaries come from `PG_BIN` (a directory), else `pg_config --bindir`, else the newest
//! `/usr/lib/postgresql/*/bin`. PostgreSQL refuses to run as root, so when the tests run as
//! root every server command runs as the `postgres` user (`runuser -u postgres --`).
//!
//! Each [`Postgres`] is a fresh cluster in its own temp dir, listening on a free loopback
//! port with its own socket dir, `fsync=on`; it is stopped (immediate) when dropped. The
//! cluster is a copy of a template made once by `initdb` and kept in the cargo target dir's
//! `tmp/` (one per PostgreSQL version), so most tests skip `initdb`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::free_port;

/// A PostgreSQL cluster of its own, trust-authenticated, superuser `postgres`.
pub struct Postgres {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    running: bool,
    paused: Vec<u32>,
}

/// Where the server binaries are.
fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("PG_BIN") {
        return PathBuf::from(dir);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() {
            return dir;
        }
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, bin)) => bin,
        None => panic!(
            "no PostgreSQL server binaries: set PG_BIN, put pg_config on PATH, or install \
             the `postgresql` package (initdb, pg_ctl, postgres)"
        ),
    }
}

/// The template data dir for the binaries in `bin`: made by `initdb` on first use, then
/// reused by every test and every later run.
fn template(bin: &Path) -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let out = Command::new(bin.join("initdb"))
            .arg("--version")
            .output()
            .expect("run initdb --version");
        let version: String = String::from_utf8_lossy(&out.stdout)
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '.')
            .collect();
        // The initdb options below are part of the key: change "v1" when they change.
        let cache = cache_dir().join(format!("pg-template-v1-{version}"));
        if cache.join("data").join("PG_VERSION").exists() && cache.join("complete").exists() {
            return cache.join("data");
        }
        // initdb runs as `postgres` when we are root, so it writes into a temp dir of its own.
        let scratch = tempfile::tempdir().expect("temp dir");
        if is_root() {
            chown_postgres(scratch.path());
        }
        let data = scratch.path().join("data");
        let out = server_command(bin, "initdb")
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C"])
            // Only initdb's own files; the server runs with fsync=on.
            .arg("--no-sync")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run initdb from {}: {e}", bin.display()));
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(scratch.path().join("complete"), b"").expect("mark the template");
        // Publish it atomically; another test process may have won the race.
        let staged = cache.with_extension(format!("staging-{}", std::process::id()));
        let status = Command::new("cp")
            .arg("-a")
            .arg(scratch.path())
            .arg(&staged)
            .status()
            .expect("run cp");
        assert!(status.success(), "stage the template");
        if std::fs::rename(&staged, &cache).is_err() {
            let _ = std::fs::remove_dir_all(&staged);
        }
        assert!(
            cache.join("complete").exists(),
            "template at {}",
            cache.display()
        );
        cache.join("data")
    })
}

/// Where templates are kept: the cargo target dir's `tmp/` (the `CARGO_TARGET_TMPDIR` of
/// integration tests), found from the running test (`<target>/<profile>/deps/<test>`) or
/// example (`<target>/<profile>/examples/<example>`); else the system temp dir.
fn cache_dir() -> PathBuf {
    let target_tmp = std::env::current_exe().ok().and_then(|exe| {
        let dir = exe.parent()?;
        let kind = dir.file_name()?;
        if kind != "deps" && kind != "examples" {
            return None;
        }
        Some(dir.parent()?.parent()?.join("tmp"))
    });
    match target_tmp {
        Some(dir) if std::fs::create_dir_all(&dir).is_ok() => dir,
        _ => std::env::temp_dir(),
    }
}

fn chown_postgres(path: &Path) {
    let status = Command::new("chown")
        .arg("postgres:postgres")
        .arg(path)
        .status()
        .expect("run chown");
    assert!(status.success(), "chown {} to postgres", path.display());
}

/// A server binary, run as the `postgres` user when we are root.
fn server_command(bin: &Path, program: &str) -> Command {
    let path = bin.join(program);
    if is_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(path);
        cmd
    } else {
        Command::new(path)
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

impl Postgres {
    /// Creates a fresh cluster (`initdb`) and starts it.
    pub fn start() -> Self {
        let bin = bin_dir();
        let dir = tempfile::tempdir().expect("temp dir");
        if is_root() {
            chown_postgres(dir.path());
        }
        let mut pg = Postgres {
            bin,
            dir,
            port: 0,
            running: false,
            paused: Vec::new(),
        };
        // A copy of a cluster made once by initdb (the slow part): each test gets its own.
        let status = Command::new("cp")
            .arg("-a")
            .arg(template(&pg.bin))
            .arg(pg.data())
            .status()
            .expect("run cp");
        assert!(status.success(), "copy the template cluster");
        for attempt in 0.. {
            pg.port = free_port();
            if pg.try_start() {
                return pg;
            }
            assert!(attempt < 5, "PostgreSQL did not start: {}", pg.log());
        }
        unreachable!()
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    /// The server log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The command for a server binary, as the `postgres` user when we are root.
    fn command(&self, program: &str) -> Command {
        server_command(&self.bin, program)
    }

    fn run(&self, program: &str, args: &[&str]) {
        let out = self
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program} from {}: {e}", self.bin.display()));
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn try_start(&mut self) -> bool {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on \
             -c max_connections=60 -c shared_buffers=16MB",
            self.port,
            self.dir.path().display()
        );
        let status = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.log_path())
            .args(["-w", "-t", "60", "-o", &options, "start"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run pg_ctl start");
        self.running = status.success();
        self.running
    }

    /// Starts a stopped server again, on the same port and data.
    pub fn start_again(&mut self) {
        assert!(!self.running, "already running");
        assert!(
            self.try_start(),
            "PostgreSQL did not restart: {}",
            self.log()
        );
    }

    /// Stops the server at once, like a crash (`pg_ctl stop -m immediate`): no checkpoint,
    /// so the next start recovers committed transactions from the WAL.
    pub fn stop_immediate(&mut self) {
        if self.running {
            self.run(
                "pg_ctl",
                &[
                    "-D",
                    &self.data().display().to_string(),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ],
            );
            self.running = false;
        }
    }

    /// A crash restart: `stop_immediate`, then start.
    pub fn restart(&mut self) {
        self.stop_immediate();
        self.start_again();
    }

    /// The postmaster's pid and its children's (the backends): the whole server.
    fn pids(&self) -> Vec<u32> {
        let pid_file = std::fs::read_to_string(self.data().join("postmaster.pid"))
            .expect("read postmaster.pid");
        let postmaster: u32 = pid_file
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .expect("postmaster pid");
        let mut pids = vec![postmaster];
        for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces.
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(postmaster) {
                pids.push(pid);
            }
        }
        pids
    }

    fn signal(pids: &[u32], sig: &str) {
        let status = Command::new("kill")
            .arg(sig)
            .args(pids.iter().map(u32::to_string))
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {sig} {pids:?}");
    }

    /// Freezes the whole server (SIGSTOP to the postmaster and its backends): connections
    /// stay open, nothing is answered.
    pub fn pause(&mut self) {
        assert!(self.paused.is_empty(), "already paused");
        self.paused = self.pids();
        Self::signal(&self.paused, "-STOP");
    }

    /// Resumes a paused server (SIGCONT).
    pub fn resume(&mut self) {
        let pids = std::mem::take(&mut self.paused);
        if !pids.is_empty() {
            Self::signal(&pids, "-CONT");
        }
    }

    /// The port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A tokio-postgres connect string for the `postgres` database.
    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=5",
            self.port
        )
    }

    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A connected client, on the current Tokio runtime: its connection runs on a spawned
    /// task. The same type as `redfence_postgres::tokio_postgres::Client`.
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connect to test PostgreSQL: {e:?}"));
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if !self.paused.is_empty() {
            let _ = Command::new("kill")
                .arg("-CONT")
                .args(self.paused.iter().map(u32::to_string))
                .status();
        }
        if self.running {
            let _ = self
                .command("pg_ctl")
                .arg("-D")
                .arg(self.data())
                .args(["-m", "immediate", "-w", "stop"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}
