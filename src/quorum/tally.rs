//! Vote counting: the pure Redlock arithmetic (majority, drift, validity) and the tally of
//! one round. No I/O and no clock: everything here is a function of its arguments.

use std::time::Duration;

use crate::Error;
use crate::error::{LossReason, NodeError, NodeFailure};
use crate::memory::Standing;
use crate::node::{Nodes, Op};

/// The size of a majority of `nodes`: `floor(nodes / 2) + 1`.
pub(crate) fn quorum(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// The clock-drift allowance for a TTL: `ttl * drift_factor + 2 ms`.
pub(crate) fn drift(ttl: Duration, drift_factor: f64) -> Duration {
    ttl.mul_f64(drift_factor) + Duration::from_millis(2)
}

/// What is left of a lock's TTL once the round's elapsed time and the drift allowance are
/// subtracted; `None` when nothing positive is left.
pub(crate) fn validity(ttl: Duration, elapsed: Duration, drift_factor: f64) -> Option<Duration> {
    ttl.checked_sub(elapsed)?
        .checked_sub(drift(ttl, drift_factor))
        .filter(|v| !v.is_zero())
}

/// When a round is decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Until {
    /// A majority granted (a positive reply), or a majority became impossible.
    Granted,
    /// A majority answered at all, or a majority of answers became impossible.
    Answered,
    /// Every node answered or timed out.
    All,
}

/// The votes of one round.
#[derive(Debug)]
pub(crate) struct Tally {
    pub(crate) nodes: usize,
    pub(crate) granted: usize,
    pub(crate) denied: usize,
    pub(crate) errors: Vec<NodeError>,
    /// The nodes that refused (answered 0): an acquire wrote nothing there.
    pub(crate) refused_by: Vec<usize>,
    /// Grants whose node's standing is not settled yet (see [`Standing::Unsettled`]): by
    /// index, with how long the node stays unsettled. Counted once settled, as quarantined
    /// when every node answered and they still are not.
    unsettled: Vec<(usize, Duration)>,
}

impl Tally {
    pub(super) fn new(nodes: usize) -> Self {
        Tally {
            nodes,
            granted: 0,
            denied: 0,
            errors: Vec::new(),
            refused_by: Vec::new(),
            unsettled: Vec::new(),
        }
    }

    pub(crate) fn quorum(&self) -> usize {
        quorum(self.nodes)
    }

    /// Counts one node's outcome.
    pub(super) fn record(
        &mut self,
        nodes: &Nodes,
        op: Op,
        index: usize,
        result: Result<i64, NodeFailure>,
    ) {
        let node = &nodes[index];
        self.count(op, index, node.addr(), result, node.standing());
        self.settle(|index| (nodes[index].addr(), nodes[index].standing()));
    }

    /// Counts one node's outcome, `standing` saying whether the node's votes count, or it
    /// may have forgotten locks it granted (a restart, a flush: see `memory.rs`).
    ///
    /// A quarantined node's grant of an acquire or an extend is neither a vote nor a refusal:
    /// it is recorded as a [`NodeFailure::Quarantined`] error, so that the round cannot reach
    /// a majority with it, a failed acquire releases the key it wrote (as after any node
    /// failure), and the error says why. An unsettled node's grant waits (see
    /// [`Tally::settle`]). Refusals are refusals (another owner's key is there), and releases
    /// count as any other.
    pub(super) fn count(
        &mut self,
        op: Op,
        index: usize,
        addr: &str,
        result: Result<i64, NodeFailure>,
        standing: Standing,
    ) {
        let result = match result {
            Ok(reply) if reply > 0 && op != Op::Release && op != Op::Leave => match standing {
                Standing::Counts => Ok(reply),
                Standing::Quarantined(remaining) => Err(NodeFailure::Quarantined { remaining }),
                Standing::Unsettled(remaining) | Standing::Pending(remaining) => {
                    self.unsettled.push((index, remaining));
                    return;
                }
            },
            other => other,
        };
        match result {
            Ok(reply) if reply > 0 || op == Op::Release => self.granted += 1,
            Ok(_) => {
                self.denied += 1;
                self.refused_by.push(index);
            }
            Err(failure) => self.errors.push(NodeError {
                index,
                addr: addr.to_owned(),
                failure,
            }),
        }
    }

    /// Counts the unsettled grants whose node's `standing` (with its address, by index) is
    /// settled now: a vote once it counts (or once every node answered, still unsettled: no
    /// roster read by then remembers another marker for it, and the servers that did not
    /// answer cannot be waited for), a [`NodeFailure::Quarantined`] error once it is
    /// quarantined (or once every node answered, still pending: a reading that could show
    /// the loss is under way, and a later attempt will know).
    pub(super) fn settle<'a>(&mut self, standing: impl Fn(usize) -> (&'a str, Standing)) {
        if self.unsettled.is_empty() {
            return;
        }
        let all_in = self.answered() + self.errors.len() + self.unsettled.len() == self.nodes;
        let mut waiting = std::mem::take(&mut self.unsettled);
        waiting.retain(|&(index, _)| {
            let (addr, now) = standing(index);
            let failure = match now {
                Standing::Unsettled(_) | Standing::Pending(_) if !all_in => return true,
                Standing::Counts | Standing::Unsettled(_) => {
                    self.granted += 1;
                    return false;
                }
                Standing::Quarantined(remaining) | Standing::Pending(remaining) => {
                    NodeFailure::Quarantined { remaining }
                }
            };
            self.errors.push(NodeError {
                index,
                addr: addr.to_owned(),
                failure,
            });
            false
        });
        self.unsettled = waiting;
    }

    /// Records the votes so far in the current span.
    pub(crate) fn trace(&self) {
        crate::trace::votes(self.granted, self.denied, self.errors.len());
    }

    /// A majority granted.
    pub(crate) fn reached(&self) -> bool {
        self.granted >= self.quorum()
    }

    /// How many nodes answered, whatever the answer.
    pub(crate) fn answered(&self) -> usize {
        self.granted + self.denied
    }

    pub(super) fn decided(&self, until: Until) -> bool {
        let q = self.quorum();
        let slack = self.nodes - q;
        match until {
            Until::Granted => self.granted >= q || self.denied + self.errors.len() > slack,
            Until::Answered => self.answered() >= q || self.errors.len() > slack,
            Until::All => self.answered() + self.errors.len() == self.nodes,
        }
    }

    /// Refusals alone rule out a majority: other owners hold it.
    fn refused_by_majority(&self) -> bool {
        self.nodes - self.denied < self.quorum()
    }

    /// Why an acquire round failed: contention when refusals alone rule out a majority,
    /// unreachable nodes otherwise.
    pub(crate) fn acquire_failure(self) -> Failed {
        if self.refused_by_majority() {
            Failed::Contended {
                denied: self.denied,
                nodes: self.nodes,
            }
        } else {
            Failed::Other(self.unreachable())
        }
    }

    /// The error for a failed extension round: the lock is lost when a majority says the keys
    /// are no longer ours; otherwise the nodes could not confirm it.
    pub(crate) fn extend_error(self, resources: &[String]) -> Error {
        if self.refused_by_majority() {
            Error::LockLost {
                resources: resources.to_vec(),
                reason: LossReason::NotHeld {
                    confirmed: self.granted,
                    quorum: self.quorum(),
                },
            }
        } else {
            self.unreachable()
        }
    }

    /// `QuorumUnreachable` with every node's error; `Overloaded` instead when this client's
    /// own full queues are what kept the majority out of reach (the nodes are fine).
    pub(crate) fn unreachable(self) -> Error {
        let overloaded = self
            .errors
            .iter()
            .filter(|e| matches!(e.failure, NodeFailure::Overloaded { .. }))
            .count();
        if overloaded > 0 && self.granted + overloaded >= self.quorum() {
            return Error::Overloaded {
                overloaded,
                nodes: self.nodes,
            };
        }
        Error::QuorumUnreachable {
            granted: self.granted,
            denied: self.denied,
            quorum: self.quorum(),
            nodes: self.nodes,
            errors: self.errors,
        }
    }
}

/// Why one acquire attempt failed, before anyone knows how many attempts were made: the
/// caller turns it into an [`Error`] once, with the final count.
#[derive(Debug)]
pub(crate) enum Failed {
    /// Refusals alone ruled out a majority: other owners hold the resources.
    Contended {
        /// How many nodes refused.
        denied: usize,
        /// How many nodes there are.
        nodes: usize,
    },
    /// Any other failure, already a complete error.
    Other(Error),
}

impl Failed {
    /// Whether another attempt could succeed.
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            Failed::Contended { .. } => true,
            Failed::Other(error) => error.is_retryable(),
        }
    }

    /// The error for the caller, after `attempts` attempts in all.
    pub(crate) fn into_error(self, resources: &[String], attempts: u32) -> Error {
        match self {
            Failed::Contended { denied, nodes } => Error::Contended {
                resources: resources.to_vec(),
                denied,
                nodes,
                attempts,
            },
            Failed::Other(error) => error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn quorum_sizes() {
        assert_eq!(
            (1..=7).map(quorum).collect::<Vec<_>>(),
            vec![1, 2, 2, 3, 3, 4, 4]
        );
    }

    #[test]
    fn validity_subtracts_elapsed_and_drift() {
        let ttl = Duration::from_secs(10);
        // drift = 10 s * 0.01 + 2 ms = 102 ms
        assert_eq!(drift(ttl, 0.01), 102 * MS);
        assert_eq!(validity(ttl, 100 * MS, 0.01), Some(ttl - 202 * MS));
        assert_eq!(validity(ttl, ttl - 102 * MS, 0.01), None);
        assert_eq!(validity(ttl, ttl, 0.01), None);
        assert_eq!(validity(ttl, ttl * 2, 0.01), None);
        assert_eq!(validity(3 * MS, Duration::ZERO, 0.0), Some(MS));
    }

    /// Five nodes: `grants` of them grant (the quarantined ones among them, by index), the
    /// rest refuse.
    fn round(op: Op, grants: &[usize], quarantined: &[usize]) -> Tally {
        let mut tally = Tally::new(5);
        for index in 0..5 {
            let reply = if grants.contains(&index) { 1 } else { 0 };
            let standing = if quarantined.contains(&index) {
                Standing::Quarantined(Duration::from_secs(7))
            } else {
                Standing::Counts
            };
            tally.count(op, index, "node", Ok(reply), standing);
        }
        tally
    }

    #[test]
    fn a_quarantined_grant_is_no_vote_and_is_reported() {
        // Three grants, one of them from a restarted node: two votes, no majority.
        let tally = round(Op::Acquire, &[2, 3, 4], &[2]);
        assert_eq!((tally.granted, tally.denied), (2, 2));
        assert!(!tally.reached());
        assert!(tally.refused_by.iter().all(|&i| i != 2));
        assert!(matches!(
            tally.errors.as_slice(),
            [NodeError { index: 2, failure: NodeFailure::Quarantined { remaining }, .. }]
                if *remaining == Duration::from_secs(7)
        ));
        // Not contention (refusals alone leave room for a majority): the error lists why.
        match tally.acquire_failure() {
            Failed::Other(Error::QuorumUnreachable {
                errors, granted, ..
            }) => {
                assert_eq!(granted, 2);
                assert!(matches!(errors[0].failure, NodeFailure::Quarantined { .. }));
            }
            other => panic!("expected QuorumUnreachable, got {other:?}"),
        }
        // The same grants without quarantine reach the majority.
        assert!(round(Op::Acquire, &[2, 3, 4], &[]).reached());
    }

    #[test]
    fn a_quarantined_confirmation_of_an_extension_does_not_count() {
        let tally = round(Op::Extend, &[0, 1, 2], &[1]);
        assert_eq!(tally.granted, 2);
        assert!(!tally.reached());
        // A quarantined node's refusal is a refusal, and releases always count.
        let tally = round(Op::Extend, &[0, 1], &[2]);
        assert_eq!(tally.denied, 3);
        let tally = round(Op::Release, &[0, 1, 2], &[0, 1, 2]);
        assert_eq!(tally.granted, 5);
        // Four quarantined grants of five: no majority, and no contention either.
        let tally = round(Op::Acquire, &[0, 1, 2, 3, 4], &[0, 1, 2, 3]);
        assert_eq!((tally.granted, tally.errors.len()), (1, 4));
        assert!(matches!(tally.acquire_failure(), Failed::Other(_)));
    }

    #[test]
    fn an_unsettled_grant_waits_for_the_other_nodes() {
        const WAIT: Duration = Duration::from_secs(9);
        /// A node's answer that did not come in time.
        fn timed_out() -> Result<i64, NodeFailure> {
            Err(NodeFailure::Timeout(WAIT))
        }
        // Three nodes; node 0's grant is unsettled (its marker is young, the others' rosters
        // unread). The others' answers settle it: once they are read it counts.
        let mut tally = Tally::new(3);
        tally.count(Op::Acquire, 0, "a", Ok(1), Standing::Unsettled(WAIT));
        tally.settle(|_| ("a", Standing::Unsettled(WAIT)));
        assert_eq!((tally.granted, tally.errors.len()), (0, 0));
        assert!(!tally.decided(Until::Granted));
        tally.count(Op::Acquire, 1, "b", Ok(1), Standing::Counts);
        tally.settle(|_| ("a", Standing::Counts));
        assert_eq!(tally.granted, 2);
        assert!(tally.reached());
        // Still unsettled when every node answered (node 2, which could remember another
        // marker, is down): no roster read says it lost memory, so it counts.
        let mut tally = Tally::new(3);
        tally.count(Op::Acquire, 0, "a", Ok(1), Standing::Unsettled(WAIT));
        tally.count(Op::Acquire, 1, "b", Ok(1), Standing::Counts);
        tally.settle(|_| ("a", Standing::Unsettled(WAIT)));
        assert_eq!(tally.granted, 1);
        assert!(!tally.decided(Until::Granted));
        tally.count(Op::Acquire, 2, "c", timed_out(), Standing::Counts);
        tally.settle(|_| ("a", Standing::Unsettled(WAIT)));
        assert_eq!((tally.granted, tally.errors.len()), (2, 1));
        assert!(tally.reached());
        // Still pending when every node answered (a reading that could show the loss is under
        // way): quarantined, a later attempt will know.
        let mut tally = Tally::new(3);
        tally.count(Op::Acquire, 0, "a", Ok(1), Standing::Pending(WAIT));
        tally.count(Op::Acquire, 1, "b", Ok(1), Standing::Counts);
        tally.count(Op::Acquire, 2, "c", timed_out(), Standing::Counts);
        tally.settle(|_| ("a", Standing::Pending(WAIT)));
        assert_eq!((tally.granted, tally.errors.len()), (1, 2));
        assert!(!tally.reached());
        // Settled as quarantined by a roster read meanwhile.
        let mut tally = Tally::new(3);
        tally.count(Op::Acquire, 0, "a", Ok(1), Standing::Unsettled(WAIT));
        tally.settle(|_| ("a", Standing::Quarantined(WAIT)));
        assert_eq!((tally.granted, tally.errors.len()), (0, 1));
    }
}
