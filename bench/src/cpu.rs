//! CPU accounting from `/proc`: this process, every process of a name (the servers), and the
//! whole machine, so that a figure can say where the cores went.

use std::time::Duration;

/// The user + system CPU time in a `/proc/<pid>/stat` line (clock ticks, 100 Hz).
fn stat_cpu(stat: &str) -> Duration {
    // Fields after the command name (which is in parentheses and may contain spaces).
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// This process's CPU time (user + system).
pub fn own() -> Duration {
    stat_cpu(&std::fs::read_to_string("/proc/self/stat").unwrap_or_default())
}

/// The CPU time of every running process whose command name is `comm` (e.g. `postgres`).
pub fn named(comm: &str) -> Duration {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Duration::ZERO;
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == comm))
        .map(|e| stat_cpu(&std::fs::read_to_string(e.path().join("stat")).unwrap_or_default()))
        .sum()
}

/// The command name of the servers measured: that of `REDIS_SERVER` (`valkey-server` for
/// Valkey), else `redis-server`. Other servers on the machine (another program's tests) are
/// not counted unless they share it.
pub fn server_name() -> String {
    std::env::var("REDIS_SERVER")
        .ok()
        .and_then(|path| {
            std::path::Path::new(&path)
                .file_name()
                .map(|name| name.to_string_lossy().chars().take(15).collect())
        })
        .unwrap_or_else(|| "redis-server".to_owned())
}

/// The whole machine's busy and total CPU time so far, over every core (`/proc/stat`).
pub fn machine() -> (Duration, Duration) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = ticks.iter().take(8).sum();
    // idle and iowait are the 4th and 5th.
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    let tick = |n: u64| Duration::from_millis(n * 10);
    (tick(total - idle.min(total)), tick(total))
}

/// CPU time spent while something ran: the machine's (busy of total, both cores), this process's,
/// every redis-server's and every PostgreSQL process's.
#[derive(Default)]
pub struct Usage {
    pub busy: Duration,
    pub total: Duration,
    pub client: Duration,
    pub redis: Duration,
    pub postgres: Duration,
}

impl Usage {
    /// What was spent so far.
    pub fn now() -> Usage {
        let (busy, total) = machine();
        Usage {
            busy,
            total,
            client: own(),
            redis: named(&server_name()),
            postgres: named("postgres"),
        }
    }

    /// Adds what was spent between `before` and `after`.
    pub fn add(&mut self, before: &Usage, after: &Usage) {
        let d = |a: Duration, b: Duration| a.saturating_sub(b);
        self.busy += d(after.busy, before.busy);
        self.total += d(after.total, before.total);
        self.client += d(after.client, before.client);
        self.redis += d(after.redis, before.redis);
        self.postgres += d(after.postgres, before.postgres);
    }

    /// The share of the machine's CPUs that was busy.
    pub fn busy_share(&self) -> f64 {
        self.busy.as_secs_f64() / self.total.as_secs_f64().max(1e-9)
    }
}
