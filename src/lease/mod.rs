//! The lease keeper: one machine that keeps a held lock alive for `using()`, for a leader's
//! term, and for whatever primitive comes next (etcd's `Session` is the model).
//!
//! A kept lease is three things:
//!
//! - a [`Schedule`] ([`schedule`]): a pure function from the [`Lease`] and an instant to the
//!   next [`Step`] — renew at some instant with a deadline, or give up at some instant.
//!   `using()`'s `Policy` and election's `Timing` are the two schedules;
//! - a [`LeaseState`] ([`state`]): until when the lease is guaranteed and when it expires, the
//!   loss (set once, announced once, views woken), and whether the holder asked it to end.
//!   `using()`'s `Signal` and election's `Leadership` are views of it, through one [`View`]
//!   ([`view`]);
//! - the keeper task, [`keep`] ([`keeper`]): waits until the schedule says, renews through a
//!   [`Holding`] (how to extend, how to release), records the outcome, and releases when the
//!   holder stops — or at once on a loss, as the holder chose ([`OnLoss`]).
//!
//! Layering: this module knows nothing of `using()`, election or [`Lock`](crate::Lock); they
//! import it, never the other way round.

mod keeper;
mod schedule;
mod state;
mod view;

pub(crate) use keeper::{Holding, OnLoss, keep};
pub(crate) use schedule::{Cause, Lease, Schedule, Step};
pub(crate) use state::{Closing, LeaseState, StopOnDrop, Subject, Times};
pub(crate) use view::View;

#[cfg(test)]
pub(crate) mod tests;
