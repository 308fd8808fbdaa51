//! [`Election::observe`](super::Election::observe): leader changes, by polling.

use std::time::Instant;

use futures::Stream;

use super::{Election, Leader};
use crate::clock;

/// What the stream remembers between polls.
struct Seen {
    /// The last item yielded (`None` before the first).
    last: Option<Option<Leader>>,
    /// When a read last succeeded.
    read_at: Instant,
}

/// [`Election::leader`] every retry period; yields the first answer, then each change, and
/// `None` once no read has succeeded for a whole lease after naming a leader (whoever led
/// then may be gone; the stream must not name them for ever).
pub(super) fn changes(election: Election) -> impl Stream<Item = Option<Leader>> + Send + 'static {
    let seen = Seen {
        last: None,
        read_at: clock::now(),
    };
    futures::stream::unfold((election, seen), |(election, mut seen)| async move {
        loop {
            if seen.last.is_some() {
                tokio::time::sleep(election.retry_period()).await;
            }
            match election.leader().await {
                Ok(now) => {
                    seen.read_at = clock::now();
                    if seen.last.as_ref() != Some(&now) {
                        seen.last = Some(now.clone());
                        return Some((now, (election, seen)));
                    }
                }
                Err(error) => {
                    tracing::debug!(election = %election.name(), %error, "leader unknown; polling on");
                    let named = matches!(seen.last, Some(Some(_)));
                    if named && clock::since(seen.read_at) >= election.lease() {
                        seen.last = Some(None);
                        return Some((None, (election, seen)));
                    }
                    if seen.last.is_none() {
                        // No answer yet: still wait between reads.
                        tokio::time::sleep(election.retry_period()).await;
                    }
                }
            }
        }
    })
}
