//! The command run under the lock: spawn it in a process group of its own, forward signals
//! to the group, stop all of it, read its exit code.

use std::ffi::OsString;
use std::io::{ErrorKind, IsTerminal};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal as Sig, killpg, pthread_sigmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp};
use tokio::process::{Child, Command};
use tokio::time::Instant;

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

/// The command running under the lock, in a process group of its own: signals and the final
/// stop reach everything it started (a shell script's own programs), not only its first
/// process, so nothing it started outlives the lock.
///
/// When redfence runs in the foreground of a terminal, the job's group gets the terminal for
/// as long as it runs (a job that reads it is not stopped; Ctrl-C reaches the job once), and
/// redfence takes the terminal back when it is done.
#[derive(Debug)]
pub struct Job {
    child: Child,
    /// The job's process group: the id of its first process.
    group: Pid,
    /// Our own process group, when the terminal was handed to the job.
    terminal: Option<Pid>,
}

impl Job {
    /// Starts the command with stdin, stdout and stderr inherited, in a process group of its
    /// own.
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
            .process_group(0)
            .kill_on_drop(true);
        if let Some(fence) = env.fence {
            command.env("REDFENCE_FENCE", fence.to_string());
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
        let group = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw)
            .ok_or_else(|| Failure::new(exit::SOFTWARE, "the command has no process id"))?;
        let terminal = hand_over_terminal(group);
        Ok(Job {
            child,
            group,
            terminal,
        })
    }

    /// Waits for the job's first process to exit (cancel-safe).
    pub async fn wait(&mut self) -> Result<ExitStatus, Failure> {
        self.child
            .wait()
            .await
            .map_err(|err| Failure::new(exit::SOFTWARE, format!("waiting for the command: {err}")))
    }

    /// Sends `signal` to every process of the job.
    pub fn signal(&self, signal: Sig) {
        match killpg(self.group, signal) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(err) => tracing::debug!(%err, ?signal, "could not signal the command"),
        }
    }

    /// Stops the job: SIGTERM to all of it, SIGKILL to whatever is left after `grace`;
    /// returns the exit status of its first process.
    pub async fn terminate(&mut self, grace: Duration) -> Result<ExitStatus, Failure> {
        let deadline = Instant::now() + grace;
        self.signal(Sig::SIGTERM);
        let status = match tokio::time::timeout_at(deadline, self.child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                tracing::warn!(
                    ?grace,
                    "the command did not stop on SIGTERM; sending SIGKILL"
                );
                self.signal(Sig::SIGKILL);
                self.child.wait().await
            }
        };
        let status = status.map_err(|err| {
            Failure::new(exit::SOFTWARE, format!("waiting for the command: {err}"))
        })?;
        self.stop_the_rest(deadline.saturating_duration_since(Instant::now()))
            .await;
        Ok(status)
    }

    /// After the job's first process exited: stops whatever it left running (its group), with
    /// SIGTERM and, after `grace`, SIGKILL, and waits until none is left, so that nothing
    /// outlives the lock. Gives up (with a warning) a second after SIGKILL: a process stuck
    /// in the kernel cannot be waited for.
    pub async fn stop_the_rest(&mut self, grace: Duration) {
        if self.gone() {
            return;
        }
        tracing::info!("the command left processes running; stopping them");
        self.signal(Sig::SIGTERM);
        if self.gone_by(Instant::now() + grace).await {
            return;
        }
        tracing::warn!(
            ?grace,
            "processes the command left did not stop on SIGTERM; sending SIGKILL"
        );
        self.signal(Sig::SIGKILL);
        if !self.gone_by(Instant::now() + Duration::from_secs(1)).await {
            tracing::warn!("processes the command left are still there after SIGKILL");
        }
    }

    /// Whether no process of the job's group is left, after reaping those that became ours
    /// (redfence is their subreaper) and have exited.
    fn gone(&self) -> bool {
        reap_group(self.group);
        matches!(killpg(self.group, None), Err(Errno::ESRCH))
    }

    /// Waits until the group is gone or `deadline` passes; whether it is gone. Nothing
    /// announces an empty process group: checked every 10 ms.
    async fn gone_by(&self, deadline: Instant) -> bool {
        loop {
            if self.gone() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(ours) = self.terminal.take() {
            take_back_terminal(ours);
        }
    }
}

/// How often [`Job::stop_the_rest`] looks whether the job's processes are gone.
const POLL: Duration = Duration::from_millis(10);

/// Makes redfence the reaper of the processes its job leaves behind (Linux), so that they
/// are waited for and counted until they exit, instead of going to init.
pub fn adopt_orphans() {
    #[cfg(target_os = "linux")]
    if let Err(err) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::debug!(%err, "cannot become the subreaper of the command's processes");
    }
}

/// Reaps the exited processes of `group` that redfence adopted. Called only after the
/// group's first process was waited for by tokio (it is in the group too).
fn reap_group(group: Pid) {
    let any_of_group = Pid::from_raw(-group.as_raw());
    while let Ok(status) = waitpid(any_of_group, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

/// Gives the terminal to the job's group when redfence is in the terminal's foreground:
/// returns our own group, to take it back. A job that read the terminal before the handover
/// was stopped (SIGTTIN): SIGCONT lets it go on, as a shell's job control does.
fn hand_over_terminal(group: Pid) -> Option<Pid> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return None;
    }
    let ours = getpgrp();
    if tcgetpgrp(&stdin).ok()? != ours {
        return None;
    }
    tcsetpgrp(&stdin, group).ok()?;
    let _ = killpg(group, Sig::SIGCONT);
    Some(ours)
}

/// Takes the terminal back for our group. Redfence is in the background by then, where
/// setting the foreground group would stop it with SIGTTOU, unless that is blocked.
fn take_back_terminal(ours: Pid) {
    let mut ttou = SigSet::empty();
    ttou.add(Sig::SIGTTOU);
    let mut old = SigSet::empty();
    if pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut old)).is_err() {
        return;
    }
    if let Err(err) = tcsetpgrp(std::io::stdin(), ours) {
        tracing::debug!(%err, "could not take the terminal back");
    }
    let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
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
