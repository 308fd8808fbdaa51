//! One node's subscriber: a dedicated pub/sub connection that every watcher of a `Redlock`
//! shares, subscribed to the release channels of the keys being watched.
//!
//! When the connection drops, messages published meanwhile are lost: watchers then fall
//! back to their retry delay. The subscriber reconnects (100 ms, doubling up to 2 s) and
//! subscribes again to every key still subscribed.

use std::collections::HashSet;
use std::sync::Weak;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;

use crate::helper_keys::CHANNEL_PREFIX;

/// Who hears of the releases: the `HandOff`'s shared state.
pub(super) trait Released {
    /// A release of `key` on node `node` whose message named `next` as the head of the
    /// node's queue ("" for none).
    fn released(&self, key: &str, node: usize, next: &str);
}

/// What a subscriber is asked to do.
pub(super) enum Command {
    Subscribe(Vec<String>),
    Unsubscribe(Vec<String>),
}

/// Serves one node until the `HandOff` is gone (its command channel closes), connecting to
/// the server `client` names at each connect (a Sentinel group's master changes).
pub(super) async fn run(
    client: crate::node::PubSub,
    node: usize,
    mut commands: mpsc::UnboundedReceiver<Command>,
    state: Weak<impl Released>,
) {
    let mut keys: HashSet<String> = HashSet::new();
    let mut failures: u32 = 0;
    loop {
        let Some(server) = client.client() else {
            tracing::debug!(
                node,
                "no server known yet for the release subscriber; waiters poll"
            );
            if !wait_to_reconnect(&mut commands, &mut keys, &mut failures).await {
                return;
            }
            continue;
        };
        let connected = tokio::time::timeout(Duration::from_secs(2), server.get_async_pubsub());
        let (mut sink, mut stream) = match connected.await {
            Ok(Ok(pubsub)) => pubsub.split(),
            Ok(Err(error)) => {
                tracing::debug!(node, %error, "release subscriber cannot connect; waiters poll");
                if !wait_to_reconnect(&mut commands, &mut keys, &mut failures).await {
                    return;
                }
                continue;
            }
            Err(_) => {
                tracing::debug!(node, "release subscriber connect timed out; waiters poll");
                if !wait_to_reconnect(&mut commands, &mut keys, &mut failures).await {
                    return;
                }
                continue;
            }
        };
        if !keys.is_empty() && sink.subscribe(channels(keys.iter())).await.is_err() {
            if !wait_to_reconnect(&mut commands, &mut keys, &mut failures).await {
                return;
            }
            continue;
        }
        failures = 0;
        loop {
            tokio::select! {
                command = commands.recv() => {
                    let Some(command) = command else { return };
                    let sent = match command {
                        Command::Subscribe(new) => {
                            let channels = channels(new.iter());
                            keys.extend(new);
                            sink.subscribe(channels).await
                        }
                        Command::Unsubscribe(gone) => {
                            for key in &gone {
                                keys.remove(key);
                            }
                            sink.unsubscribe(channels(gone.iter())).await
                        }
                    };
                    if let Err(error) = sent {
                        tracing::debug!(node, %error, "release subscriber lost its connection");
                        break;
                    }
                }
                message = stream.next() => {
                    let Some(message) = message else {
                        tracing::debug!(node, "release subscriber lost its connection");
                        break;
                    };
                    let Some(state) = state.upgrade() else { return };
                    if let Some(key) = message.get_channel_name().strip_prefix(CHANNEL_PREFIX) {
                        let next: String = message.get_payload().unwrap_or_default();
                        state.released(key, node, &next);
                    }
                }
            }
        }
        if !wait_to_reconnect(&mut commands, &mut keys, &mut failures).await {
            return;
        }
    }
}

fn channels<'a>(keys: impl Iterator<Item = &'a String>) -> Vec<String> {
    keys.map(|key| format!("{CHANNEL_PREFIX}{key}")).collect()
}

/// Waits before the next connect, applying the commands that arrive meanwhile; `false` when
/// the `HandOff` is gone.
async fn wait_to_reconnect(
    commands: &mut mpsc::UnboundedReceiver<Command>,
    keys: &mut HashSet<String>,
    failures: &mut u32,
) -> bool {
    let delay = Duration::from_millis(100)
        .saturating_mul(1u32 << (*failures).min(5))
        .min(Duration::from_secs(2));
    *failures = failures.saturating_add(1);
    let sleep = tokio::time::sleep(delay);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            () = &mut sleep => return true,
            command = commands.recv() => match command {
                None => return false,
                Some(Command::Subscribe(new)) => keys.extend(new),
                Some(Command::Unsubscribe(gone)) => {
                    for key in &gone {
                        keys.remove(key);
                    }
                }
            },
        }
    }
}
