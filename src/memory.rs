//! The voters' memory: whether a voter may have forgotten locks it granted, judged the same
//! way by every client, a process that has just started (every `redfence run`, a deploy, a new
//! replica) as much as one that watched the loss happen.
//!
//! Each voter keeps a **marker**, `<prefix>redfence:memory`: a random id and the server time it
//! was made, with no TTL, made by the first client that finds none. Beside it, a **roster**
//! (`<prefix>redfence:roster:<voter>`, one key per other voter, named as clients name it) holds
//! the marker id clients saw on that other voter, when the roster first saw it, and whether
//! it replaced another id. `scripts/memory.lua` reads both and writes what the client knows, in
//! the round trip of the identity check (`memory/identity.rs`), never one of its own.
//!
//! A voter that loses its keys (a restart without persistence, `FLUSHALL`/`FLUSHDB`, a failover
//! to an empty replica) loses its marker with them: the next client makes a new one, while the
//! other voters' rosters still name the old one. A client that sees a loss the marker survived
//! (evicted keys, a step of the server's clock, a new replication id, a recent restart that
//! reloaded a snapshot) replaces the marker itself, with the same effect for everyone.
//!
//! [`judge`] turns the readings into a verdict, for each voter:
//! - **replaced** (a peer's roster names another id, or says this one replaced another):
//!   quarantined until its new marker is the period old. Its age is the *least* over its own
//!   clock and the times each other voter's roster recorded the replacement, so that one
//!   stepped clock cannot end a quarantine early;
//! - **reloaded** (its marker is older than its start, and it started less than the period
//!   ago: a snapshot or an AOF that may miss the latest grants): quarantined until its uptime
//!   is the period;
//! - **young and unconfirmed** (its marker is younger than the period, and some other voter's
//!   roster has not been read yet): [`Standing::Unsettled`], not counted until every voter
//!   of the round answered (each one's memory is read before its first call), or
//!   [`Standing::Pending`] while a reading of such a roster is under way (then quarantined if
//!   still so: the next attempt knows). A voter set where no client has locked yet has no
//!   rosters, so a brand-new voter set grants at once;
//! - otherwise its votes count.
//!
//! The limits: a voter set that loses the memory of *every* voter at once (all restarted
//! without persistence) leaves no roster to remember, and a majority that lost its memory
//! while every other voter is unreachable (down, or slower than the node timeout) cannot be
//! told from a brand-new set with those voters down: both look brand-new. Fencing tokens are
//! the answer to that, and to every loss the lock cannot see.

use std::time::{Duration, Instant};

/// The marker key's name, after the key prefix.
pub(crate) const MARKER: &str = "redfence:memory";
/// The roster keys' names, after the key prefix and before the voter's name.
pub(crate) const ROSTER: &str = "redfence:roster:";

/// Whether a voter's votes count now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// They count.
    Counts,
    /// They do not, for this long: the voter may have forgotten locks it granted.
    Quarantined(Duration),
    /// Not yet known: the voter's marker is young (this long from the period) and some other
    /// voter's roster is still unread. A round holds such a grant until it is settled, or
    /// until every voter answered: it then counts (no roster read remembers another marker).
    Unsettled(Duration),
    /// Unsettled, while a reading of another voter's roster is under way (it has not timed
    /// out: a server slower than the node timeout to answer a first reading, on a first
    /// contact). Held as an unsettled grant is, but quarantined (for this long) if still so
    /// once every voter answered: the reading may yet remember another marker.
    Pending(Duration),
}

impl Standing {
    /// The stricter of two standings: quarantined over unsettled over counted, the longer
    /// wait over the shorter.
    pub(crate) fn and(self, other: Standing) -> Standing {
        use Standing::{Counts, Pending, Quarantined, Unsettled};
        match (self, other) {
            (Quarantined(a), Quarantined(b)) => Quarantined(a.max(b)),
            (Quarantined(a), _) | (_, Quarantined(a)) => Quarantined(a),
            (Pending(a), Pending(b)) => Pending(a.max(b)),
            (Pending(a), _) | (_, Pending(a)) => Pending(a),
            (Unsettled(a), Unsettled(b)) => Unsettled(a.max(b)),
            (Unsettled(a), Counts) | (Counts, Unsettled(a)) => Unsettled(a),
            (Counts, Counts) => Counts,
        }
    }
}

/// A voter's marker: its id and the server time it was made (ms since the epoch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Marker {
    pub(crate) id: String,
    pub(crate) made_ms: u64,
}

impl Marker {
    /// A marker as `memory.lua` stores it, `id|ms`.
    pub(crate) fn parse(stored: &str) -> Option<Marker> {
        let (id, made) = stored.rsplit_once('|')?;
        Some(Marker {
            id: id.to_owned(),
            made_ms: made.parse().ok()?,
        })
    }
}

/// What a roster says of another voter's marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The marker id clients last saw on that voter.
    pub(crate) id: String,
    /// When this roster first saw that id (its own server time, ms).
    pub(crate) first_seen_ms: u64,
    /// Whether that id replaced another: the voter lost its memory then.
    pub(crate) replaced: bool,
}

impl Entry {
    /// An entry as `memory.lua` stores it, `id|first-seen-ms|replaced`.
    pub(crate) fn parse(stored: &str) -> Option<Entry> {
        let mut parts = stored.rsplitn(3, '|');
        let replaced = match parts.next()? {
            "1" => true,
            "0" => false,
            _ => return None,
        };
        let first_seen_ms = parts.next()?.parse().ok()?;
        Some(Entry {
            id: parts.next()?.to_owned(),
            first_seen_ms,
            replaced,
        })
    }
}

/// One reading of a voter's memory (`memory.lua`'s reply, with `INFO`'s uptime).
#[derive(Clone, Debug)]
pub(crate) struct Reading {
    pub(crate) marker: Marker,
    /// The voter's clock when the script ran (ms since the epoch).
    pub(crate) now_ms: u64,
    /// The voter's uptime, when `INFO` could be read.
    pub(crate) uptime: Option<Duration>,
    /// Its roster: what it says of each other voter, by the voter's name.
    pub(crate) roster: Vec<(String, Entry)>,
    /// This client's clock when the reply came.
    pub(crate) at: Instant,
}

impl Reading {
    /// The marker's age by the voter's own clock.
    fn own_age(&self) -> Duration {
        Duration::from_millis(self.now_ms.saturating_sub(self.marker.made_ms))
    }

    /// Whether the marker was made before the server started: its memory was reloaded (from
    /// an RDB snapshot or an AOF). Uptime is in whole seconds, so a marker made within the
    /// second before the start counts as made after it.
    fn reloaded(&self, uptime: Duration) -> bool {
        let earliest_start = self
            .now_ms
            .saturating_sub((uptime.as_secs() + 1).saturating_mul(1000));
        self.marker.made_ms < earliest_start
    }

    fn entry_for(&self, name: &str) -> Option<&Entry> {
        self.roster
            .iter()
            .find_map(|(peer, entry)| (peer == name).then_some(entry))
    }
}

/// What is known of another voter, to judge one.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Peer<'a> {
    /// Its memory was never read (down, slow, not asked yet); `pending` while a reading of it
    /// is under way.
    Unread { pending: bool },
    /// Its last reading.
    Read(&'a Reading),
}

/// The verdict on a voter, as instants on this client's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum Verdict {
    /// Its votes count.
    #[default]
    Counts,
    /// Quarantined until then.
    Until(Instant),
    /// Unsettled until then (see [`Standing::Unsettled`]).
    Unsettled(Instant),
    /// Pending until then (see [`Standing::Pending`]).
    Pending(Instant),
}

impl Verdict {
    /// The standing at `now`.
    pub(crate) fn at(self, now: Instant) -> Standing {
        let left = |until: Instant| until.checked_duration_since(now).filter(|d| !d.is_zero());
        match self {
            Verdict::Counts => Standing::Counts,
            Verdict::Until(until) => left(until).map_or(Standing::Counts, Standing::Quarantined),
            Verdict::Unsettled(until) => left(until).map_or(Standing::Counts, Standing::Unsettled),
            Verdict::Pending(until) => left(until).map_or(Standing::Counts, Standing::Pending),
        }
    }
}

/// The verdict on the voter named `name` whose memory reads `me`, given its `peers` (every
/// other voter whose memory can be read) and the quarantine `period`. Pure: see the module
/// docs for the rules.
///
/// Also says whether a roster read says the voter's marker replaced another (which a client
/// spreads to the rosters that do not say it yet: see [`MemoryBook::peers_of`]).
pub(crate) fn judge(
    name: &str,
    me: &Reading,
    peers: &[Peer<'_>],
    period: Duration,
) -> (Verdict, bool) {
    let later = |a: Option<Instant>, b: Instant| Some(a.map_or(b, |a| a.max(b)));
    let own_end = me.at + period.saturating_sub(me.own_age());
    let mut until = None;
    if let Some(uptime) = me.uptime
        && uptime < period
        && me.reloaded(uptime)
    {
        until = later(until, me.at + (period - uptime));
    }
    let (mut replaced, mut unread, mut pending) = (false, false, false);
    let mut confirmed_ends = Vec::new();
    for peer in peers {
        let peer = match peer {
            Peer::Unread { pending: under_way } => {
                unread = true;
                pending |= under_way;
                continue;
            }
            Peer::Read(peer) => peer,
        };
        match peer.entry_for(name) {
            None => {}
            // The peer remembers another marker: the memory was lost, how long ago this
            // client cannot tell beyond "since that roster was written".
            Some(entry) if entry.id != me.marker.id => {
                replaced = true;
                until = later(until, peer.at + period);
            }
            // The roster recorded the replacement when it first saw the new id: the loss is
            // at least that old by this peer's clock. An entry first seen without replacing
            // anything (a roster that was itself new) says nothing of the loss.
            Some(entry) if entry.replaced => {
                replaced = true;
                let age = Duration::from_millis(peer.now_ms.saturating_sub(entry.first_seen_ms));
                confirmed_ends.push(peer.at + period.saturating_sub(age));
            }
            Some(_) => {}
        }
    }
    if replaced {
        until = later(until, own_end);
        for end in confirmed_ends {
            until = later(until, end);
        }
    }
    let verdict = match until {
        Some(until) => Verdict::Until(until),
        None if pending && me.own_age() < period => Verdict::Pending(own_end),
        None if unread && me.own_age() < period => Verdict::Unsettled(own_end),
        None => Verdict::Counts,
    };
    (verdict, replaced)
}

mod book;
pub(crate) mod identity;

pub(crate) use book::{Flags, MemoryBook};

#[cfg(test)]
mod tests;
