//! `using()`: scoped locking with automatic extension and an abort signal.

/// Tells the routine run by `using()` whether it still owns its lock.
#[derive(Clone, Debug)]
pub struct Signal {}
