//! One drop guard for every "clean up unless finished" in the crate: a value with an action
//! that runs on it when the guard is dropped while still armed; and [`Finishing`], a task that
//! cleans up whose end `Redlock::close` waits for, even when its owner is dropped first.

use std::future::Future;
use std::ops::{Deref, DerefMut};

use tokio::task::{JoinError, JoinHandle};
use tokio_util::task::TaskTracker;

/// Runs `on_drop` on its value when dropped, unless [`disarm`](DropGuard::disarm)ed first.
/// Used where a future can be dropped half-way (a cancelled acquire, a `Lock` never released,
/// a `using()` scope that ends abnormally) and must still clean up.
pub(crate) struct DropGuard<T> {
    value: T,
    on_drop: Option<fn(&mut T)>,
}

impl<T> DropGuard<T> {
    /// An armed guard around `value`.
    pub(crate) fn new(value: T, on_drop: fn(&mut T)) -> Self {
        DropGuard {
            value,
            on_drop: Some(on_drop),
        }
    }

    /// The work is done: dropping the guard no longer runs the action.
    pub(crate) fn disarm(&mut self) {
        self.on_drop = None;
    }
}

impl<T> Deref for DropGuard<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> DerefMut for DropGuard<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl<T> Drop for DropGuard<T> {
    fn drop(&mut self) {
        if let Some(on_drop) = self.on_drop.take() {
            on_drop(&mut self.value);
        }
    }
}

/// A spawned task that ends by cleaning up (a lease keeper, of a `using()` scope or a
/// leader's term, which releases its lock when told to stop), owned by a future that
/// awaits it. If that future is dropped first (a `select!` on Ctrl-C), a tracked task awaits
/// it instead, so that `Redlock::close` still waits for its release: otherwise `main` could
/// return before the task ran at all, and the lock would wait out its TTL.
pub(crate) struct Finishing {
    handle: Option<JoinHandle<()>>,
    tasks: TaskTracker,
}

impl Finishing {
    /// Spawns `task`; `tasks` is the `Redlock`'s tracker.
    pub(crate) fn spawn(
        tasks: &TaskTracker,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        Finishing {
            handle: Some(tokio::spawn(task)),
            tasks: tasks.clone(),
        }
    }

    /// Waits for the task to end (an error only if it panicked or its runtime went away).
    pub(crate) async fn join(mut self) -> Result<(), JoinError> {
        match self.handle.take() {
            Some(handle) => handle.await,
            None => Ok(()),
        }
    }
}

impl Drop for Finishing {
    fn drop(&mut self) {
        let Some(handle) = self.handle.take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            self.tasks.spawn(async move {
                let _ = handle.await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_once_when_armed_and_never_when_disarmed() {
        let mut log = Vec::new();
        {
            let _armed = DropGuard::new(&mut log, |l| l.push("dropped"));
        }
        assert_eq!(log, ["dropped"]);
        {
            let mut guard = DropGuard::new(&mut log, |l| l.push("dropped again"));
            guard.push("used");
            guard.disarm();
        }
        assert_eq!(log, ["dropped", "used"]);
    }
}
