//! One drop guard for every "clean up unless finished" in the crate: a value with an action
//! that runs on it when the guard is dropped while still armed.

use std::ops::{Deref, DerefMut};

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
