//! [`Election::observe`](super::Election::observe): leader changes, by polling.

use std::sync::Arc;
use std::time::Instant;

use futures::Stream;

use super::builder::Inner;
use super::record::{self, Leader};
use crate::clock;

/// What the stream remembers between polls.
struct Seen {
    /// The last item yielded (`None` before the first).
    last: Option<Option<Leader>>,
    /// When a read last succeeded.
    read_at: Instant,
}

/// [`Election::leader`](super::Election::leader) every retry period; yields the first
/// answer, then each change, and `None` once no read has succeeded for a whole lease after
/// naming a leader (whoever led then may be gone; the stream must not name them for ever).
pub(super) fn changes(inner: Arc<Inner>) -> impl Stream<Item = Option<Leader>> + Send + 'static {
    let seen = Seen {
        last: None,
        read_at: clock::now(),
    };
    futures::stream::unfold((inner, seen), |(inner, mut seen)| async move {
        loop {
            if seen.last.is_some() {
                tokio::time::sleep(inner.timing.retry_period).await;
            }
            match record::read(&inner.shared, &inner.lock_key, &inner.record_key).await {
                Ok(now) => {
                    seen.read_at = clock::now();
                    if seen.last.as_ref() != Some(&now) {
                        seen.last = Some(now.clone());
                        return Some((now, (inner, seen)));
                    }
                }
                Err(error) => {
                    tracing::debug!(election = %inner.name, %error, "leader unknown; polling on");
                    let named = matches!(seen.last, Some(Some(_)));
                    if named && clock::since(seen.read_at) >= inner.timing.lease {
                        seen.last = Some(None);
                        return Some((None, (inner, seen)));
                    }
                    if seen.last.is_none() {
                        // No answer yet: still wait between reads.
                        tokio::time::sleep(inner.timing.retry_period).await;
                    }
                }
            }
        }
    })
}
