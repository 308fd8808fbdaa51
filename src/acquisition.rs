//! Acquiring a lock: attempts on the configured schedule, each one a quorum round followed by
//! the fencing token, and nothing left locked whatever happens.

use std::sync::Arc;
use std::time::Instant;

use crate::clock;
use crate::error::{Error, FencingError};
use crate::guard::DropGuard;
use crate::inner::{Held, Shared, Target};
use crate::metrics::Tries;
use crate::node::Op;
use crate::quorum::{self, Failed, Settled};
use crate::trace;

/// A lock a majority granted, with its validity and fence: what `Lock` is made of.
pub(crate) struct Acquired {
    pub(crate) held: Held,
    pub(crate) expires_at: Instant,
    pub(crate) fence: Option<u64>,
}

/// Attempts with the configured schedule and deadline until one succeeds, an error is final,
/// the retries run out, or `acquire_timeout` would pass. Counts attempts, contended ones and
/// the time slept between them in `tries`.
pub(crate) async fn acquire(
    shared: &Arc<Shared>,
    target: &Target,
    tries: &mut Tries,
) -> Result<Acquired, Error> {
    shared.check_open()?;
    let config = &shared.config;
    let started = clock::now();
    let deadline = config.acquire_timeout.and_then(|t| started.checked_add(t));
    let mut delays = config.backoff.delays();
    let mut attempts: u32 = 0;
    loop {
        attempts = attempts.saturating_add(1);
        tries.attempts = attempts;
        trace::attempts(attempts);
        let failed = match attempt(shared, target).await {
            Ok(acquired) => return Ok(acquired),
            Err(failed) if !failed.is_retryable() => {
                return Err(failed.into_error(&target.resources, attempts));
            }
            Err(failed) => failed,
        };
        tries.failed(&failed);
        let Some(delay) = delays.next() else {
            return Err(failed.into_error(&target.resources, attempts));
        };
        // A delay too long for an Instant certainly ends past the deadline.
        if let Some(deadline) = deadline
            && clock::now()
                .checked_add(delay)
                .is_none_or(|wake| wake >= deadline)
        {
            return Err(Error::AcquireTimeout {
                waited: clock::since(started),
                attempts,
                last: Some(Box::new(failed.into_error(&target.resources, attempts))),
            });
        }
        tracing::trace!(?delay, attempts, "lock attempt failed; retrying");
        tokio::time::sleep(delay).await;
        tries.backoff = tries.backoff.saturating_add(delay);
        shared.check_open()?;
    }
}

/// One attempt: a fresh token, the quorum round, then the fencing token. Cancel-safe: dropped
/// before it returns, it releases on every node in the background.
pub(crate) async fn attempt(shared: &Arc<Shared>, target: &Target) -> Result<Acquired, Failed> {
    let config = &shared.config;
    let held = Held {
        shared: Arc::clone(shared),
        target: target.clone(),
        token: new_token(),
        settled: Settled::none(),
    };
    let req = held.request(Op::Acquire, target.ttl);
    // Until this attempt has handed out a lock or cleaned up after itself, dropping it (the
    // caller gave up mid-way) releases on every node in the background.
    let mut guard = DropGuard::new(held, Held::release_in_background);
    let start = clock::now();
    let round = quorum::acquire_round(
        &shared.nodes,
        &req,
        config.node_timeout,
        config.drift_factor,
        &shared.tasks,
    )
    .await;
    let (valid_for, settled) = match round {
        Ok(granted) => granted,
        Err(failed) => {
            // acquire_round released on every node already.
            guard.disarm();
            return Err(failed);
        }
    };
    guard.settled = settled;
    let expires_at = start + valid_for;
    let fence = match fence(shared, &target.resources, expires_at).await {
        Ok(fence) => fence,
        Err(error) => {
            let release = guard.request(Op::Release, target.ttl);
            quorum::release_everywhere(
                &shared.nodes,
                &release,
                config.node_timeout,
                &guard.settled,
            )
            .await;
            guard.disarm();
            return Err(Failed::Other(error.into()));
        }
    };
    guard.disarm();
    Ok(Acquired {
        held: (*guard).clone(),
        expires_at,
        fence,
    })
}

/// Asks the fencing counter, if any, for a token, within the lock's validity.
async fn fence(
    shared: &Shared,
    resources: &[String],
    expires_at: Instant,
) -> Result<Option<u64>, FencingError> {
    let config = &shared.config;
    let Some(counter) = &config.fencing else {
        return Ok(None);
    };
    let remaining = expires_at.saturating_duration_since(clock::now());
    let limit = config.fencing_timeout.min(remaining);
    match tokio::time::timeout(limit, counter.next_fence(resources)).await {
        Ok(Ok(_)) | Err(_) if clock::now() >= expires_at => Err(FencingError::LockExpired),
        Ok(Ok(token)) => Ok(Some(token)),
        Ok(Err(error)) => Err(FencingError::Counter(Arc::from(error))),
        Err(_) => Err(FencingError::Timeout(limit)),
    }
}

/// A fresh owner token: 128 random bits from the OS-seeded CSPRNG, as 32 hex digits.
fn new_token() -> Arc<str> {
    let bits: u128 = rand::random();
    Arc::from(format!("{bits:032x}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fresh_128_bit_hex() {
        let a = new_token();
        let b = new_token();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
