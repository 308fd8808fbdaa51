//! The real server of each [`Profile`] for the differential test (see `differential.rs`): where
//! its binary is (as `scripts/test.sh` and the test harness find it), started on a free port
//! of 127.0.0.1 and spoken to over RESP2, one pipeline at a time.

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::Value;

use super::profile::Profile;

/// The binary of `profile`'s real server: Redis 7 is `redis-server` on `PATH`; Valkey 9 is
/// `REDFENCE_VALKEY9`, or `valkey-server` in the venv `scripts/setup.sh` makes
/// (`$REDFENCE_VALKEY9_VENV/bin`, default `/opt/redfence-valkey9`); Redis 8 is
/// `REDFENCE_REDIS8`, or the `redis-server` it unpacks (`$REDFENCE_REDIS8_DIR/bin`, default
/// `/opt/redfence-redis8`).
pub(super) fn binary(profile: Profile) -> String {
    let installed = |binary_var: &str, dir_var: &str, default_dir: &str, name: &str| {
        std::env::var(binary_var).unwrap_or_else(|_| {
            let dir = std::env::var(dir_var).unwrap_or_else(|_| default_dir.to_owned());
            format!("{dir}/bin/{name}")
        })
    };
    match profile {
        Profile::Redis7 => "redis-server".to_owned(),
        Profile::Valkey9 => installed(
            "REDFENCE_VALKEY9",
            "REDFENCE_VALKEY9_VENV",
            "/opt/redfence-valkey9",
            "valkey-server",
        ),
        Profile::Redis8 => installed(
            "REDFENCE_REDIS8",
            "REDFENCE_REDIS8_DIR",
            "/opt/redfence-redis8",
            "redis-server",
        ),
    }
}

/// A real server on a free port of 127.0.0.1, without persistence, stopped when dropped.
pub(super) struct Real {
    child: Child,
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    parser: redis::Parser,
}

impl Real {
    /// Starts `binary`, or `None` when it cannot be run.
    pub(super) fn start(binary: &str) -> Option<Real> {
        let port = TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let child = Command::new(binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let mut child = Some(child);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if let Ok(stream) = TcpStream::connect(("127.0.0.1", port)) {
                let reader = BufReader::new(stream.try_clone().ok()?);
                return Some(Real {
                    child: child.take()?,
                    writer: stream,
                    reader,
                    parser: redis::Parser::new(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(mut child) = child {
            let _ = child.kill();
            let _ = child.wait();
        }
        None
    }

    /// Sends `commands` in one pipeline and reads their replies.
    pub(super) fn send(&mut self, commands: &[Vec<Vec<u8>>]) -> Vec<Value> {
        let mut out = Vec::new();
        for args in commands {
            out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
            for arg in args {
                out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
                out.extend_from_slice(arg);
                out.extend_from_slice(b"\r\n");
            }
        }
        self.writer
            .write_all(&out)
            .expect("write to the real server");
        (0..commands.len())
            .map(|_| {
                self.parser
                    .parse_value(&mut self.reader)
                    .expect("a reply from the real server")
            })
            .collect()
    }

    /// Sends one command and reads its reply.
    pub(super) fn one(&mut self, args: &[&str]) -> Value {
        let args: Vec<Vec<u8>> = args.iter().map(|a| a.as_bytes().to_vec()).collect();
        self.send(&[args]).remove(0)
    }
}

impl Drop for Real {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `name:value` fields of an `INFO` reply's text, in order.
pub(super) fn info_fields(info: &Value) -> Vec<(String, String)> {
    let text = match info {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::VerbatimString { text, .. } => text.clone(),
        _ => String::new(),
    };
    text.lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.to_owned(), value.trim().to_owned()))
        .collect()
}

/// A version's major and minor numbers (`7.0` of `7.0.15`).
pub(super) fn major_minor(version: &str) -> &str {
    match version.match_indices('.').nth(1) {
        Some((at, _)) => &version[..at],
        None => version,
    }
}
