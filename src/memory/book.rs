//! The memory book: every voter's last reading, judged again on every reading, the flags each
//! identity reads without its lock, and the nudges that spread news to lagging rosters.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::{Peer, Reading, Standing, Verdict, judge};
use crate::clock;

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

    /// Adds a voter named `name` (its address as clients name it); its index, and the flags
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

    /// How voter `index`'s memory is read again in the background when its roster lags behind
    /// a marker read elsewhere; [`Self::nudged`] is to be called once that reading is over.
    pub(crate) fn on_news(&self, index: usize, nudge: impl Fn() + Send + Sync + 'static) {
        if let Some(voter) = self.voters().get_mut(index) {
            voter.nudge = Some(std::sync::Arc::new(nudge));
        }
    }

    /// A nudged reading of voter `index` is over (read or failed).
    pub(crate) fn nudged(&self, index: usize) {
        if let Some(voter) = self.voters().get_mut(index) {
            voter.nudged = false;
        }
    }

    /// A reading of voter `index`'s memory is under way (`true`) or over, read or not
    /// (`false`): while it is, the young voters it could settle are [`Standing::Pending`].
    pub(crate) fn reading(&self, index: usize, under_way: bool) {
        let mut voters = self.voters();
        if let Some(voter) = voters.get_mut(index) {
            voter.pending = under_way;
        }
        self.judge_all(&mut voters);
    }

    /// Notes a reading of voter `index`'s memory, judges every voter again and nudges those
    /// whose roster lags behind.
    pub(crate) fn record(&self, index: usize, reading: Reading) {
        let nudges = {
            let mut voters = self.voters();
            if let Some(voter) = voters.get_mut(index) {
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

    /// Voter `index`'s memory cannot be read: it is judged no more, and waited for by none.
    pub(crate) fn unreadable(&self, index: usize) {
        let mut voters = self.voters();
        if let Some(voter) = voters.get_mut(index) {
            voter.unreadable = true;
        }
        self.judge_all(&mut voters);
    }

    fn judge_all(&self, voters: &mut [Voter]) {
        let now = clock::now();
        let verdicts: Vec<(Verdict, bool)> = voters
            .iter()
            .enumerate()
            .map(|(index, voter)| match &voter.reading {
                Some(me) if !voter.unreadable => {
                    let peers: Vec<Peer<'_>> = voters
                        .iter()
                        .enumerate()
                        .filter(|&(other, peer)| other != index && !peer.unreadable)
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
        for index in 0..voters.len() {
            let news = news_for(voters, index, now, self.period);
            voters[index].flags.news.store(news, Ordering::Release);
        }
    }

    /// Voter `index`'s standing now (a verdict whose time has passed counts again: its flag
    /// says so from then on).
    pub(crate) fn standing(&self, index: usize) -> Standing {
        let voters = self.voters();
        let Some(voter) = voters.get(index) else {
            return Standing::Counts;
        };
        let standing = voter.verdict.at(clock::now());
        if standing == Standing::Counts {
            voter.flags.counts.store(true, Ordering::Release);
        }
        standing
    }

    /// The id of voter `index`'s marker, as last read.
    #[cfg(test)]
    pub(crate) fn marker(&self, index: usize) -> Option<String> {
        let voters = self.voters();
        Some(voters.get(index)?.reading.as_ref()?.marker.id.clone())
    }

    /// What voter `index`'s memory script is sent with: the other voters' roster names, each
    /// with the marker id last read there ("" when none); `!AGE|id` when a roster read says
    /// that marker replaced another and the voter is still quarantined for it, AGE the loss's
    /// age in ms as judged (the period less what is left). The script then records the
    /// replacement, that old, where the entry says "first seen": a roster that was itself new
    /// (its server lost its memory too) must not be the only one left when the servers that
    /// remembered the loss lose theirs in turn (a rolling restart).
    pub(crate) fn peers_of(&self, index: usize) -> Vec<(String, String)> {
        let now = clock::now();
        self.voters()
            .iter()
            .enumerate()
            .filter(|&(other, _)| other != index)
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

    /// Whether voter `index`'s roster, as last read, lags behind a marker read elsewhere since:
    /// its memory is then worth reading beside the next call, to spread the news.
    #[cfg(test)]
    pub(crate) fn has_news_for(&self, index: usize) -> bool {
        self.voters()
            .get(index)
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

/// Whether the roster of `voters[index]`, as last read, lags behind a marker read on another,
/// or does not say yet that it replaced another (see [`MemoryBook::peers_of`]), at `now`.
fn news_for(voters: &[Voter], index: usize, now: Instant, period: Duration) -> bool {
    let Some(Some(mine)) = voters.get(index).map(|v| v.reading.as_ref()) else {
        return false;
    };
    voters.iter().enumerate().any(|(other, peer)| {
        other != index
            && peer.reading.as_ref().is_some_and(|theirs| {
                mine.entry_for(&peer.name).is_none_or(|entry| {
                    entry.id != theirs.marker.id
                        || (!entry.replaced && peer.loss_age(now, period).is_some())
                })
            })
    })
}
