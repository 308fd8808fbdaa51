//! The command run under the lock: spawn it, forward signals, stop it, read its exit code.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal as Sig, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::exit::{self, Failure};
use crate::signals;

/// What to run, and how.
#[derive(Debug)]
pub struct Spec {
    /// The command and its arguments (at least one word).
    pub argv: Vec<OsString>,
    /// Run the words joined with spaces through `/bin/sh -c`.
    pub shell: bool,
}

/// What the child learns about its lock, through its environment.
#[derive(Debug)]
pub struct LockEnv<'a> {
    /// The fencing token, when a counter is configured (`REDFENCE_FENCE`).
    pub fence: Option<u64>,
    /// The resources (`REDFENCE_RESOURCES`, comma-separated).
    pub resources: &'a [String],
    /// The TTL in milliseconds (`REDFENCE_TTL_MS`).
    pub ttl_ms: u128,
}

/// Starts the command with stdin, stdout and stderr inherited.
pub fn spawn(spec: &Spec, env: &LockEnv<'_>) -> Result<Child, Failure> {
    let Some((program, args)) = spec.argv.split_first() else {
        return Err(Failure::usage("no command to run"));
    };
    let mut command = if spec.shell {
        let line = spec
            .argv
            .iter()
            .map(|word| word.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        let mut command = Command::new("/bin/sh");
        command.arg("-c").arg(line);
        command
    } else {
        let mut command = Command::new(program);
        command.args(args);
        command
    };
    command
        .env("REDFENCE_RESOURCES", env.resources.join(","))
        .env("REDFENCE_TTL_MS", env.ttl_ms.to_string())
        .env_remove("REDFENCE_FENCE");
    if let Some(fence) = env.fence {
        command.env("REDFENCE_FENCE", fence.to_string());
    }
    command.spawn().map_err(|err| {
        let name = program.to_string_lossy();
        match err.kind() {
            ErrorKind::NotFound => {
                Failure::new(exit::NOT_FOUND, format!("{name}: command not found"))
            }
            _ => Failure::new(
                exit::CANNOT_EXECUTE,
                format!("{name}: cannot execute: {err}"),
            ),
        }
    })
}

/// Sends `signal` to the child, unless it has already been reaped.
pub fn send(child: &Child, signal: Sig) {
    let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) else {
        return;
    };
    if let Err(err) = kill(Pid::from_raw(pid), signal) {
        tracing::debug!(%err, ?signal, "could not signal the command");
    }
}

/// SIGTERM, then SIGKILL if it has not exited after `kill_after`; returns its exit status.
pub async fn terminate(child: &mut Child, kill_after: Duration) -> Result<ExitStatus, Failure> {
    send(child, Sig::SIGTERM);
    let status = match tokio::time::timeout(kill_after, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            tracing::warn!(?kill_after, "the command ignored SIGTERM; sending SIGKILL");
            send(child, Sig::SIGKILL);
            child.wait().await
        }
    };
    status.map_err(|err| Failure::new(exit::SOFTWARE, format!("waiting for the command: {err}")))
}

/// The child's exit code, or 128+N when it died of signal N.
pub fn exit_code(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return u8::try_from(code & 0xff).unwrap_or(exit::SOFTWARE);
    }
    match status.signal().and_then(|n| Sig::try_from(n).ok()) {
        Some(signal) => signals::exit_code(signal),
        None => exit::SOFTWARE,
    }
}
