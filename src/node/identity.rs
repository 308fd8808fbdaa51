//! A server's identity (`run_id`) and uptime, read from `INFO server` on the first call, after
//! a lost connection, after a `NOSCRIPT` (a server that restarted without persistence lost
//! its script cache too) and at least every [`RECHECK`]: a server that restarted recently
//! may have forgotten the locks it granted, so it is quarantined (see
//! [`RedlockBuilder::restart_quarantine`](crate::RedlockBuilder::restart_quarantine)).

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::RedisError;
use redis::aio::ConnectionLike;

use crate::clock;

/// How often a server's identity is read again while nothing else suggested a restart (a
/// restart that the connection hid: redis-rs reconnected while idle and another client had
/// already loaded the script again).
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// Which restarts quarantine a server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QuarantineRule {
    /// How long after its start a server's votes do not count; zero turns quarantine off.
    pub(crate) period: Duration,
    /// Whether a server first seen young is quarantined too (uptime below `period` at first
    /// contact); otherwise only a `run_id` change seen while connected counts as a restart.
    pub(crate) first_contact: bool,
}

impl QuarantineRule {
    /// No quarantine at all.
    #[cfg(test)]
    pub(crate) const OFF: QuarantineRule = QuarantineRule {
        period: Duration::ZERO,
        first_contact: false,
    };

    /// How long a server seen with `run_id` and `uptime` stays quarantined, given the
    /// `run_id` it had before (`None`: first contact); `None` when it is not quarantined.
    pub(crate) fn remaining(
        &self,
        previous: Option<&str>,
        run_id: &str,
        uptime: Duration,
    ) -> Option<Duration> {
        if self.period.is_zero() {
            return None;
        }
        let restarted = match previous {
            Some(previous) => previous != run_id,
            None => self.first_contact,
        };
        if !restarted {
            return None;
        }
        self.period.checked_sub(uptime).filter(|d| !d.is_zero())
    }
}

/// When a server's identity is read next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Due {
    /// Not now (read recently, quarantine off, or the server cannot tell).
    No,
    /// Before the next call: never read, or something suggested a restart; the call's
    /// repairs and votes depend on it.
    Before,
    /// Beside the next call (the periodic check, in the same round trip): a restart that
    /// nothing else revealed.
    Beside,
}

/// One server's identity as last read, and its quarantine.
pub(crate) struct Identity {
    rule: QuarantineRule,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    run_id: Option<String>,
    /// When the quarantine ends, if the server is or was quarantined.
    until: Option<Instant>,
    /// When the identity was last read.
    checked_at: Option<Instant>,
    /// Something suggested a restart: read the identity before the next call.
    suspect: bool,
    /// The server does not answer `INFO server` (an ACL without it): never asked again.
    unsupported: bool,
}

impl Identity {
    /// A server's identity, quarantined by `rule`.
    pub(crate) fn new(rule: QuarantineRule) -> Self {
        Identity {
            rule,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How long the server is still quarantined; `None` when its votes count. A server
    /// suspected of a restart (a lost connection, `NOSCRIPT`) whose identity could not be read
    /// since is quarantined too, for [`RECHECK`] (fail closed): its votes count again once its
    /// `run_id` is known.
    pub(crate) fn quarantined(&self) -> Option<Duration> {
        let state = self.state();
        if state.suspect && !state.unsupported && !self.rule.period.is_zero() {
            return Some(RECHECK);
        }
        let until = state.until?;
        until
            .checked_duration_since(clock::now())
            .filter(|d| !d.is_zero())
    }

    /// Whether an extension may repair (set again) a missing key on this server: it is not
    /// quarantined.
    pub(crate) fn repairs(&self) -> bool {
        self.quarantined().is_none()
    }

    /// Whether, and how, the identity should be read with the next call.
    pub(crate) fn due(&self) -> Due {
        if self.rule.period.is_zero() {
            return Due::No;
        }
        let state = self.state();
        match state.checked_at {
            _ if state.unsupported => Due::No,
            None => Due::Before,
            Some(_) if state.suspect => Due::Before,
            Some(at) if clock::since(at) >= RECHECK => Due::Beside,
            Some(_) => Due::No,
        }
    }

    /// Something suggested a restart (a lost connection, `NOSCRIPT`): read the identity
    /// before the next call.
    pub(crate) fn suspect(&self) {
        self.state().suspect = true;
    }

    /// Notes the identity read from the server.
    pub(crate) fn observe(&self, run_id: &str, uptime: Duration) {
        let mut state = self.state();
        let now = clock::now();
        if let Some(remaining) = self.rule.remaining(state.run_id.as_deref(), run_id, uptime) {
            let until = now + remaining;
            if state.until.is_none_or(|old| old < until) {
                tracing::warn!(
                    ?remaining,
                    "a lock server restarted recently: its votes do not count until its quarantine ends"
                );
                state.until = Some(until);
            }
        }
        state.run_id = Some(run_id.to_owned());
        state.checked_at = Some(now);
        state.suspect = false;
    }

    /// Reads the identity on `conn` (unless quarantine is off or the server cannot tell). A
    /// server that refuses `INFO` (an ACL, a proxy) is not asked again and never quarantined;
    /// any other failure leaves the check due before the next call (the lock call that follows
    /// reports the connection's state).
    pub(crate) async fn check<C: ConnectionLike + Send>(&self, conn: &mut C) {
        {
            let state = self.state();
            if self.rule.period.is_zero() || state.unsupported {
                return;
            }
        }
        match read(conn).await {
            Ok(Some((run_id, uptime))) => self.observe(&run_id, uptime),
            Ok(None) => self.give_up("INFO server has no run_id or uptime"),
            Err(err) if refuses_info(err.code(), err.detail()) => {
                self.give_up(&err.to_string());
            }
            Err(err) => {
                tracing::debug!(%err, "could not read the server's identity");
                self.suspect();
            }
        }
    }

    fn give_up(&self, why: &str) {
        tracing::warn!(
            why,
            "the server's run_id cannot be read: its restarts are not quarantined"
        );
        self.state().unsupported = true;
    }
}

/// Whether an error (its `code` and `detail`) refuses `INFO` for good: no permission (an ACL
/// without it) or a command the server or a proxy does not know. Any other error (`ERR max
/// number of clients reached`, a server still loading) is passing: the server stays suspect,
/// quarantined until its identity is read (fail closed), never trusted for good.
fn refuses_info(code: Option<&str>, detail: Option<&str>) -> bool {
    match code {
        Some("NOPERM") => true,
        Some("ERR") => detail.is_some_and(|detail| {
            let detail = detail.to_ascii_lowercase();
            detail.contains("unknown command") || detail.contains("unsupported command")
        }),
        _ => false,
    }
}

/// The server's `run_id` and uptime, from `INFO server`.
async fn read<C: ConnectionLike + Send>(
    conn: &mut C,
) -> Result<Option<(String, Duration)>, RedisError> {
    let info: String = redis::cmd("INFO").arg("server").query_async(conn).await?;
    Ok(parse(&info))
}

/// The `run_id` and `uptime_in_seconds` fields of an `INFO server` reply.
fn parse(info: &str) -> Option<(String, Duration)> {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let run_id = field("run_id")?.to_owned();
    let uptime = field("uptime_in_seconds")?.parse::<u64>().ok()?;
    Some((run_id, Duration::from_secs(uptime)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn parses_run_id_and_uptime() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\nuptime_in_days:0\r\n";
        assert_eq!(parse(info), Some(("abc123".to_owned(), 42 * S)));
        assert_eq!(parse("run_id:abc\r\n"), None);
        assert_eq!(parse("uptime_in_seconds:x\r\nrun_id:a\r\n"), None);
    }

    #[test]
    fn only_a_refusal_for_good_stops_the_identity_checks() {
        assert!(refuses_info(
            Some("NOPERM"),
            Some("this user has no permissions")
        ));
        assert!(refuses_info(
            Some("ERR"),
            Some("unknown command 'INFO', with args beginning with: 'server'")
        ));
        assert!(refuses_info(Some("ERR"), Some("Unsupported command")));
        // Passing errors: the server stays suspect (quarantined until read), not trusted.
        assert!(!refuses_info(
            Some("ERR"),
            Some("max number of clients reached")
        ));
        assert!(!refuses_info(
            Some("LOADING"),
            Some("Redis is loading the dataset")
        ));
        assert!(!refuses_info(Some("ERR"), None));
        assert!(!refuses_info(None, None));
    }

    #[test]
    fn by_default_only_a_changed_run_id_quarantines() {
        let rule = QuarantineRule {
            period: 60 * S,
            first_contact: false,
        };
        assert_eq!(rule.remaining(None, "a", S), None, "first contact");
        assert_eq!(rule.remaining(Some("a"), "a", S), None, "same server");
        assert_eq!(rule.remaining(Some("a"), "b", 10 * S), Some(50 * S));
        assert_eq!(rule.remaining(Some("a"), "b", 60 * S), None, "long ago");
    }

    #[test]
    fn first_contact_quarantines_a_young_server_when_asked() {
        let rule = QuarantineRule {
            period: 60 * S,
            first_contact: true,
        };
        assert_eq!(rule.remaining(None, "a", 5 * S), Some(55 * S));
        assert_eq!(rule.remaining(None, "a", 61 * S), None);
        assert_eq!(rule.remaining(Some("a"), "a", 5 * S), None, "seen before");
        assert_eq!(QuarantineRule::OFF.remaining(Some("a"), "b", S), None);
    }

    #[test]
    fn a_restart_seen_quarantines_until_the_period_ends() {
        let identity = Identity::new(QuarantineRule {
            period: 60 * S,
            first_contact: false,
        });
        assert_eq!(identity.due(), Due::Before);
        identity.observe("a", 100 * S);
        assert_eq!(identity.due(), Due::No);
        assert_eq!(identity.quarantined(), None);
        identity.suspect();
        assert_eq!(identity.due(), Due::Before);
        assert_eq!(
            identity.quarantined(),
            Some(RECHECK),
            "unverified: fail closed"
        );
        identity.observe("b", 20 * S);
        let left = identity.quarantined().expect("quarantined");
        assert!(left <= 40 * S && left > 39 * S, "{left:?}");
        assert!(!identity.repairs());
    }
}
