//! One reading of a server's identity and memory, as it comes back: `INFO`'s fields, the memory
//! script's reply, the refusals that stop a check for good, and a step of the server's clock.

use std::time::{Duration, Instant};

use redis::Value;

use crate::memory::{Entry, Marker, Reading};

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
