//! [`View`]: what a holder's handle sees of its kept lease, the one reading of a
//! [`LeaseState`] behind `using()`'s [`Signal`](crate::Signal) and election's
//! [`Leadership`](crate::Leadership) (each adds its own names and docs).

use std::ops::Deref;
use std::sync::Arc;

use super::state::{LeaseState, Subject};
use crate::error::Error;

/// A view of a kept lease: whether it is lost, why, and a wait for the loss. Cheap to clone
/// (an `Arc` inside); reads the state through [`Deref`] for the rest.
pub(crate) struct View<T>(Arc<LeaseState<T>>);

impl<T> Clone for View<T> {
    fn clone(&self) -> Self {
        View(Arc::clone(&self.0))
    }
}

impl<T> From<Arc<LeaseState<T>>> for View<T> {
    fn from(state: Arc<LeaseState<T>>) -> Self {
        View(state)
    }
}

impl<T> Deref for View<T> {
    type Target = LeaseState<T>;
    fn deref(&self) -> &LeaseState<T> {
        &self.0
    }
}

impl<T: Subject> View<T> {
    /// Whether the lease is lost (or can no longer be guaranteed). Never goes back.
    pub(crate) fn is_lost(&self) -> bool {
        self.0.error().is_some()
    }

    /// Resolves once the lease is lost, at once if it already is, with the reason.
    /// Cancel-safe.
    pub(crate) async fn lost(&self) -> Error {
        self.0.lost().await
    }

    /// `Ok(())` while the lease holds, the reason once it is lost.
    pub(crate) fn check(&self) -> Result<(), Error> {
        match self.0.error() {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }

    /// Why the lease is lost; `None` while it holds.
    pub(crate) fn cloned_error(&self) -> Option<Error> {
        self.0.error().cloned()
    }
}
