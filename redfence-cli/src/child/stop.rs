//! Signals to the whole job, and its stop sequence: SIGTERM (then SIGCONT) to every process of
//! the job, SIGKILL to whatever is left after the grace, until none is left.
//!
//! The job's processes are its process group, when it has one, and on Linux every live
//! descendant of redfence, wherever it moved (`tree.rs`). A process group gets a signal with
//! one `killpg`; a descendant outside it gets its own `kill`, so that none gets it twice.

use std::process::ExitStatus;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal as Sig, kill, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgrp, getpid};
use tokio::time::Instant;

use super::{Job, in_terminal_foreground};
use crate::exit::{self, Failure};
use crate::tree;

/// How long processes are waited for after SIGKILL: one stuck in the kernel (a hung NFS
/// mount) outlives it, and cannot be waited for.
const AFTER_SIGKILL: Duration = Duration::from_secs(1);

/// How soon the stop sequence first looks again whether the job's processes are gone: nothing
/// announces the exit of a process that is not redfence's child. Each look reads every
/// process's `/proc/<pid>/stat`, so the pause doubles up to [`POLL_MAX`].
const POLL: Duration = Duration::from_millis(10);

/// The longest pause between two looks: how late, at most, the lock is released after the
/// job's last process exited.
const POLL_MAX: Duration = Duration::from_millis(100);

impl Job {
    /// Passes on a signal redfence received, to every process of the job. In a terminal's
    /// foreground the job shares redfence's process group, and INT, QUIT and HUP come to the
    /// whole group (Ctrl-C, Ctrl-\\, the terminal hanging up): the job's processes in it
    /// already have theirs, and a second one would read as "abort the cleanup" to many
    /// programs. Those get it only when they left the group (GNU `timeout`, `setsid`).
    pub fn forward(&self, signal: Sig) {
        if self.group.is_none()
            && matches!(signal, Sig::SIGINT | Sig::SIGQUIT | Sig::SIGHUP)
            && in_terminal_foreground()
        {
            tracing::debug!(
                ?signal,
                "the terminal sent it to the command too: forwarded only to its processes \
                 outside the terminal's foreground group"
            );
            let foreground = getpgrp();
            self.send_to(signal, Some(foreground));
            self.send_to(Sig::SIGCONT, Some(foreground));
            return;
        }
        tracing::info!(?signal, "forwarding to the command");
        self.signal(signal);
    }

    /// Sends `signal` to every process of the job, then SIGCONT: a stopped process (SIGSTOP,
    /// or SIGTTIN for reading a terminal it does not own) would otherwise keep the signal
    /// pending, and the lock, for good.
    fn signal(&self, signal: Sig) {
        self.send(signal);
        if !matches!(signal, Sig::SIGKILL | Sig::SIGCONT) {
            self.send(Sig::SIGCONT);
        }
    }

    /// Sends `signal` to every process of the job, once each.
    pub(super) fn send(&self, signal: Sig) {
        self.send_to(signal, None);
    }

    /// Sends `signal` to the job's own process group (or, without one, its first process)
    /// unless `reached`, a group that got it already, is given; then to every live descendant
    /// of redfence outside that group.
    fn send_to(&self, signal: Sig, reached: Option<Pid>) {
        let mut sent_leader = false;
        let skip = match (reached, self.group) {
            (Some(group), _) => Some(group),
            (None, Some(group)) => {
                report(killpg(group, signal), signal);
                Some(group)
            }
            (None, None) => {
                // Once reaped (its id is gone) the first process's pid may be another's.
                if self.child.id().is_some() {
                    report(kill(self.leader, signal), signal);
                    sent_leader = true;
                }
                None
            }
        };
        for process in tree::descendants() {
            if process.alive
                && Some(process.group) != skip
                && !(sent_leader && process.pid == self.leader)
            {
                report(kill(process.pid, signal), signal);
            }
        }
    }

    /// Stops the job: SIGTERM to all of it, SIGKILL to whatever is left after `grace`, and
    /// waits until none is left; returns the exit status of its first process.
    pub async fn terminate(&mut self, grace: Duration) -> Result<ExitStatus, Failure> {
        let none_left = self.stop_all(grace).await;
        match self.child.try_wait() {
            Ok(Some(status)) => {
                if !none_left {
                    tracing::warn!(
                        "processes of the command are still there a second after SIGKILL"
                    );
                }
                Ok(status)
            }
            _ => Err(Failure::new(
                exit::LOST,
                "the lock was lost while the command ran, and the command was still there a \
                 second after SIGKILL",
            )),
        }
    }

    /// After the job's first process exited: stops whatever of the job is left (what it
    /// started in the background, in its group or out of it), with SIGTERM and, after
    /// `grace`, SIGKILL, and waits until none is left. Gives up (with a warning) a second
    /// after SIGKILL: a process stuck in the kernel cannot be waited for.
    pub async fn stop_the_rest(&mut self, grace: Duration) {
        if !self.left() {
            self.settled = true;
            return;
        }
        tracing::info!("the command left processes running; stopping them");
        if !self.stop_all(grace).await {
            tracing::warn!("processes the command left are still there a second after SIGKILL");
        }
    }

    /// SIGTERM (and SIGCONT) to every process of the job, once: a process it starts later
    /// (a cleanup handler's own programs) is not interrupted. Then SIGKILL, again on every
    /// pass (a process may fork while the others are killed), to whatever is left after
    /// `grace`, for a second at most. Whether none is left.
    async fn stop_all(&mut self, grace: Duration) -> bool {
        let deadline = Instant::now() + grace;
        self.signal(Sig::SIGTERM);
        let mut pause = POLL;
        loop {
            if !self.left() {
                self.settled = true;
                return true;
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
            pause = (pause * 2).min(POLL_MAX);
        }
        tracing::warn!(
            ?grace,
            "processes of the command did not stop on SIGTERM; sending SIGKILL"
        );
        let deadline = Instant::now() + AFTER_SIGKILL;
        loop {
            self.send(Sig::SIGKILL);
            tokio::time::sleep(POLL).await;
            if !self.left() {
                self.settled = true;
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
        }
    }

    /// Reaps what of the job exited (its first process through tokio, the orphans redfence
    /// adopted); whether anything of it is left: its first process, a live descendant of
    /// redfence, a member of its group.
    fn left(&mut self) -> bool {
        let first_done = !matches!(self.child.try_wait(), Ok(None));
        let own = getpid();
        let mut live = false;
        for process in tree::descendants() {
            if process.alive {
                live = true;
            } else if process.parent == own && process.pid != self.leader {
                let _ = waitpid(process.pid, Some(WaitPidFlag::WNOHANG));
            }
        }
        let group_left = match self.group {
            // Its first process is in the group too: only once tokio has waited for it may
            // the group's exited members be reaped here.
            Some(group) if first_done => {
                let any_of_group = Pid::from_raw(-group.as_raw());
                while let Ok(status) = waitpid(any_of_group, Some(WaitPidFlag::WNOHANG)) {
                    if status == WaitStatus::StillAlive {
                        break;
                    }
                }
                !matches!(killpg(group, None), Err(Errno::ESRCH))
            }
            Some(_) => true,
            None => false,
        };
        !first_done || live || group_left
    }
}

/// Logs a signal that could not be sent (a process that is gone is not an error).
fn report(sent: nix::Result<()>, signal: Sig) {
    match sent {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(err) => tracing::debug!(%err, ?signal, "could not signal a process of the command"),
    }
}
