//! [`Signal`]: what the routine of `using()` sees of its lock — a view of the lease
//! keeper's [`LeaseState`] — and the [`Ticket`] that state carries for it.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock;
use crate::error::{Error, LossReason};
use crate::events::{Event, EventHook};
use crate::lease::{Closing, LeaseState, Subject, Times, View};

/// Tells the routine run by [`Redlock::using`](crate::Redlock::using) whether it still owns its lock.
///
/// Cheap to clone (an `Arc` inside), `Send + Sync`: hand clones to sub-tasks. Once aborted it
/// stays aborted, and [`error`](Signal::error) says why:
///
/// - [`Error::LockLost`] with [`LossReason::Unconfirmed`]: extensions kept failing (nodes
///   unreachable) and less than `automatic_extension_threshold` of validity is left;
/// - [`Error::LockLost`] with [`LossReason::NotHeld`]: a majority answered that the keys no
///   longer hold our token;
/// - [`Error::LockLost`] with [`LossReason::Expired`]: the validity ran out (e.g. the process
///   was starved), noticed by the signal itself even if the extension task could not run;
/// - [`Error::RenewalLimit`]: `max_extensions` or `max_hold` was reached;
/// - [`Error::LockLost`] with [`LossReason::Released`]: the `using` scope has ended (seen only
///   through a clone kept after it).
///
/// ```no_run
/// use std::time::Duration;
/// use redfence::{Error, Redlock};
///
/// # async fn step(_: u32, _: Option<u64>) -> Result<(), Error> { Ok(()) }
/// # async fn run(redlock: Redlock) -> Result<(), Error> {
/// redlock
///     .using(&["report"], Duration::from_secs(5), |signal| async move {
///         for part in 0..10 {
///             signal.check()?; // Err(LockLost or RenewalLimit) once ownership is gone
///             step(part, signal.fence()).await?;
///         }
///         println!("done with {:?} of validity to spare", signal.remaining());
///         Ok(())
///     })
///     .await
/// # }
/// # fn main() { let _ = run; }
/// ```
#[derive(Clone)]
pub struct Signal {
    pub(super) state: View<Ticket>,
}

impl Signal {
    /// Whether ownership is gone (or can no longer be guaranteed). Never goes back to `false`.
    pub fn is_aborted(&self) -> bool {
        self.state.is_lost()
    }

    /// Resolves once the signal is aborted, at once if it already is, with the reason (the
    /// same as [`error`](Signal::error)). For `tokio::select!`; cancel-safe.
    ///
    /// ```no_run
    /// # async fn run(signal: redfence::Signal) -> Result<(), redfence::Error> {
    /// # async fn long_computation() -> Result<(), redfence::Error> { Ok(()) }
    /// tokio::select! {
    ///     err = signal.aborted() => Err(err), // the computation is dropped
    ///     done = long_computation() => done,
    /// }
    /// # }
    /// # fn main() { let _ = run; }
    /// ```
    pub async fn aborted(&self) -> Error {
        self.state.lost().await
    }

    /// `Ok(())` while the lock is held, the reason (as [`error`](Signal::error)) once the
    /// signal is aborted. Call it before every step that must not run without the lock.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] or [`Error::RenewalLimit`], once the signal is aborted.
    pub fn check(&self) -> Result<(), Error> {
        self.state.check()
    }

    /// Why the signal aborted: [`Error::LockLost`] (with a [`LossReason`]) or
    /// [`Error::RenewalLimit`]; `None` while the lock is held.
    pub fn error(&self) -> Option<Error> {
        self.state.cloned_error()
    }

    /// How much validity the lock has left: zero once expired, and once the lock is gone for
    /// sure, whatever was left of it (a majority answered that the keys are no longer ours,
    /// the scope released it, the leader resigned). A signal aborted with validity still
    /// guaranteed (extensions kept failing, or the renewal limit) reports what is left: the
    /// time to stop cleanly. Grows back after every extension.
    pub fn remaining(&self) -> Duration {
        if let Some(Error::LockLost {
            reason: LossReason::NotHeld { .. } | LossReason::Released | LossReason::Resigned,
            ..
        }) = self.state.error()
        {
            return Duration::ZERO;
        }
        self.state
            .expires_at()
            .saturating_duration_since(clock::now())
    }

    /// The fencing token of this acquisition, if a counter is configured. Send it with every
    /// write; the storage must reject a fence that is smaller than the last it accepted.
    pub fn fence(&self) -> Option<u64> {
        self.state.subject().fence
    }

    /// The resources the lock holds, as given (without the key prefix).
    pub fn resources(&self) -> &[String] {
        self.state.resources()
    }

    /// The lock's owner token: the value stored at every key.
    pub fn token(&self) -> &str {
        &self.state.subject().token
    }
}

impl fmt::Debug for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signal")
            .field("resources", self.state.resources())
            .field("fence", &self.fence())
            .field("remaining", &self.remaining())
            .field("error", &self.state.recorded_error())
            .finish()
    }
}

/// What a [`Signal`] knows of its lock beside the lease: the owner token and the fence;
/// and where it announces a loss (the `Aborted` event).
pub(super) struct Ticket {
    pub(super) token: Arc<str>,
    pub(super) fence: Option<u64>,
    pub(super) events: EventHook,
}

impl Ticket {
    /// The lease state of a `using()` lock valid until `expires_at`: lost at its expiry at
    /// the latest, and ended by the scope as `Released`, without an event.
    pub(super) fn lease(self, resources: Arc<[String]>, expires_at: Instant) -> LeaseState<Ticket> {
        let closing = Closing {
            reason: LossReason::Released,
            announce: false,
        };
        let times = Times {
            deadline: expires_at,
            expires_at,
        };
        LeaseState::new(resources, self, closing, times)
    }
}

impl Subject for Ticket {
    fn announce(&self, resources: &[String], error: &Error) {
        self.events.emit(Event::Aborted {
            resources: resources.to_vec(),
            error: error.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::RenewalLimit;
    use std::sync::Mutex;

    fn state(valid_for: Duration, events: EventHook) -> Arc<LeaseState<Ticket>> {
        let ticket = Ticket {
            token: Arc::from("token"),
            fence: Some(7),
            events,
        };
        Arc::new(ticket.lease(Arc::from(vec!["r".to_string()]), clock::now() + valid_for))
    }

    /// The events a lease emitted.
    type Seen = Arc<Mutex<Vec<Event>>>;

    /// A lease valid for `valid_for`, a signal over it, and the events it emits.
    fn signal_for(valid_for: Duration) -> (Arc<LeaseState<Ticket>>, Signal, Seen) {
        let (hook, seen) = recorder();
        let s = state(valid_for, hook);
        let signal = Signal {
            state: Arc::clone(&s).into(),
        };
        (s, signal, seen)
    }

    fn recorder() -> (EventHook, Seen) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let hook = EventHook::new(move |e: &Event| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.clone());
            }
        });
        (hook, seen)
    }

    fn aborted_events(seen: &Mutex<Vec<Event>>) -> usize {
        seen.lock()
            .map(|v| {
                v.iter()
                    .filter(|e| matches!(e, Event::Aborted { .. }))
                    .count()
            })
            .unwrap_or(0)
    }

    #[tokio::test(start_paused = true)]
    async fn aborted_resolves_on_abort_once_and_for_all() {
        let (s, signal, seen) = signal_for(Duration::from_secs(60));
        assert!(!signal.is_aborted());
        assert!(signal.check().is_ok());
        assert_eq!(signal.fence(), Some(7));
        assert_eq!(signal.token(), "token");
        assert_eq!(signal.remaining(), Duration::from_secs(60));

        let waiter = tokio::spawn({
            let signal = signal.clone();
            async move { signal.aborted().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        let started = tokio::time::Instant::now();
        s.abort(Error::RenewalLimit {
            resources: vec!["r".into()],
            limit: RenewalLimit::Extensions(3),
        });
        let err = waiter.await.expect("waiter");
        assert_eq!(started.elapsed(), Duration::ZERO, "woken without waiting");
        assert!(matches!(err, Error::RenewalLimit { .. }), "{err:?}");
        // A second abort changes nothing and reports nothing.
        s.abort(s.loss(LossReason::Expired));
        assert!(matches!(signal.check(), Err(Error::RenewalLimit { .. })));
        assert!(matches!(signal.aborted().await, Error::RenewalLimit { .. }));
        assert_eq!(aborted_events(&seen), 1);
        // The end of the scope keeps the first reason.
        s.close();
        assert!(matches!(signal.error(), Some(Error::RenewalLimit { .. })));
    }

    #[tokio::test(start_paused = true)]
    async fn the_signal_aborts_at_expiry_on_its_own_and_follows_extensions() {
        let (s, signal, seen) = signal_for(Duration::from_secs(5));
        let start = tokio::time::Instant::now();
        let waiter = tokio::spawn({
            let signal = signal.clone();
            async move { signal.aborted().await }
        });
        // An extension at 2 s moves the expiry from 5 s to 12 s.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let until = clock::now() + Duration::from_secs(10);
        s.renewed(Times {
            deadline: until,
            expires_at: until,
        });
        assert_eq!(signal.remaining(), Duration::from_secs(10));
        let err = waiter.await.expect("waiter");
        assert_eq!(start.elapsed(), Duration::from_secs(12));
        assert!(
            matches!(
                err,
                Error::LockLost {
                    reason: LossReason::Expired,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(signal.is_aborted());
        assert_eq!(signal.remaining(), Duration::ZERO);
        assert_eq!(aborted_events(&seen), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_kept_after_its_scope_reports_the_release_without_an_event() {
        let (s, signal, seen) = signal_for(Duration::from_secs(5));
        s.close();
        assert!(matches!(
            signal.aborted().await,
            Error::LockLost {
                reason: LossReason::Released,
                ..
            }
        ));
        assert_eq!(aborted_events(&seen), 0);
    }

    #[test]
    fn signals_are_send_sync_and_static() {
        fn check<T: Send + Sync + Clone + 'static>() {}
        check::<Signal>();
    }
}
