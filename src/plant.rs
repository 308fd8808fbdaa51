//! Historical bugs that the deterministic simulation can put back, to prove that its checkers
//! find them (feature `testing`; each is off unless a simulation turns it on for its thread,
//! and without the feature none can be).

/// A bug fixed once, that a simulation may put back on its thread (see
/// `testing::plant_thread`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
// Public through `testing` (feature `testing`); crate-private otherwise.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub enum Plant {
    /// A failed extension to a shorter TTL keeps the lock's old expiry, although the nodes
    /// that applied it expire the keys sooner: a second owner gets in while the first still
    /// counts on its lock.
    ShorteningExtend,
    /// A server voter whose calls went unanswered for the patience window makes a new
    /// connection to the same server: a release sent on it can run before its own acquire,
    /// still waiting on the old one, and the key is set again after its release.
    ReleaseOvertakesAcquire,
}

#[cfg(any(test, feature = "testing"))]
thread_local! {
    static PLANTED: std::cell::Cell<Option<Plant>> = const { std::cell::Cell::new(None) };
}

/// Puts `plant` back on this thread (`None`: none).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn plant_thread(plant: Option<Plant>) {
    PLANTED.set(plant);
}

/// Whether `plant` is back on this thread.
pub(crate) fn on(plant: Plant) -> bool {
    #[cfg(any(test, feature = "testing"))]
    {
        PLANTED.get() == Some(plant)
    }
    #[cfg(not(any(test, feature = "testing")))]
    {
        let _ = plant;
        false
    }
}
