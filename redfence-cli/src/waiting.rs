//! The live "waiting for lock ..." line shown while a busy lock is awaited.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use redfence::Error;

/// Shows progress while waiting: on a terminal, one line rewritten after every attempt;
/// otherwise (cron, a pipe) a log line when the wait starts.
#[derive(Debug)]
pub struct Waiting {
    resources: String,
    started: Instant,
    budget: Duration,
    live: bool,
    shown: bool,
}

impl Waiting {
    /// Progress for a wait of up to `budget` on `resources`; `quiet` shows nothing live.
    pub fn new(resources: &[String], budget: Duration, quiet: bool) -> Self {
        Waiting {
            resources: resources.join(","),
            started: Instant::now(),
            budget,
            live: !quiet && std::io::stderr().is_terminal(),
            shown: false,
        }
    }

    /// After a failed attempt that will be retried.
    pub fn update(&mut self, error: &Error) {
        let reason = match error {
            _ if crate::exit::held_elsewhere(error) => "held by another owner",
            Error::QuorumUnreachable { .. } => "too few nodes answered",
            _ => "not granted",
        };
        let waited = self.started.elapsed().as_secs_f64();
        let budget = self.budget.as_secs_f64();
        if self.live {
            let mut stderr = std::io::stderr().lock();
            let _ = write!(
                stderr,
                "\r\x1b[2Kwaiting for lock on {} ({reason}): {waited:.1} s of {budget:.1} s",
                self.resources
            );
            let _ = stderr.flush();
        } else if !self.shown {
            tracing::info!(
                "waiting for lock on {} ({reason}), up to {budget:.1} s",
                self.resources
            );
        }
        self.shown = true;
    }

    /// Erases the live line, once the wait is over.
    pub fn finish(&mut self) {
        if self.live && self.shown {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[2K");
            self.shown = false;
        }
    }
}
