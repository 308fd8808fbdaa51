//! What one reading shows: the replies of `INFO` and the memory script (or why they cannot be
//! read), the losses a connected client sees between two readings, and a step of the server's
//! clock.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use redis::Value;

use super::{Asked, Identity};
use crate::clock;
use crate::error::Class;
use crate::memory::{Entry, Marker, Reading};

impl Identity {
    /// Notes one reading's `replies` (to `asked`), taken between `sent` and `received`.
    pub(super) fn observe(
        &self,
        asked: &Asked,
        replies: Vec<Value>,
        sent: Instant,
        received: Instant,
    ) {
        let mut replies = replies.into_iter();
        let mut failed = false;
        let mut info = None;
        if asked.info {
            match replies.next() {
                Some(Value::ServerError(err)) if refuses(Some(err.code()), err.details()) => {
                    self.give_up("INFO", &format!("{err:?}"));
                    self.state().info_refused = true;
                }
                Some(value) => match text(&value).and_then(|text| parse_info(&text)) {
                    Some(read) => info = Some(read),
                    None => failed = true,
                },
                None => failed = true,
            }
        }
        if asked.load
            && let Some(Value::ServerError(err)) = replies.next()
        {
            failed |= !self.memory_refused_by(Some(err.code()), err.details());
        }
        let mut reading = None;
        if asked.memory {
            match replies.next() {
                Some(Value::ServerError(err)) if Class::of_code(err.code()) == Class::NoScript => {
                    // A server that no longer has the script may have restarted.
                    self.state().loaded = false;
                    failed = true;
                }
                Some(Value::ServerError(err)) => {
                    failed |= !self.memory_refused_by(Some(err.code()), err.details());
                }
                Some(value) => match parse_memory(value, &asked.peers, info.as_ref(), received) {
                    Some(read) => reading = Some(read),
                    None => failed = true,
                },
                None => failed = true,
            }
        }
        if failed {
            tracing::debug!("could not read the server's identity and memory");
            self.suspect();
            return;
        }
        self.note(asked, info, reading, sent, received);
    }

    /// Whether an error to the memory script refuses it for good (then noted): no permission
    /// (an ACL without `TIME`, keys outside the user's patterns: inside a script Redis 7 says
    /// "The user executing the script can't run this command" or "can't access", Valkey 9 and
    /// Redis 8 "ACL failure in script: … has no permissions to run …"), a
    /// command the server does not know, or another type at the marker's key.
    fn memory_refused_by(&self, code: Option<&str>, detail: Option<&str>) -> bool {
        let refused = refuses(code, detail)
            || code == Some("WRONGTYPE")
            || detail.is_some_and(|d| {
                [
                    "NOPERM",
                    "WRONGTYPE",
                    "can't run this command",
                    "can't access",
                    "no permissions",
                    "ACL failure",
                ]
                .iter()
                .any(|sign| d.contains(sign))
            });
        if refused {
            self.give_up("the memory script", detail.unwrap_or_default());
            self.state().memory_refused = true;
            self.memory.unreadable(self.index);
        }
        refused
    }

    /// Notes a reading that succeeded: what it shows of a loss, then the memory book.
    fn note(
        &self,
        asked: &Asked,
        info: Option<Info>,
        reading: Option<Reading>,
        sent: Instant,
        received: Instant,
    ) {
        let period = self.rule.period;
        let mut state = self.state();
        let previous_marker = state.marker.clone();
        let now = clock::now();
        let mut until: Option<Instant> = None;
        let mut lost = |why: &str, end: Instant| {
            tracing::warn!(
                why,
                "a lock server may have forgotten locks it granted: its votes do not count \
                 until its quarantine ends"
            );
            until = Some(until.map_or(end, |until: Instant| until.max(end)));
        };
        // Losses the marker may have survived: replaced by the next reading.
        let mut survived = false;
        if let (Some(old), Some(new)) = (&state.info, &info) {
            if old.run_id != new.run_id {
                if let Some(left) = period.checked_sub(new.uptime).filter(|d| !d.is_zero()) {
                    lost("restarted", now + left);
                    survived = true;
                }
            } else if new.replid.is_some() && old.replid != new.replid {
                lost("a new replication id (a failover)", now + period);
                survived = true;
            }
            if new.evicted > old.evicted && old.evicted.is_some() {
                lost("it evicted keys", now + period);
                survived = true;
            }
        }
        if let (Some(old), Some(reading)) = (state.clock, &reading)
            && stepped(old, reading.now_ms, sent, received, self.rule.drift_factor)
        {
            lost("its clock stepped", now + period);
            survived = true;
        }
        if let (Some(old), Some(reading)) = (&previous_marker, &reading)
            && *old != reading.marker.id
        {
            // Made after the loss: its own age is at most the loss's (the rosters of the other
            // voters keep a stepped clock from shortening it).
            let age = Duration::from_millis(reading.now_ms.saturating_sub(reading.marker.made_ms));
            lost(
                "its memory marker changed",
                reading.at + period.saturating_sub(age),
            );
            survived = false;
        }
        if let Some(until) = until
            && state.until.is_none_or(|old| old < until)
        {
            state.until = Some(until);
        }
        if asked.replace.is_some() && reading.is_some() {
            state.replace = None;
        }
        if survived && let Some(reading) = &reading {
            state.replace = Some(reading.marker.id.clone());
        }
        if let Some(info) = info {
            state.info = Some(info);
        }
        if let Some(reading) = &reading {
            state.clock = Some(ClockSample {
                server_ms: reading.now_ms,
                sent,
                received,
            });
            state.loaded = true;
            state.marker = Some(reading.marker.id.clone());
        }
        state.checked_at = Some(now);
        state.suspect = false;
        let own_counts = state.until.is_none_or(|until| until <= now);
        self.own_counts.store(own_counts, Ordering::Release);
        drop(state);
        if let Some(reading) = reading {
            self.memory.record(self.index, reading);
        }
    }
}

/// The fields of `INFO` that tell a loss.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Info {
    pub(super) run_id: String,
    pub(super) uptime: Duration,
    /// `master_replid`: a new one after a failover or a restart.
    pub(super) replid: Option<String>,
    /// `evicted_keys` since the server started.
    pub(super) evicted: Option<u64>,
}

/// The server's clock in one reading, and the round trip that bracketed it on this client's.
#[derive(Clone, Copy, Debug)]
pub(super) struct ClockSample {
    pub(super) server_ms: u64,
    pub(super) sent: Instant,
    pub(super) received: Instant,
}

/// Whether the server's clock stepped between the reading `old` and one at `server_ms`, taken
/// between `sent` and `received`: each reading happened somewhere within its round trip, so the
/// server's clock moved by between `sent - old.received` and `received - old.sent` of this
/// client's (negative when the two overlapped), give or take the drift bound (`drift_factor`
/// of the interval plus 2 ms, and a millisecond for `TIME`'s rounding).
pub(super) fn stepped(
    old: ClockSample,
    server_ms: u64,
    sent: Instant,
    received: Instant,
    drift_factor: f64,
) -> bool {
    let signed_ms = |later: Instant, earlier: Instant| -> i128 {
        let ms = |d: Duration| i128::try_from(d.as_millis()).unwrap_or(i128::MAX);
        match later.checked_duration_since(earlier) {
            Some(d) => ms(d),
            None => -ms(earlier.saturating_duration_since(later)),
        }
    };
    let moved = i128::from(server_ms) - i128::from(old.server_ms);
    let (least, most) = (signed_ms(sent, old.received), signed_ms(received, old.sent));
    let span =
        Duration::from_millis(u64::try_from(most.abs().max(least.abs())).unwrap_or(u64::MAX));
    let slack = i128::try_from((span.mul_f64(drift_factor) + Duration::from_millis(3)).as_millis())
        .unwrap_or(i128::MAX);
    moved > most.saturating_add(slack) || moved < least.saturating_sub(slack)
}

/// Whether an error (its `code` and `detail`) refuses a call for good: no permission (an ACL
/// without it) or a command the server or a proxy does not know. Any other error (`ERR max
/// number of clients reached`, a server still loading) is passing: the server stays suspect,
/// quarantined until it is read (fail closed), never trusted for good.
pub(super) fn refuses(code: Option<&str>, detail: Option<&str>) -> bool {
    match code {
        Some("NOPERM") => true,
        Some("ERR") => detail.is_some_and(|detail| {
            let detail = detail.to_ascii_lowercase();
            detail.contains("unknown command") || detail.contains("unsupported command")
        }),
        _ => false,
    }
}

/// A text reply's text.
pub(super) fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

/// The fields of an `INFO` reply that tell a loss; `None` without a `run_id` or uptime.
pub(super) fn parse_info(info: &str) -> Option<Info> {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    Some(Info {
        run_id: field("run_id")?.to_owned(),
        uptime: Duration::from_secs(field("uptime_in_seconds")?.parse().ok()?),
        replid: field("master_replid").map(str::to_owned),
        evicted: field("evicted_keys").and_then(|n| n.parse().ok()),
    })
}

/// The memory script's reply (`{marker, now-ms, entry...}`) as a reading taken `at`, the
/// entries those of the voters `peers`, in order; `None` when it does not parse.
pub(super) fn parse_memory(
    value: Value,
    peers: &[String],
    info: Option<&Info>,
    at: Instant,
) -> Option<Reading> {
    let Value::Array(values) = value else {
        return None;
    };
    let mut values = values.into_iter();
    let marker = Marker::parse(&text(&values.next()?)?)?;
    let now_ms = match values.next()? {
        Value::Int(ms) => u64::try_from(ms).ok()?,
        _ => return None,
    };
    let mut roster = Vec::new();
    for (name, value) in peers.iter().zip(values) {
        match value {
            Value::Nil => {}
            value => roster.push((name.clone(), Entry::parse(&text(&value)?)?)),
        }
    }
    Some(Reading {
        marker,
        now_ms,
        uptime: info.map(|info| info.uptime),
        roster,
        at,
    })
}
