//! Why no fencing token could be issued, and the error a counter returns.

use std::sync::Arc;
use std::time::Duration;

/// The boxed error a [`FencingCounter`](crate::FencingCounter) returns.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why no fencing token could be issued.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum FencingError {
    /// The counter returned an error (its own error is the `source()`).
    #[error("the fencing counter failed")]
    Counter(#[source] Arc<dyn std::error::Error + Send + Sync + 'static>),
    /// The counter did not answer in time.
    #[error("the fencing counter did not answer within {0:?}")]
    Timeout(Duration),
    /// The counter answered after the lock's validity had run out.
    #[error("the fencing counter answered after the lock's validity ran out")]
    LockExpired,
}

impl FencingError {
    /// Wraps a counter's own error.
    pub fn counter(err: impl Into<BoxError>) -> Self {
        FencingError::Counter(Arc::from(err.into()))
    }
}
