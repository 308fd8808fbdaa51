//! A sorted set, as the simulated server keeps one: members by score, then by their bytes.

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};

/// A score, ordered as Redis compares doubles (never NaN here).
#[derive(Clone, Copy, Debug)]
struct Score(f64);

impl PartialEq for Score {
    fn eq(&self, other: &Score) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Score {}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Score) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Score {
    fn cmp(&self, other: &Score) -> Ordering {
        self.0.partial_cmp(&other.0).unwrap_or(Ordering::Equal)
    }
}

/// A sorted set: members by score, then by their bytes.
#[derive(Clone, Debug, Default)]
pub(super) struct ZSet {
    scores: HashMap<Vec<u8>, f64>,
    order: BTreeSet<(Score, Vec<u8>)>,
}

impl ZSet {
    /// The number of members.
    pub(super) fn len(&self) -> usize {
        self.scores.len()
    }

    /// `member`'s score, if a member.
    pub(super) fn score(&self, member: &[u8]) -> Option<f64> {
        self.scores.get(member).copied()
    }

    /// Sets `member`'s score.
    pub(super) fn insert(&mut self, member: &[u8], score: f64) {
        self.remove(member);
        self.scores.insert(member.to_vec(), score);
        self.order.insert((Score(score), member.to_vec()));
    }

    /// Removes `member`: whether it was one.
    pub(super) fn remove(&mut self, member: &[u8]) -> bool {
        match self.scores.remove(member) {
            Some(score) => self.order.remove(&(Score(score), member.to_vec())),
            None => false,
        }
    }

    /// The members in order (reversed when `rev`), with their scores.
    pub(super) fn iter(&self, rev: bool) -> Box<dyn Iterator<Item = (&[u8], f64)> + '_> {
        let all = self.order.iter().map(|(s, m)| (m.as_slice(), s.0));
        if rev {
            Box::new(all.rev())
        } else {
            Box::new(all)
        }
    }
}
