//! Every random choice the client makes, from one place: lock tokens, retry jitter, a
//! semaphore's first slot, election and memory-marker identities. They come from the operating
//! system's generator (tokens) and the thread's generator (the rest), except on a thread that a
//! deterministic simulation seeded (`testing::seed_thread`): there every choice comes from that
//! seed, so that a run is replayed exactly.

use std::sync::Arc;

use rand::rand_core::OsError;
use rand::{RngCore, TryRngCore};

use crate::error::Error;

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

/// A fresh owner token (and a fair or writing waiter's): 128 bits straight from the operating
/// system's generator (rand's `OsRng`: `getrandom(2)` on Linux), as 32 hex digits. Not from a
/// generator in this process: rand's thread generator is not reseeded on `fork`, so a forked
/// child, or a VM restored twice from one snapshot, could mint its twin's tokens and release
/// or extend its locks. One system call per token.
///
/// # Errors
///
/// [`Error::Entropy`] when the operating system's generator fails, which it does not on a
/// working system (Linux's `getrandom(2)` blocks until it is seeded and is retried on
/// `EINTR`; without it, `/dev/urandom` is read): only a sandbox that denies both can make it
/// fail, and no lock could be told apart from another's then.
pub(crate) fn new_token() -> Result<Arc<str>, Error> {
    os_token().map_err(|err| Error::Entropy(Arc::new(std::io::Error::other(err))))
}

/// [`new_token`], or why the operating system's generator could not give one.
fn os_token() -> Result<Arc<str>, OsError> {
    let mut bytes = [0u8; 16];
    fill_secret(&mut bytes)?;
    let bits = u128::from_be_bytes(bytes);
    Ok(Arc::from(format!("{bits:032x}")))
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

    #[test]
    fn tokens_are_fresh_128_bit_hex() {
        let a = new_token().expect("a token");
        let b = new_token().expect("a token");
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    /// The tokens come from the operating system's generator, which answers here; a thousand
    /// of them are distinct and use every hex digit in every place (not a counter, not a
    /// constant part).
    #[test]
    fn tokens_come_from_the_operating_systems_generator() {
        let tokens: Vec<Arc<str>> = (0..1_000)
            .map(|_| os_token().expect("the OS generator answers"))
            .collect();
        let distinct: std::collections::HashSet<&str> = tokens.iter().map(|t| &**t).collect();
        assert_eq!(distinct.len(), tokens.len());
        for place in 0..32 {
            let digits: std::collections::HashSet<u8> =
                tokens.iter().map(|t| t.as_bytes()[place]).collect();
            assert_eq!(digits.len(), 16, "hex digit #{place} takes every value");
        }
    }
}
