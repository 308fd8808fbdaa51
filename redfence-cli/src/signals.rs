//! The signals redfence catches and forwards to its command: TERM, INT, HUP, QUIT, USR1,
//! USR2 and ALRM (every signal whose default would end redfence and leave the command
//! running without the lock, except KILL, which cannot be caught).

use futures::FutureExt;
use nix::sys::signal::Signal as Sig;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::exit::{self, Failure};

/// Receivers for the signals redfence forwards. Once made, these signals no longer end
/// redfence: it decides what they mean (forward them, or stop waiting).
pub struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
    quit: Signal,
    usr1: Signal,
    usr2: Signal,
    alrm: Signal,
}

impl Signals {
    /// Starts catching the signals.
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
            usr1: make(SignalKind::user_defined1())?,
            usr2: make(SignalKind::user_defined2())?,
            alrm: make(SignalKind::alarm())?,
        })
    }

    /// The next signal received (cancel-safe).
    pub async fn recv(&mut self) -> Sig {
        tokio::select! {
            _ = self.term.recv() => Sig::SIGTERM,
            _ = self.int.recv() => Sig::SIGINT,
            _ = self.hup.recv() => Sig::SIGHUP,
            _ = self.quit.recv() => Sig::SIGQUIT,
            _ = self.usr1.recv() => Sig::SIGUSR1,
            _ = self.usr2.recv() => Sig::SIGUSR2,
            _ = self.alrm.recv() => Sig::SIGALRM,
        }
    }

    /// A signal received and not yet taken, without waiting.
    pub fn pending(&mut self) -> Option<Sig> {
        self.recv().now_or_never()
    }
}

/// The shell convention for death by a signal: 128 + its number.
pub fn exit_code(signal: Sig) -> u8 {
    u8::try_from(128 + signal as i32).unwrap_or(exit::SOFTWARE)
}
