//! The command line: `redfence [GLOBAL OPTIONS] run|status|release ...`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand};

use crate::exit;

/// Run a command under a Redlock held on a majority of independent Redis masters; inspect
/// and break locks.
#[derive(Debug, Parser)]
#[command(name = "redfence", version, propagate_version = true, after_help = exit::TABLE)]
pub struct Cli {
    /// Options every command takes.
    #[command(flatten)]
    pub common: Common,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes.
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
pub struct Common {
    /// Redis masters, comma-separated or repeated (redis://[user:password@]host:port/db). On
    /// a command line they are visible to every user of the machine (ps): give passwords in
    /// REDFENCE_NODES or --nodes-file instead
    #[arg(long, env = "REDFENCE_NODES", value_delimiter = ',', global = true)]
    pub nodes: Vec<String>,

    /// A file of Redis masters instead of --nodes: one URL per line, blank lines and lines
    /// starting with # ignored. Refused unless only its owner may read it (mode 0600 or
    /// stricter): it holds their passwords
    #[arg(long, env = "REDFENCE_NODES_FILE", value_name = "PATH", global = true)]
    pub nodes_file: Option<PathBuf>,

    /// A prefix put before every resource name to form its Redis key
    #[arg(long, env = "REDFENCE_KEY_PREFIX", default_value = "", global = true)]
    pub key_prefix: String,

    /// The longest one call to one node may take
    #[arg(long, env = "REDFENCE_NODE_TIMEOUT", default_value = "50ms",
          value_parser = duration, global = true)]
    pub node_timeout: Duration,

    /// How long a Redis server that lost memory (restarted, flushed, failed over, evicted keys,
    /// clock stepped) does not count toward a majority, for every run (0s: off; default: 60s,
    /// or --ttl if longer, plus --lock-delay)
    #[arg(long, env = "REDFENCE_RESTART_QUARANTINE", value_parser = duration,
          value_name = "DURATION", global = true)]
    pub restart_quarantine: Option<Duration>,

    /// After a lock ends without a release (a crash), keep its resources locked this much
    /// longer (0s: off)
    #[arg(long, env = "REDFENCE_LOCK_DELAY", default_value = "0s", value_parser = duration,
          value_name = "DURATION", global = true)]
    pub lock_delay: Duration,

    /// More log output on stderr (-v debug, -vv trace); RUST_LOG overrides
    #[arg(short, long, action = ArgAction::Count, global = true, conflicts_with = "quiet")]
    pub verbose: u8,

    /// Only errors on stderr
    #[arg(short, long, global = true)]
    pub quiet: bool,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command while holding the lock: extended while it runs, released when it exits
    #[command(after_help = exit::TABLE)]
    Run(RunArgs),
    /// Show who holds resources on each node, and the quorum view (advisory)
    Status(StatusArgs),
    /// Break-glass: delete the lock keys on every node, whoever holds them
    Release(ReleaseArgs),
}

/// `redfence run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// A resource to lock (repeatable). Default: "redfence:run:" and the 64-bit FNV-1a hash
    /// of the command line, in hex
    #[arg(short, long = "resource", value_name = "RESOURCE")]
    pub resources: Vec<String>,

    /// Run holding one of N permits of a counting semaphore instead of a lock: at most N such
    /// runs at once. Needs exactly one -r, the semaphore's name; every run of it must use the
    /// same N. The command gets REDFENCE_SLOT (0 to N-1)
    #[arg(short = 'n', long = "permits", value_name = "N")]
    pub permits: Option<u32>,

    /// Run holding the read side of a read-write lock: beside any number of --shared runs of
    /// the same -r NAME, never beside an --exclusive one. Needs exactly one -r
    #[arg(long, conflicts_with_all = ["permits", "exclusive"])]
    pub shared: bool,

    /// Run holding the write side of a read-write lock: alone, with no --shared or other
    /// --exclusive run of the same -r NAME. While it waits (--wait), new --shared runs queue
    /// behind it. Needs exactly one -r
    #[arg(long, conflicts_with = "permits")]
    pub exclusive: bool,

    /// The lock's time to live; it is extended while the command runs
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub ttl: Duration,

    /// Wait up to this long for a busy lock (default: do not wait)
    #[arg(short, long, value_parser = duration, value_name = "DURATION")]
    pub wait: Option<Duration>,

    /// Do not wait for a busy lock: exit with the busy code at once (the default)
    #[arg(long, conflicts_with = "wait")]
    pub no_wait: bool,

    /// Keep the lock at least this long after acquiring it, even when the command is done
    /// sooner (so that a clock-skewed twin cannot run the same slot)
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub min_hold: Option<Duration>,

    /// Hold the lock at most this long: then the command gets SIGTERM and redfence exits 79.
    /// The lock is given up when its next extension would end past it, up to one --ttl sooner
    #[arg(long, value_parser = duration, value_name = "DURATION")]
    pub max_hold: Option<Duration>,

    /// The grace between SIGTERM and SIGKILL when the lock is lost or the hold ends, and for
    /// what the command leaves running when it exits (at most until shortly before the lease
    /// ends: 1 % of --ttl plus 22 ms)
    #[arg(long, default_value = "10s", value_parser = duration, value_name = "DURATION")]
    pub kill_after: Duration,

    /// The exit code when the lock is busy and the command did not run
    #[arg(long, default_value_t = exit::BUSY, value_name = "N")]
    pub busy_exit_code: u8,

    /// A fencing counter: redis://... or postgres://... (passed as REDFENCE_FENCE)
    #[arg(long, env = "REDFENCE_FENCING", value_name = "URL")]
    pub fencing: Option<String>,

    /// Run the command line with /bin/sh -c (its words joined with spaces)
    #[arg(long)]
    pub shell: bool,

    /// Let the command inherit REDFENCE_NODES, REDFENCE_NODES_FILE and REDFENCE_FENCING (URLs
    /// that may hold passwords, and where to read some), which are otherwise removed from its
    /// environment
    #[arg(long)]
    pub pass_env: bool,

    /// The command and its arguments, after `--`. It gets REDFENCE_RESOURCES (comma-separated),
    /// REDFENCE_TTL_MS, with -n REDFENCE_SLOT, and, with --fencing, REDFENCE_FENCE; not
    /// REDFENCE_NODES, REDFENCE_NODES_FILE nor REDFENCE_FENCING (see --pass-env). On Linux
    /// every process it starts is followed, in its process group or out of it, and stopped
    /// before the lock is released; redfence is not dumpable, so that the job cannot read
    /// redfence's environment or memory through /proc
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// `redfence status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,

    /// The one RESOURCE is a counting semaphore of N permits (as `run -n N`): show its N
    /// slots, each a lock, and the holder of each
    #[arg(short = 'n', long = "permits", value_name = "N")]
    pub permits: Option<u32>,

    /// The one RESOURCE is a read-write lock (as `run --shared` / `--exclusive`): show its
    /// writer, its readers and whether a writer waits
    #[arg(long, conflicts_with = "permits")]
    pub rwlock: bool,

    /// The resources to look at
    #[arg(required = true, value_name = "RESOURCE")]
    pub resources: Vec<String>,
}

/// `redfence release`.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// Required: delete the keys whoever holds them
    #[arg(long, required = true)]
    pub force: bool,

    /// Do not ask for confirmation (needed when stdin is not a terminal)
    #[arg(short, long)]
    pub yes: bool,

    /// The resources to free
    #[arg(required = true, value_name = "RESOURCE")]
    pub resources: Vec<String>,
}

/// The longest duration a flag takes: a century (a point in time that far ahead can always be
/// computed; humantime parses values far larger).
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// A duration in humantime form: `500ms`, `30s`, `5m`, `1h 30m`; at most a century.
fn duration(text: &str) -> Result<Duration, String> {
    let duration =
        humantime::parse_duration(text).map_err(|err| format!("{err} (e.g. 500ms, 30s, 5m)"))?;
    if duration > MAX_DURATION {
        return Err("longer than a century".to_owned());
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_variable_that_may_hold_a_url_is_kept_from_the_job() {
        // The variables redfence reads that cannot hold a URL; any other (a new one) must be
        // in child::SECRET_ENV, or added here once it is known to hold no secret.
        const PLAIN: [&str; 4] = [
            "REDFENCE_KEY_PREFIX",
            "REDFENCE_NODE_TIMEOUT",
            "REDFENCE_RESTART_QUARANTINE",
            "REDFENCE_LOCK_DELAY",
        ];
        let cli = Cli::command();
        let run = cli.find_subcommand("run").expect("run");
        let mut names: Vec<String> = cli
            .get_arguments()
            .chain(run.get_arguments())
            .filter_map(|arg| arg.get_env())
            .map(|name| name.to_string_lossy().into_owned())
            .collect();
        names.sort_unstable();
        names.dedup();
        for name in &names {
            assert!(
                crate::child::SECRET_ENV.contains(&name.as_str()) || PLAIN.contains(&name.as_str()),
                "{name}: may it hold a password? add it to SECRET_ENV or to PLAIN"
            );
        }
        for name in crate::child::SECRET_ENV {
            assert!(names.iter().any(|n| n == name), "{name} is no longer read");
        }
    }

    #[test]
    fn run_takes_the_command_after_its_options() {
        let cli = Cli::try_parse_from([
            "redfence",
            "--nodes",
            "redis://a:1,redis://b:2",
            "run",
            "--ttl",
            "5s",
            "--",
            "echo",
            "-n",
            "hi",
        ])
        .expect("parses");
        assert_eq!(cli.common.nodes.len(), 2);
        let Command::Run(run) = cli.command else {
            panic!("not run");
        };
        assert_eq!(run.ttl, Duration::from_secs(5));
        assert_eq!(run.command, ["echo", "-n", "hi"]);
    }

    #[test]
    fn restart_quarantine_and_lock_delay_parse_and_default_off_or_unset() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["redfence", "--nodes", "redis://a:1"];
            args.extend_from_slice(extra);
            args.extend(["status", "job"]);
            Cli::try_parse_from(args).expect("parses")
        };
        let cli = parse(&[]);
        assert_eq!(cli.common.restart_quarantine, None);
        assert_eq!(cli.common.lock_delay, Duration::ZERO);
        let cli = parse(&["--restart-quarantine", "0s", "--lock-delay", "2s"]);
        assert_eq!(cli.common.restart_quarantine, Some(Duration::ZERO));
        assert_eq!(cli.common.lock_delay, Duration::from_secs(2));
        let cli = parse(&["--restart-quarantine", "90s"]);
        assert_eq!(cli.common.restart_quarantine, Some(Duration::from_secs(90)));
    }
}
