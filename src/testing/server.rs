//! [`SimServer`]: one simulated server (Redis 7.0, or another [`Profile`]), its keys on a clock
//! the caller drives, and its scripts run by an embedded Lua 5.1 (redfence's real scripts, as
//! a server runs them).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use redis::Value;

use super::commands;
use super::keyspace::{self, Keyspace};
use super::lua::{Scripts, sha1_hex};
pub(crate) use super::profile::Profile;
use super::reply::{self, bulk, not_integer, parse_int};

/// Servers made in this process, for distinct run ids.
static SERVERS: AtomicU64 = AtomicU64::new(0);

/// A simulated server: answers [`SimServer::command`] as its [`Profile`]'s real server (Redis
/// 7.0 by default) answers over RESP2, one command at a time (a script runs whole before the
/// next command).
#[derive(Debug)]
pub(crate) struct SimServer {
    keys: Keyspace,
    /// The Lua state and loaded scripts; `None` if Lua could not be set up (every script
    /// command then answers an error).
    scripts: Option<Scripts>,
    /// Distinguishes this server's run ids from other servers'.
    serial: u64,
    /// Restarts so far.
    restarts: u64,
    /// When the server (re)started, in ms on its clock.
    started_ms: u64,
    /// `INFO` fields set by the test, by name (over the defaults).
    info: BTreeMap<String, String>,
}

impl SimServer {
    /// An empty Redis 7.0 server whose clock starts at `now_ms` (milliseconds; the caller
    /// drives time).
    pub(crate) fn new(now_ms: u64) -> SimServer {
        SimServer::with_profile(Profile::Redis7, now_ms)
    }

    /// An empty server answering as `profile`, its clock starting at `now_ms`.
    pub(crate) fn with_profile(profile: Profile, now_ms: u64) -> SimServer {
        SimServer {
            keys: Keyspace::new(now_ms, profile),
            scripts: Scripts::new().ok(),
            serial: SERVERS.fetch_add(1, Ordering::Relaxed),
            restarts: 0,
            started_ms: now_ms,
            info: BTreeMap::new(),
        }
    }

    /// Which server it answers as.
    pub(crate) fn profile(&self) -> Profile {
        self.keys.profile
    }

    /// Names its runs after `serial` instead of the order servers were made in this process
    /// (run ids then repeat from one process to the next, as a replayed simulation needs).
    pub(crate) fn set_serial(&mut self, serial: u64) {
        self.serial = serial;
    }

    /// Sets the server's clock (monotonic from the caller; keys with PX expire by it).
    pub(crate) fn set_time(&mut self, now_ms: u64) {
        self.keys.now = now_ms;
    }

    /// Forgets every key and loaded script, takes a new run_id (a restart without persistence).
    pub(crate) fn restart(&mut self) {
        self.keys.clear();
        if let Some(scripts) = &mut self.scripts {
            scripts.flush();
        }
        self.restarts += 1;
        self.started_ms = self.keys.now;
    }

    /// The string at `key` if any and not expired (for tests).
    pub(crate) fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.keys.string(key.as_bytes()).ok().flatten().cloned()
    }

    /// Sets the `INFO` field `name` (`maxmemory_policy`, `evicted_keys`, `master_replid`, ...)
    /// to `value`, over the server's own.
    pub(crate) fn set_info(&mut self, name: &str, value: &str) {
        self.info.insert(name.to_owned(), value.to_owned());
    }

    /// The server's run id: 40 hex digits, new at each restart.
    pub(crate) fn run_id(&self) -> String {
        self.info.get("run_id").cloned().unwrap_or_else(|| {
            sha1_hex(format!("redfence-sim run {} {}", self.serial, self.restarts).as_bytes())
        })
    }

    /// Runs one command, given as its arguments (name first, any case), and answers as the
    /// profile's server would (RESP2, as redis-rs parses it).
    pub(crate) fn command(&mut self, args: &[Vec<u8>]) -> Value {
        let Some(first) = args.first() else {
            return reply::error("ERR unknown command '', with args beginning with: ");
        };
        let name = String::from_utf8_lossy(first).to_ascii_lowercase();
        match name.as_str() {
            "ping" => match args.len() {
                1 => reply::status("PONG"),
                2 => bulk(args[1].clone()),
                _ => reply::arity("ping"),
            },
            "echo" if args.len() == 2 => bulk(args[1].clone()),
            "info" => bulk(self.info_text(&args[1..])),
            "eval" | "evalsha" if args.len() < 3 => reply::arity(&name),
            "eval" => self.eval(&args[1], &args[2..], true),
            "evalsha" => self.eval(&args[1], &args[2..], false),
            "script" => self.script(args),
            "command" => self.command_info(args),
            "flushall" | "flushdb" => {
                self.keys.clear();
                reply::ok()
            }
            _ if keyspace::spec(&name, self.keys.profile).is_some() => {
                commands::run(&mut self.keys, &name, args)
            }
            _ => unknown(args),
        }
    }

    /// Runs `cmd` (a redis-rs command, as a link would send it) as [`SimServer::command`].
    pub(crate) fn run_cmd(&mut self, cmd: &redis::Cmd) -> Value {
        self.command(&args_of(cmd))
    }

    /// `EVAL script numkeys key... arg...` (`source`), or `EVALSHA sha1 numkeys ...`.
    fn eval(&mut self, script: &[u8], rest: &[Vec<u8>], source: bool) -> Value {
        let Some(numkeys) = parse_int(&rest[0]) else {
            return not_integer();
        };
        let args = &rest[1..];
        let numkeys = match usize::try_from(numkeys) {
            Err(_) => return reply::error("ERR Number of keys can't be negative"),
            Ok(n) if n > args.len() => {
                return reply::error("ERR Number of keys can't be greater than number of args");
            }
            Ok(n) => n,
        };
        let Some(scripts) = &mut self.scripts else {
            return reply::error("ERR the simulated server has no Lua");
        };
        let sha = if source {
            match scripts.load(script) {
                Ok(sha) => sha,
                Err(e) => return e,
            }
        } else {
            String::from_utf8_lossy(script).to_ascii_lowercase()
        };
        let (keys, argv) = args.split_at(numkeys);
        scripts
            .run(&sha, keys, argv, &mut self.keys)
            .unwrap_or_else(|| reply::error(self.keys.profile.noscript()))
    }

    /// `SCRIPT LOAD source`, `SCRIPT EXISTS sha1...`, `SCRIPT FLUSH`.
    fn script(&mut self, args: &[Vec<u8>]) -> Value {
        let Some(sub) = args.get(1) else {
            return reply::arity("script");
        };
        let sub = String::from_utf8_lossy(sub).to_ascii_lowercase();
        let Some(scripts) = &mut self.scripts else {
            return reply::error("ERR the simulated server has no Lua");
        };
        match (sub.as_str(), args.len()) {
            ("load", 3) => scripts.load(&args[2]).map_or_else(|e| e, bulk),
            ("load", _) => reply::arity("script|load"),
            ("exists", n) if n >= 3 => Value::Array(
                args[2..]
                    .iter()
                    .map(|sha| {
                        let sha = String::from_utf8_lossy(sha).to_ascii_lowercase();
                        Value::Int(i64::from(scripts.exists(&sha)))
                    })
                    .collect(),
            ),
            ("exists", _) => reply::arity("script|exists"),
            ("flush", 2..=3) => {
                scripts.flush();
                reply::ok()
            }
            _ => reply::error(&format!("ERR unknown subcommand '{sub}'. Try SCRIPT HELP.")),
        }
    }

    /// `COMMAND INFO name...`: the real server's entry for the compare-and-delete command of
    /// the profile (`DELIFEQ` on Valkey 9, `DELEX` on Redis 8), a nil for any other, so that a
    /// link detects what it detects on the real server.
    fn command_info(&self, args: &[Vec<u8>]) -> Value {
        match args.get(1).map(|sub| sub.to_ascii_lowercase()) {
            Some(sub) if sub == b"info" => Value::Array(
                args[2..]
                    .iter()
                    .map(|name| {
                        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
                        self.keys.profile.command_info(&name)
                    })
                    .collect(),
            ),
            _ => reply::error("ERR the simulated server answers only COMMAND INFO"),
        }
    }

    /// The text of `INFO [section...]`.
    fn info_text(&self, sections: &[Vec<u8>]) -> String {
        let uptime = (self.keys.now.saturating_sub(self.started_ms) / 1000).to_string();
        let replid =
            sha1_hex(format!("redfence-sim repl {} {}", self.serial, self.restarts).as_bytes());
        let run_id = self.run_id();
        let mut server = self.keys.profile.server_fields().to_vec();
        server.extend([("run_id", run_id.as_str()), ("uptime_in_seconds", &uptime)]);
        let all: [(&str, Vec<(&str, &str)>); 4] = [
            ("server", server),
            ("memory", vec![("maxmemory_policy", "noeviction")]),
            ("stats", vec![("evicted_keys", "0")]),
            (
                "replication",
                vec![("role", "master"), ("master_replid", &replid)],
            ),
        ];
        let wanted: Vec<String> = sections
            .iter()
            .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase())
            .collect();
        let every = wanted.is_empty() || wanted.iter().any(|s| s == "all" || s == "default");
        let mut text = String::new();
        for (section, fields) in all {
            if !every && !wanted.iter().any(|s| s == section) {
                continue;
            }
            if !text.is_empty() {
                text.push_str("\r\n");
            }
            let mut title = section.to_owned();
            title[..1].make_ascii_uppercase();
            text.push_str(&format!("# {title}\r\n"));
            for (name, value) in fields {
                let value = self.info.get(name).map_or(value, String::as_str);
                text.push_str(&format!("{name}:{value}\r\n"));
            }
        }
        text
    }
}

/// `ERR unknown command`, as Redis 7.0 writes it (the arguments up to about 128 bytes), and
/// Valkey 9.1 and Redis 8.6 alike.
fn unknown(args: &[Vec<u8>]) -> Value {
    let name: String = String::from_utf8_lossy(&args[0])
        .chars()
        .take(128)
        .collect();
    let mut shown = String::new();
    for arg in &args[1..] {
        if shown.len() >= 128 {
            break;
        }
        let room = 128 - shown.len();
        let arg = String::from_utf8_lossy(arg);
        let arg: String = arg
            .chars()
            .scan(0, |n, c| {
                *n += c.len_utf8();
                (*n <= room).then_some(c)
            })
            .collect();
        shown.push_str(&format!("'{arg}' "));
    }
    reply::error(&format!(
        "ERR unknown command '{name}', with args beginning with: {shown}"
    ))
}

/// A redis-rs command's arguments as a server receives them.
pub(crate) fn args_of(cmd: &redis::Cmd) -> Vec<Vec<u8>> {
    cmd.args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => bytes.to_vec(),
            // A cursor argument (the only other kind): the simulated scans end at once.
            _ => b"0".to_vec(),
        })
        .collect()
}
