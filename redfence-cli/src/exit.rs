//! Exit codes (sysexits style) and the failure type every command returns.

use redfence::Error;

/// A command line or option that cannot work (EX_USAGE).
pub const USAGE: u8 = 64;
/// Too few nodes answered, or the fencing counter could not issue a token (EX_UNAVAILABLE).
pub const UNAVAILABLE: u8 = 69;
/// A bug or an unexpected error in redfence itself (EX_SOFTWARE).
pub const SOFTWARE: u8 = 70;
/// The default "busy, not run" code (EX_TEMPFAIL: try again later); `--busy-exit-code`.
pub const BUSY: u8 = 75;
/// The lock was lost (or `--max-hold` was reached) while the command ran: it was stopped.
pub const LOST: u8 = 79;
/// The command could not be executed (as in POSIX shells).
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as in POSIX shells).
pub const NOT_FOUND: u8 = 127;

/// The table shown by `--help` and in the README.
pub const TABLE: &str = "\
Exit codes:
  0-255  the command's own exit code; 128+N when it died of signal N
  64     usage error: bad flag, duration, URL or resource (nothing was sent)
  69     quorum unreachable, or the fencing counter could not issue a token
  70     internal error
  75     busy: another owner holds the lock, the command did not run (--busy-exit-code)
  79     lock lost (or --max-hold reached) while the command ran: it got SIGTERM
  126    the command could not be executed
  127    the command was not found";

/// Why a command ended without a result of its own: an exit code and a one-line message.
#[derive(Debug)]
pub struct Failure {
    /// The process's exit code.
    pub code: u8,
    /// What to print (one line, without the `redfence: ` prefix).
    pub message: String,
}

impl Failure {
    /// A failure with `code` and `message`.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }

    /// A usage error (64).
    pub fn usage(message: impl Into<String>) -> Self {
        Failure::new(USAGE, message)
    }

    /// The failure for a library error; `busy` is the code for a lock held by another owner.
    pub fn from_lock_error(error: &Error, busy: u8) -> Self {
        let code = match error {
            Error::InvalidInput(_) | Error::Config(_) | Error::SemaphoreSize { .. } => USAGE,
            // A wait that ran out says why by its last attempt: held by another owner (busy),
            // or the nodes out of reach (unavailable).
            Error::AcquireTimeout {
                last: Some(last), ..
            } => Failure::from_lock_error(last, busy).code,
            Error::Contended { .. } | Error::AcquireTimeout { .. } => busy,
            Error::QuorumUnreachable { .. }
            | Error::Overloaded { .. }
            | Error::NoValidity { .. }
            | Error::Fencing(_) => UNAVAILABLE,
            Error::LockLost { .. } | Error::RenewalLimit { .. } => LOST,
            _ => SOFTWARE,
        };
        Failure::new(code, error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct() {
        let mut codes = vec![
            USAGE,
            UNAVAILABLE,
            SOFTWARE,
            BUSY,
            LOST,
            CANNOT_EXECUTE,
            NOT_FOUND,
        ];
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), 7);
    }

    #[test]
    fn contention_is_the_busy_code() {
        let error = Error::Contended {
            resources: vec!["r".into()],
            denied: 2,
            nodes: 3,
            attempts: 1,
        };
        assert_eq!(Failure::from_lock_error(&error, 3).code, 3);
        assert_eq!(Failure::from_lock_error(&error, BUSY).code, BUSY);
    }
}
