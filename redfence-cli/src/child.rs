//! The command run under the lock: spawn it (in a process group of its own, unless run in a
//! terminal's foreground), forward signals, stop all of it, read its exit code.
//!
//! Everything redfence starts is the job: on Linux every descendant of redfence (it is their
//! subreaper, so they stay its descendants when their parents exit, whatever group or session
//! they moved to); elsewhere the job's process group. How the job is signalled and stopped is
//! in `stop.rs`.

mod stop;

use std::ffi::OsString;
use std::io::ErrorKind;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use nix::sys::signal::Signal as Sig;
#[cfg(target_os = "linux")]
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::{Pid, getpgrp, tcgetpgrp};
use tokio::process::{Child, Command};

use crate::exit::{self, Failure};
use crate::signals;
#[cfg(target_os = "linux")]
use crate::tree;

/// The variables of redfence's own environment that may hold a URL with a password (the
/// nodes, the fencing counter) or say where to read some (the nodes file): the job does not
/// get them unless `--pass-env` is given.
pub const SECRET_ENV: [&str; 3] = ["REDFENCE_NODES", "REDFENCE_NODES_FILE", "REDFENCE_FENCING"];

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
    /// The semaphore slot held, with `-n` (`REDFENCE_SLOT`).
    pub slot: Option<u32>,
    /// Whether the job keeps redfence's [`SECRET_ENV`] variables (`--pass-env`).
    pub pass_env: bool,
}

/// The command running under the lock.
///
/// Run from cron, systemd or in the background (no controlling terminal, or not its
/// foreground), it gets a process group of its own. Run in the foreground of a terminal, it
/// stays in redfence's group, so that job control works as for any command (Ctrl-C and Ctrl-Z
/// reach both, the job can use the terminal). Either way, on Linux, every descendant of
/// redfence is the job: signals reach all of it, and what it leaves running is stopped before
/// the lock is released. Elsewhere the job is its process group (or, in a terminal's
/// foreground, its first process).
#[derive(Debug)]
pub struct Job {
    child: Child,
    /// The job's first process.
    leader: Pid,
    /// The job's own process group (the leader's id), when it has one.
    group: Option<Pid>,
    /// Whether nothing of the job is left: nothing to kill on drop.
    settled: bool,
}

impl Job {
    /// Starts the command with stdin, stdout and stderr inherited; in a process group of its
    /// own unless redfence runs in the foreground of a terminal.
    pub fn spawn(spec: &Spec, env: &LockEnv<'_>) -> Result<Job, Failure> {
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
            .env_remove("REDFENCE_FENCE")
            .env_remove("REDFENCE_SLOT")
            .kill_on_drop(true);
        if let Some(slot) = env.slot {
            command.env("REDFENCE_SLOT", slot.to_string());
        }
        if !env.pass_env {
            for name in SECRET_ENV {
                command.env_remove(name);
            }
        }
        if let Some(fence) = env.fence {
            command.env("REDFENCE_FENCE", fence.to_string());
        }
        let own_group = !in_terminal_foreground();
        if own_group {
            command.process_group(0);
        }
        let child = command.spawn().map_err(|err| {
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
        })?;
        let leader = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw)
            .ok_or_else(|| Failure::new(exit::SOFTWARE, "the command has no process id"))?;
        Ok(Job {
            child,
            leader,
            group: own_group.then_some(leader),
            settled: false,
        })
    }

    /// Waits for the job's first process to exit (cancel-safe).
    pub async fn wait(&mut self) -> Result<ExitStatus, Failure> {
        self.child
            .wait()
            .await
            .map_err(|err| Failure::new(exit::SOFTWARE, format!("waiting for the command: {err}")))
    }

    /// The job's first process's exit status, if it has exited (its exit may not have been
    /// seen by [`Job::wait`] yet).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Reaps the adopted orphans that exited, never the job's first process (tokio waits for
    /// it): zombies would otherwise pile up under redfence while a long job runs.
    pub fn reap_orphans(&self) {
        #[cfg(target_os = "linux")]
        loop {
            let peek = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
            match nix::sys::wait::waitid(nix::sys::wait::Id::All, peek).map(|s| s.pid()) {
                Ok(Some(pid)) if pid != self.leader => {
                    let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
                }
                // The first process exited and waits for tokio: the kernel shows it first
                // and hides the others. They are looked up by their parent.
                Ok(Some(_)) => {
                    tree::reap_exited_children(self.leader);
                    break;
                }
                _ => break,
            }
        }
    }
}

impl Drop for Job {
    /// On an error path (the job could not be waited for, a panic), whatever is left of the
    /// job (its group, every descendant of redfence) is killed: it must not outlive the
    /// release that follows.
    fn drop(&mut self) {
        if !self.settled {
            self.send(Sig::SIGKILL);
        }
    }
}

/// Whether redfence runs in the foreground of its controlling terminal (an interactive shell,
/// whatever its stdin): the job then stays in redfence's process group, so that it can use
/// the terminal (a `read < /dev/tty`, an ssh or sudo prompt) and job control reaches both.
/// Without a controlling terminal (cron, systemd) or in the background, the job gets a group
/// of its own.
fn in_terminal_foreground() -> bool {
    let Ok(tty) = std::fs::File::open("/dev/tty") else {
        return false;
    };
    tcgetpgrp(&tty).is_ok_and(|foreground| foreground == getpgrp())
}

/// SIGCHLD, to reap the orphans redfence adopts while the job runs (Linux).
#[derive(Debug)]
pub struct Orphans(Option<tokio::signal::unix::Signal>);

impl Orphans {
    /// Starts listening (nothing to listen for without adoption).
    pub fn listen() -> Self {
        Orphans(if cfg!(target_os = "linux") {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()).ok()
        } else {
            None
        })
    }

    /// Resolves when a child of redfence may have exited; never without adoption. Reap it
    /// with [`Job::reap_orphans`].
    pub async fn exited(&mut self) {
        match &mut self.0 {
            Some(sigchld) => {
                sigchld.recv().await;
            }
            None => std::future::pending().await,
        }
    }
}

/// Makes redfence the reaper of the processes its job leaves behind (Linux), so that they
/// are waited for and counted until they exit, instead of going to init.
pub fn adopt_orphans() {
    #[cfg(target_os = "linux")]
    if let Err(err) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::debug!(%err, "cannot become the subreaper of the command's processes");
    }
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
