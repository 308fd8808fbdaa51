//! What a waiter leaves on the nodes while it waits, taken away once it is done waiting: one
//! guard, [`Leave`], for a fair waiter's [`Place`] in its keys' queues and a read-write
//! lock's waiting mark or place in line.

use std::sync::Arc;
use std::time::Duration;

use super::Acquired;
use crate::error::Error;
use crate::inner::{Shared, Target};
use crate::node::{Op, QueueTicket, Request};
use crate::random::new_token;

/// A sign a waiter may have left on the nodes (a place in a queue, a waiting mark): taken
/// away on every node when dropped while [`armed`](Leave::armed) (the acquisition failed, was
/// cancelled, or no longer needs it), with `leave`, queued behind the acquisition's own
/// calls; the node bounds it, and a leave that never lands ends with the sign's expiry.
pub(crate) struct Leave {
    shared: Arc<Shared>,
    leave: Request,
    /// Whether the sign may be on the nodes and nothing else takes it away.
    pub(crate) armed: bool,
}

impl Leave {
    /// A guard that sends `leave` (an [`Op::Leave`]) to every node of `shared` when dropped
    /// while `armed`.
    pub(crate) fn new(shared: &Arc<Shared>, leave: Request, armed: bool) -> Self {
        Leave {
            shared: Arc::clone(shared),
            leave,
            armed,
        }
    }
}

impl Drop for Leave {
    fn drop(&mut self) {
        if !self.armed
            || self.leave.keys.is_empty()
            || tokio::runtime::Handle::try_current().is_err()
        {
            return;
        }
        for node in &self.shared.nodes {
            // Queued now, after this acquisition's last call.
            let call = node.call(&self.leave);
            self.shared.tasks.spawn(async move {
                let _ = call.await;
            });
        }
    }
}

/// The longest a node keeps a fair waiter in line without hearing from it, however long
/// the retry delays and the node timeout are.
const LONGEST_LEASE: Duration = Duration::from_secs(24 * 60 * 60);

/// An acquisition's place in the fair queue of its keys on every node (fair mode): left on
/// every node when dropped (the acquisition failed or was cancelled), or handed to the lock
/// once granted, whose release leaves it.
pub(super) struct Place {
    ticket: Option<Arc<QueueTicket>>,
    leave: Option<Leave>,
}

impl Place {
    /// The place of an acquisition of `target` (none outside fair mode).
    ///
    /// # Errors
    ///
    /// [`Error::Entropy`] when no waiter id can be made.
    pub(super) fn take(shared: &Arc<Shared>, target: &Target) -> Result<Place, Error> {
        if !target.fair {
            return Ok(Place {
                ticket: None,
                leave: None,
            });
        }
        let config = &shared.config;
        let waiter = new_token()?;
        let lease = config
            .backoff
            .longest_delay()
            .saturating_mul(3)
            .saturating_add(config.node_timeout)
            .max(Duration::from_secs(1))
            // Within what the nodes take as an integer (Lua numbers, PEXPIRE).
            .min(LONGEST_LEASE);
        let since_epoch = crate::clock::since_epoch();
        let ticket = Arc::new(QueueTicket {
            waiter: Arc::clone(&waiter),
            ticket: u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX),
            lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
        });
        let leave = Request {
            op: Op::Leave,
            keys: Arc::clone(&target.keys),
            token: waiter,
            ttl_ms: 0,
            queue: Some(Arc::clone(&ticket)),
            rw: None,
        };
        Ok(Place {
            ticket: Some(ticket),
            leave: Some(Leave::new(shared, leave, true)),
        })
    }

    pub(super) fn ticket(&self) -> Option<&Arc<QueueTicket>> {
        self.ticket.as_ref()
    }

    /// The lock now holds the place (its release leaves the queues).
    pub(super) fn granted(mut self, acquired: Acquired) -> Acquired {
        if let Some(leave) = &mut self.leave {
            leave.armed = false;
        }
        acquired
    }

    pub(super) fn waiter(&self) -> Option<Arc<str>> {
        self.ticket.as_ref().map(|t| Arc::clone(&t.waiter))
    }
}
