//! Every random choice the client makes, from one place: lock tokens, retry jitter, a
//! semaphore's first slot, election and memory-marker identities. They come from the operating
//! system's generator (tokens) and the thread's generator (the rest), except on a thread that a
//! deterministic simulation seeded (`testing::seed_thread`): there every choice comes from that
//! seed, so that a run is replayed exactly.

use rand::rand_core::OsError;
use rand::{RngCore, TryRngCore};

#[cfg(any(test, feature = "testing"))]
thread_local! {
    /// The generator of a seeded thread (a simulation's), if this thread is one.
    static SEEDED: std::cell::RefCell<Option<rand::rngs::StdRng>> =
        const { std::cell::RefCell::new(None) };
}

/// From now on, every random choice made on this thread comes from `seed` (`None`: from the
/// system again).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn seed_thread(seed: Option<u64>) {
    use rand::SeedableRng;
    SEEDED.set(seed.map(rand::rngs::StdRng::seed_from_u64));
}

/// Runs `choose` with this thread's generator: the seeded one on a seeded thread.
pub(crate) fn with<R>(choose: impl FnOnce(&mut dyn RngCore) -> R) -> R {
    #[cfg(any(test, feature = "testing"))]
    let choose = match SEEDED.with_borrow_mut(|seeded| match seeded {
        Some(rng) => Ok(choose(rng)),
        None => Err(choose),
    }) {
        Ok(chosen) => return chosen,
        Err(choose) => choose,
    };
    choose(&mut rand::rng())
}

/// Fills `bytes` from the operating system's generator (from the seed on a seeded thread):
/// for values no other process may guess or repeat, such as lock tokens.
pub(crate) fn fill_secret(bytes: &mut [u8]) -> Result<(), OsError> {
    #[cfg(any(test, feature = "testing"))]
    if SEEDED
        .with_borrow_mut(|seeded| seeded.as_mut().map(|rng| rng.fill_bytes(bytes)))
        .is_some()
    {
        return Ok(());
    }
    rand::rngs::OsRng.try_fill_bytes(bytes)
}

/// A random (version 4) UUID.
pub(crate) fn uuid() -> uuid::Uuid {
    let mut bytes = [0u8; 16];
    with(|rng| rng.fill_bytes(&mut bytes));
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draws() -> (Vec<u8>, u64) {
        let mut secret = [0u8; 16];
        fill_secret(&mut secret).expect("a seeded generator never fails");
        let n = with(|rng| rng.next_u64());
        (secret.to_vec(), n)
    }

    #[test]
    fn a_seeded_thread_repeats_its_choices_and_an_unseeded_one_does_not() {
        seed_thread(Some(7));
        let first = draws();
        seed_thread(Some(7));
        assert_eq!(draws(), first);
        seed_thread(Some(8));
        assert_ne!(draws(), first);
        seed_thread(None);
        assert_ne!(draws(), draws());
    }
}
