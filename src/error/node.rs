//! What went wrong on one node.

use std::error::Error as _;
use std::fmt;
use std::time::Duration;

/// What went wrong on one node.
///
/// Its message carries the whole story ("node #2 (10.0.0.3:6379/0): unreachable: connection
/// refused"), because several of them are listed in one
/// [`QuorumUnreachable`](crate::Error::QuorumUnreachable); so it reports no `source()`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeError {
    /// The node's position in the order the builder was given.
    pub index: usize,
    /// The node's address, without credentials.
    pub addr: String,
    /// What happened.
    pub failure: NodeFailure,
}

/// The kind of failure a single node had.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NodeFailure {
    /// The node did not answer within `node_timeout`.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The node could not be reached (refused, reset, not connected yet, a TLS handshake
    /// failed: e.g. its certificate is not trusted).
    #[error("unreachable")]
    Connection(#[source] redis::RedisError),
    /// This client could not keep up: the node's request queue was full, so the request was
    /// never sent. A sign of overload on the client's side, not of a failed node.
    #[error("overloaded: {queued} requests were already waiting for this node")]
    Overloaded {
        /// How many requests were waiting.
        queued: usize,
    },
    /// The node answered with an error, e.g. `WRONGTYPE` when a key holds a hash, or
    /// `WRONGPASS` when the password is wrong.
    #[error("error reply")]
    Reply(#[source] redis::RedisError),
    /// The node's ACL refused a command or key (`NOPERM`): the user lacks a permission
    /// redfence needs. The server's message names it (e.g. `'evalsha' command`); the repository's
    /// docs/production.md gives the ACL line that grants what redfence needs.
    #[error("permission denied by the node's ACL")]
    Permission(#[source] redis::RedisError),
    /// The call was not run on the node, for a reason on this client's side: no Tokio runtime
    /// to run it on, the node's request queue stopped with its runtime, or a request that a
    /// later request of the same lock (its release) had already overtaken.
    #[error("not run: {0}")]
    NotRun(&'static str),
    /// The node's reply was not of the shape redfence expects (e.g. a reply count other than
    /// the request count): a server redfence does not support, or something in between that
    /// changes replies.
    #[error("unexpected reply: {0}")]
    UnexpectedReply(String),
    /// The node lost some of its memory recently (a restart, a flush, a failover, evicted keys,
    /// a step of its clock: see
    /// [`restart_quarantine`](crate::RedlockBuilder::restart_quarantine)): it may have
    /// forgotten locks it granted, so its grant (or its confirmation of an extension) does not
    /// count toward a majority until `remaining` has passed. Its key was still written (and
    /// released if the round failed).
    #[error(
        "may have forgotten locks it granted (restarted, flushed or evicted recently): quarantined for another {remaining:?}"
    )]
    Quarantined {
        /// How long the quarantine still lasts.
        remaining: Duration,
    },
}

impl From<redis::RedisError> for NodeFailure {
    fn from(err: redis::RedisError) -> Self {
        match Class::of(&err) {
            Class::Lost | Class::Unreached => NodeFailure::Connection(err),
            Class::Denied => NodeFailure::Permission(err),
            _ => NodeFailure::Reply(err),
        }
    }
}

/// What a failure means for the request and for the node, decided here and nowhere else:
/// whether the same request is sent again, whether the node may have restarted under it,
/// whether the node answered (a refusal, quick to release) or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// No answer within the node timeout: the call may yet run. Sent again (a release, a
    /// leave); not a restart sign by itself.
    Unanswered,
    /// The connection was lost under the call (reset, closed, an I/O error): the call may or
    /// may not have run, and the server may have restarted. Sent again, a restart sign.
    Lost,
    /// The server was not reached, or the connection failed on the client's side before any
    /// command (a native-tls handshake): sent again.
    Unreached,
    /// The server will take the same request later: busy with a script, loading its data, a
    /// cluster in a failover (`BUSY`, `LOADING`, `TRYAGAIN`, `MASTERDOWN`). Sent again.
    Later,
    /// The server does not have the script (`NOSCRIPT`): load it and run the call again; a
    /// restart sign (or a `SCRIPT FLUSH`).
    NoScript,
    /// The connection's login was refused (`WRONGPASS`, `NOAUTH`, a failed handshake): the
    /// connection must be made anew. The request's own answer.
    LoginRefused,
    /// The ACL refused a command or key (`NOPERM`): the request's own answer, final.
    Denied,
    /// Any other answer of the node's: the request's own, final.
    Final,
    /// Never sent, the client's queue for the node being full (`Overloaded`): final, not the
    /// node's answer. (A call not run for want of a runtime, `NotRun`, is `Final`: counted as
    /// answered, as it always was.)
    NotSent,
}

impl Class {
    /// What `err`, a redis-rs error, means.
    pub(crate) fn of(err: &redis::RedisError) -> Class {
        if err.is_io_error() || err.is_connection_dropped() {
            return Class::Lost;
        }
        if err.is_connection_refusal() {
            return Class::Unreached;
        }
        if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) {
            return Class::NoScript;
        }
        if err.kind() == redis::ErrorKind::AuthenticationFailed
            || err
                .code()
                .is_some_and(|code| matches!(code, "NOAUTH" | "WRONGPASS"))
        {
            return Class::LoginRefused;
        }
        // `Client`: failed before any command, e.g. a native-tls handshake (untrusted server).
        if err.kind() == redis::ErrorKind::Client {
            return Class::Unreached;
        }
        match err.code() {
            Some(code) => Class::of_code(code),
            None => Class::Final,
        }
    }

    /// What a server error `code` means (an error reply inside a pipeline's replies).
    pub(crate) fn of_code(code: &str) -> Class {
        match code {
            "BUSY" | "LOADING" | "TRYAGAIN" | "MASTERDOWN" => Class::Later,
            "NOSCRIPT" => Class::NoScript,
            "NOAUTH" | "WRONGPASS" => Class::LoginRefused,
            "NOPERM" => Class::Denied,
            _ => Class::Final,
        }
    }

    /// Whether the same request may get through later, so that a release or a leave that
    /// failed so is sent again.
    pub(crate) fn retried(self) -> bool {
        matches!(
            self,
            Class::Unanswered | Class::Lost | Class::Unreached | Class::Later
        )
    }

    /// Whether the server may have restarted under the call (and forgotten what it granted):
    /// its identity is read again before its votes count.
    pub(crate) fn restart_sign(self) -> bool {
        matches!(self, Class::Lost | Class::NoScript)
    }

    /// Whether the node answered the call (its answer refused it, or did not count), as
    /// opposed to not answering in time, not being reached or never being asked: its release
    /// is then as quick as its answer was, and worth waiting for.
    pub(crate) fn answered(self) -> bool {
        !matches!(
            self,
            Class::Unanswered | Class::Lost | Class::Unreached | Class::NotSent
        )
    }
}

impl NodeFailure {
    /// The redis-rs error behind this failure, if it is one.
    pub(crate) fn redis(&self) -> Option<&redis::RedisError> {
        match self {
            NodeFailure::Connection(err)
            | NodeFailure::Reply(err)
            | NodeFailure::Permission(err) => Some(err),
            _ => None,
        }
    }

    /// What this failure means (see [`Class`]).
    pub(crate) fn class(&self) -> Class {
        match self {
            NodeFailure::Timeout(_) => Class::Unanswered,
            NodeFailure::Overloaded { .. } => Class::NotSent,
            // A connection failure is retried whatever redis-rs says of it.
            NodeFailure::Connection(err) => match Class::of(err) {
                Class::Lost => Class::Lost,
                _ => Class::Unreached,
            },
            NodeFailure::Reply(err) => match err.code() {
                Some(code) => Class::of_code(code),
                None => Class::Final,
            },
            NodeFailure::Permission(_) => Class::Denied,
            NodeFailure::Quarantined { .. } | NodeFailure::NotRun(_) => Class::Final,
            NodeFailure::UnexpectedReply(_) => Class::Final,
        }
    }
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node #{} ({}): {}", self.index, self.addr, self.failure)?;
        let mut cause = self.failure.source();
        while let Some(err) = cause {
            write!(f, ": {err}")?;
            cause = err.source();
        }
        Ok(())
    }
}

impl std::error::Error for NodeError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error a server's reply `line` (without its CRLF) makes, as redis-rs gives it.
    fn server_error(line: &str) -> redis::RedisError {
        match redis::parse_redis_value(format!("{line}\r\n").as_bytes()) {
            Ok(redis::Value::ServerError(err)) => err.into(),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    #[test]
    fn every_failure_has_one_meaning_for_the_request_and_the_node() {
        let lost = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        let refused =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let cases = [
            (Class::of(&lost), Class::Lost),
            (Class::of(&refused), Class::Lost),
            (
                Class::of(&server_error("-NOSCRIPT No matching script")),
                Class::NoScript,
            ),
            (
                Class::of(&server_error("-BUSY Redis is busy")),
                Class::Later,
            ),
            (Class::of(&server_error("-LOADING loading")), Class::Later),
            (
                Class::of(&server_error("-NOPERM no permissions")),
                Class::Denied,
            ),
            (
                Class::of(&server_error("-WRONGPASS invalid")),
                Class::LoginRefused,
            ),
            (
                Class::of(&server_error("-WRONGTYPE Operation")),
                Class::Final,
            ),
        ];
        for (got, expected) in cases {
            assert_eq!(got, expected);
        }
        // Retried: what may get through later; restart signs: what a restart explains.
        let retried = [
            Class::Unanswered,
            Class::Lost,
            Class::Unreached,
            Class::Later,
        ];
        let signs = [Class::Lost, Class::NoScript];
        let unanswered = [
            Class::Unanswered,
            Class::Lost,
            Class::Unreached,
            Class::NotSent,
        ];
        let all = [
            Class::Unanswered,
            Class::Lost,
            Class::Unreached,
            Class::Later,
            Class::NoScript,
            Class::LoginRefused,
            Class::Denied,
            Class::Final,
            Class::NotSent,
        ];
        for class in all {
            assert_eq!(class.retried(), retried.contains(&class), "{class:?}");
            assert_eq!(class.restart_sign(), signs.contains(&class), "{class:?}");
            assert_eq!(class.answered(), !unanswered.contains(&class), "{class:?}");
        }
    }

    #[test]
    fn a_failure_is_typed_by_its_cause_not_a_made_up_server_error() {
        let failure = |err| NodeFailure::from(err);
        let lost = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(matches!(failure(lost), NodeFailure::Connection(_)));
        let denied = server_error("-NOPERM no permissions");
        assert!(matches!(failure(denied), NodeFailure::Permission(_)));
        let busy = failure(server_error("-BUSY Redis is busy"));
        assert!(matches!(busy, NodeFailure::Reply(_)));
        assert!(busy.class().retried(), "a BUSY release is sent again");
        assert_eq!(
            NodeFailure::Timeout(Duration::ZERO).class(),
            Class::Unanswered
        );
        assert_eq!(
            NodeFailure::Overloaded { queued: 1 }.class(),
            Class::NotSent
        );
        let not_run = NodeFailure::NotRun("no runtime");
        assert_eq!(
            (not_run.class(), not_run.to_string()),
            (Class::Final, "not run: no runtime".into())
        );
        let odd = NodeFailure::UnexpectedReply("2 replies to 3 requests".into());
        assert!(odd.class().answered() && !odd.class().retried());
    }
}
