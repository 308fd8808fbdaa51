//! The voters' memory: whether a voter may have forgotten locks it granted, judged the same
//! way by every client, a process that has just started (every `redfence run`, a deploy, a new
//! replica) as much as one that watched the loss happen.
//!
//! Each voter keeps a **marker**, `<prefix>redfence:memory`: a random id and the server time it
//! was made, with no TTL, made by the first client that finds none. Beside it, a **roster**
//! (`<prefix>redfence:roster:<voter>`, one key per other voter, named as clients name it) holds
//! the marker id clients saw on that other voter, when the roster first saw it, and whether
//! it replaced another id. `scripts/memory.lua` reads both and writes what the client knows, in
//! the round trip of the identity check (`node/identity.rs`), never one of its own.
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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::clock;

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

/// The memory readings of a `Redlock`'s voters, shared by their identity checks: each
/// reading judges every voter again (a roster read on one voter speaks of the others), and
/// nudges the voters whose roster lags behind it to be read again at once, so that a roster
/// learns the other voters' markers within a round trip or two of a client's first contact,
/// not at its next lock call (which may come after a long hold, or never).
pub(crate) struct MemoryBook {
    period: Duration,
    voters: Mutex<Vec<Voter>>,
}

/// Reads a voter's memory again in the background (see [`MemoryBook::on_news`]).
type Nudge = Arc<dyn Fn() + Send + Sync>;

/// What a voter's identity reads on every call without the book's lock (the book is shared
/// by every voter of a `Redlock`): kept by the book on every judgement.
#[derive(Debug)]
pub(crate) struct Flags {
    /// The voter's verdict is that its votes count (false: look in the book).
    counts: AtomicBool,
    /// Its roster lags behind a marker read elsewhere (see [`MemoryBook::has_news_for`]).
    news: AtomicBool,
}

impl Flags {
    /// Whether the voter's votes count for sure (otherwise, ask [`MemoryBook::standing`]).
    pub(crate) fn counts(&self) -> bool {
        self.counts.load(Ordering::Acquire)
    }

    /// Whether the voter's roster lags behind (see [`MemoryBook::has_news_for`]).
    pub(crate) fn news(&self) -> bool {
        self.news.load(Ordering::Acquire)
    }
}

struct Voter {
    name: String,
    reading: Option<Reading>,
    /// Its memory cannot be read (an ACL without the script's commands): never judged, and
    /// no peer waits for its roster.
    unreadable: bool,
    verdict: Verdict,
    /// A reading of its memory is under way.
    pending: bool,
    /// A roster read says its marker replaced another: while it is still quarantined for it,
    /// the rosters that do not say so yet are told (see [`MemoryBook::peers_of`]).
    replaced: bool,
    nudge: Option<Nudge>,
    /// A nudged reading is under way.
    nudged: bool,
    flags: Arc<Flags>,
}

impl MemoryBook {
    /// An empty book, quarantining for `period`.
    pub(crate) fn new(period: Duration) -> Self {
        MemoryBook {
            period,
            voters: Mutex::default(),
        }
    }

    fn voters(&self) -> MutexGuard<'_, Vec<Voter>> {
        self.voters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a voter named `name` (its address as clients name it); its slot, and the flags
    /// its identity reads without the book's lock.
    pub(crate) fn register(&self, name: &str) -> (usize, Arc<Flags>) {
        let flags = Arc::new(Flags {
            counts: AtomicBool::new(true),
            news: AtomicBool::new(false),
        });
        let mut voters = self.voters();
        voters.push(Voter {
            name: name.to_owned(),
            reading: None,
            unreadable: false,
            verdict: Verdict::Counts,
            pending: false,
            replaced: false,
            nudge: None,
            nudged: false,
            flags: Arc::clone(&flags),
        });
        (voters.len() - 1, flags)
    }

    /// How voter `slot`'s memory is read again in the background when its roster lags behind
    /// a marker read elsewhere; [`Self::nudged`] is to be called once that reading is over.
    pub(crate) fn on_news(&self, slot: usize, nudge: impl Fn() + Send + Sync + 'static) {
        if let Some(voter) = self.voters().get_mut(slot) {
            voter.nudge = Some(std::sync::Arc::new(nudge));
        }
    }

    /// A nudged reading of voter `slot` is over (read or failed).
    pub(crate) fn nudged(&self, slot: usize) {
        if let Some(voter) = self.voters().get_mut(slot) {
            voter.nudged = false;
        }
    }

    /// A reading of voter `slot`'s memory is under way (`true`) or over, read or not
    /// (`false`): while it is, the young voters it could settle are [`Standing::Pending`].
    pub(crate) fn reading(&self, slot: usize, under_way: bool) {
        let mut voters = self.voters();
        if let Some(voter) = voters.get_mut(slot) {
            voter.pending = under_way;
        }
        self.judge_all(&mut voters);
    }

    /// Notes a reading of voter `slot`'s memory, judges every voter again and nudges those
    /// whose roster lags behind.
    pub(crate) fn record(&self, slot: usize, reading: Reading) {
        let nudges = {
            let mut voters = self.voters();
            if let Some(voter) = voters.get_mut(slot) {
                voter.reading = Some(reading);
                voter.nudged = false;
                voter.pending = false;
            }
            self.judge_all(&mut voters);
            let lagging: Vec<usize> = (0..voters.len())
                .filter(|&lagging| {
                    !voters[lagging].nudged && news_for(&voters, lagging, clock::now(), self.period)
                })
                .collect();
            lagging
                .into_iter()
                .filter_map(|lagging| {
                    let voter = &mut voters[lagging];
                    voter.nudged = voter.nudge.is_some();
                    voter.nudge.clone()
                })
                .collect::<Vec<_>>()
        };
        for nudge in nudges {
            nudge();
        }
    }

    /// Voter `slot`'s memory cannot be read: it is judged no more, and waited for by none.
    pub(crate) fn unreadable(&self, slot: usize) {
        let mut voters = self.voters();
        if let Some(voter) = voters.get_mut(slot) {
            voter.unreadable = true;
        }
        self.judge_all(&mut voters);
    }

    fn judge_all(&self, voters: &mut [Voter]) {
        let now = clock::now();
        let verdicts: Vec<(Verdict, bool)> = voters
            .iter()
            .enumerate()
            .map(|(slot, voter)| match &voter.reading {
                Some(me) if !voter.unreadable => {
                    let peers: Vec<Peer<'_>> = voters
                        .iter()
                        .enumerate()
                        .filter(|&(other, peer)| other != slot && !peer.unreadable)
                        .map(|(_, peer)| match &peer.reading {
                            Some(reading) => Peer::Read(reading),
                            None => Peer::Unread {
                                pending: peer.pending,
                            },
                        })
                        .collect();
                    judge(&voter.name, me, &peers, self.period)
                }
                _ => (Verdict::Counts, false),
            })
            .collect();
        for (voter, (verdict, replaced)) in voters.iter_mut().zip(verdicts) {
            voter.verdict = verdict;
            voter.replaced = replaced;
            let counts = verdict == Verdict::Counts;
            voter.flags.counts.store(counts, Ordering::Release);
        }
        for slot in 0..voters.len() {
            let news = news_for(voters, slot, now, self.period);
            voters[slot].flags.news.store(news, Ordering::Release);
        }
    }

    /// Voter `slot`'s standing now (a verdict whose time has passed counts again: its flag
    /// says so from then on).
    pub(crate) fn standing(&self, slot: usize) -> Standing {
        let voters = self.voters();
        let Some(voter) = voters.get(slot) else {
            return Standing::Counts;
        };
        let standing = voter.verdict.at(clock::now());
        if standing == Standing::Counts {
            voter.flags.counts.store(true, Ordering::Release);
        }
        standing
    }

    /// The id of voter `slot`'s marker, as last read.
    #[cfg(test)]
    pub(crate) fn marker(&self, slot: usize) -> Option<String> {
        let voters = self.voters();
        Some(voters.get(slot)?.reading.as_ref()?.marker.id.clone())
    }

    /// What voter `slot`'s memory script is sent with: the other voters' roster names, each
    /// with the marker id last read there ("" when none); `!AGE|id` when a roster read says
    /// that marker replaced another and the voter is still quarantined for it, AGE the loss's
    /// age in ms as judged (the period less what is left). The script then records the
    /// replacement, that old, where the entry says "first seen": a roster that was itself new
    /// (its server lost its memory too) must not be the only one left when the servers that
    /// remembered the loss lose theirs in turn (a rolling restart).
    pub(crate) fn peers_of(&self, slot: usize) -> Vec<(String, String)> {
        let now = clock::now();
        self.voters()
            .iter()
            .enumerate()
            .filter(|&(other, _)| other != slot)
            .map(|(_, peer)| {
                let seen = match (&peer.reading, peer.loss_age(now, self.period)) {
                    (Some(reading), Some(age)) => {
                        format!("!{}|{}", age.as_millis(), reading.marker.id)
                    }
                    (Some(reading), None) => reading.marker.id.clone(),
                    (None, _) => String::new(),
                };
                (peer.name.clone(), seen)
            })
            .collect()
    }

    /// Whether voter `slot`'s roster, as last read, lags behind a marker read elsewhere since:
    /// its memory is then worth reading beside the next call, to spread the news.
    #[cfg(test)]
    pub(crate) fn has_news_for(&self, slot: usize) -> bool {
        self.voters()
            .get(slot)
            .is_some_and(|voter| voter.flags.news.load(Ordering::Acquire))
    }
}

impl Voter {
    /// How old its loss is, by the verdict, while a roster says its marker replaced another
    /// and it is still quarantined for it; `None` otherwise.
    fn loss_age(&self, now: Instant, period: Duration) -> Option<Duration> {
        match self.verdict {
            Verdict::Until(until) if self.replaced && until > now => {
                Some(period.saturating_sub(until - now))
            }
            _ => None,
        }
    }
}

/// Whether the roster of `voters[slot]`, as last read, lags behind a marker read on another,
/// or does not say yet that it replaced another (see [`MemoryBook::peers_of`]), at `now`.
fn news_for(voters: &[Voter], slot: usize, now: Instant, period: Duration) -> bool {
    let Some(Some(mine)) = voters.get(slot).map(|v| v.reading.as_ref()) else {
        return false;
    };
    voters.iter().enumerate().any(|(other, peer)| {
        other != slot
            && peer.reading.as_ref().is_some_and(|theirs| {
                mine.entry_for(&peer.name).is_none_or(|entry| {
                    entry.id != theirs.marker.id
                        || (!entry.replaced && peer.loss_age(now, period).is_some())
                })
            })
    })
}

#[cfg(test)]
mod tests;
