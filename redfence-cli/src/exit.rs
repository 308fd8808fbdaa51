//! Exit codes (sysexits style) and the failure type every command returns.

use redfence::{Error, NodeFailure};

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
  64     usage error: bad flag, duration, URL, nodes file or resource (nothing was sent)
  69     quorum unreachable, or the fencing counter could not issue a token
  70     internal error
  75     busy: another owner holds the lock, the command did not run (--busy-exit-code);
         also refused by a holder with the other nodes in restart quarantine
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
            Error::QuorumUnreachable { .. } if held_elsewhere(error) => busy,
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

/// Whether a lock was not acquired because another owner holds it: contention (refusals
/// alone ruled a majority out), a wait that ran out in line or on contention, or, during a
/// restart quarantine, refusals that rule a majority out once the quarantined nodes are left
/// aside. A quarantined node's grant is no sign that the lock is free: the node restarted and
/// may have forgotten the holder's key, which is why it is quarantined. So a holder on one of
/// three nodes, the other two restarted, is busy (75), not unreachable (69); with no refusal
/// at all (every node quarantined, say), nobody is known to hold it: unreachable. Nodes that
/// failed (timed out, unreachable) do not change the answer: once the refusals and the
/// quarantine rule a majority out, a node that answered could not have changed the outcome.
pub fn held_elsewhere(error: &Error) -> bool {
    match error {
        Error::Contended { .. } | Error::AcquireTimeout { last: None, .. } => true,
        Error::AcquireTimeout {
            last: Some(last), ..
        } => held_elsewhere(last),
        Error::QuorumUnreachable {
            denied,
            quorum,
            nodes,
            errors,
            ..
        } => {
            let quarantined = errors
                .iter()
                .filter(|e| matches!(e.failure, NodeFailure::Quarantined { .. }))
                .count();
            *denied > 0 && nodes.saturating_sub(denied.saturating_add(quarantined)) < *quorum
        }
        _ => false,
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
    fn refusals_that_leave_room_for_a_majority_are_not_busy() {
        // One refusal of three, no quarantine: the other two failed, and could have granted.
        let error = Error::QuorumUnreachable {
            granted: 0,
            denied: 1,
            quorum: 2,
            nodes: 3,
            errors: Vec::new(),
        };
        assert!(!held_elsewhere(&error));
        assert_eq!(Failure::from_lock_error(&error, BUSY).code, UNAVAILABLE);
        let waited = Error::AcquireTimeout {
            waited: std::time::Duration::from_secs(1),
            attempts: 3,
            last: Some(Box::new(error)),
        };
        assert_eq!(Failure::from_lock_error(&waited, BUSY).code, UNAVAILABLE);
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
