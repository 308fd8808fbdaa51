//! The signals redfence catches and forwards to its child: TERM, INT, HUP and QUIT.

use nix::sys::signal::Signal as Sig;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::exit::{self, Failure};

/// Receivers for TERM, INT, HUP and QUIT. Once made, these signals no longer end redfence:
/// it decides what they mean (forward them, or stop waiting).
pub struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
    quit: Signal,
}

impl Signals {
    /// Starts catching the four signals.
    pub fn catch() -> Result<Self, Failure> {
        let make = |kind: SignalKind| {
            signal(kind)
                .map_err(|err| Failure::new(exit::SOFTWARE, format!("cannot catch signals: {err}")))
        };
        Ok(Signals {
            term: make(SignalKind::terminate())?,
            int: make(SignalKind::interrupt())?,
            hup: make(SignalKind::hangup())?,
            quit: make(SignalKind::quit())?,
        })
    }

    /// The next signal received (cancel-safe).
    pub async fn recv(&mut self) -> Sig {
        tokio::select! {
            _ = self.term.recv() => Sig::SIGTERM,
            _ = self.int.recv() => Sig::SIGINT,
            _ = self.hup.recv() => Sig::SIGHUP,
            _ = self.quit.recv() => Sig::SIGQUIT,
        }
    }
}

/// The shell convention for death by a signal: 128 + its number.
pub fn exit_code(signal: Sig) -> u8 {
    u8::try_from(128 + signal as i32).unwrap_or(exit::SOFTWARE)
}
