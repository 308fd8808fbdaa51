//! [`Election::observe`](super::Election::observe): leader changes, by polling.

use futures::Stream;

use super::{Election, Leader};

/// [`Election::leader`] every retry period; yields the first answer, then each change.
pub(super) fn changes(election: Election) -> impl Stream<Item = Option<Leader>> + Send + 'static {
    futures::stream::unfold(
        (election, None::<Option<Leader>>),
        |(election, mut last)| async move {
            loop {
                if last.is_some() {
                    tokio::time::sleep(election.retry_period()).await;
                }
                match election.leader().await {
                    Ok(now) if last.as_ref() != Some(&now) => {
                        last = Some(now.clone());
                        return Some((now, (election, last)));
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::debug!(election = %election.name(), %error, "leader unknown; polling on");
                        if last.is_none() {
                            // No answer yet: still wait between reads.
                            tokio::time::sleep(election.retry_period()).await;
                        }
                    }
                }
            }
        },
    )
}
