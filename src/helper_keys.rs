//! The keys redfence keeps beside a lock key `K`, by their endings, and the channel its
//! release is announced on: one list for the Rust code and a test that `scripts/batch.lua` and
//! `scripts/inspect.lua` (its inspect release) spell them the same.

/// `K:redfence:waiting`, the waiting mark: a refused acquire or a fair waiter sets it, and the
/// release that deletes it publishes on `redfence:released:K` (see `scripts/batch.lua`).
pub(crate) const WAITING: &str = ":redfence:waiting";
/// `K:redfence:queue`, the fair queue (waiters by ticket).
pub(crate) const QUEUE: &str = ":redfence:queue";
/// `K:redfence:alive`, the fair queue's leases (waiters by the time their lease ends).
pub(crate) const ALIVE: &str = ":redfence:alive";

/// The channel prefix of release messages (`redfence:released:K`, the key follows it): the
/// release that deletes a waiting mark publishes on it, and the hand-off's subscribers listen.
pub(crate) const CHANNEL_PREFIX: &str = "redfence:released:";

/// The shortest time a waiting mark lasts (ms), as `batch.lua` declares it: well beyond a
/// retry delay. (Only the script sets marks, so only the test below reads it.)
#[cfg(test)]
pub(crate) const MIN_WAIT_MARK_MS: u64 = 10_000;

/// Every reserved ending: a lock key may not end so, as it could be another lock's helper key.
pub(crate) const RESERVED: [&str; 3] = [WAITING, QUEUE, ALIVE];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_use_the_same_endings_and_minimum() {
        let script = include_str!("scripts/batch.lua");
        let declared =
            format!("local QUEUE, ALIVE, WAITING = \"{QUEUE}\", \"{ALIVE}\", \"{WAITING}\"");
        assert!(script.contains(&declared), "batch.lua declares {declared}");
        let minimum = format!("local MIN_WAIT_MARK = {MIN_WAIT_MARK_MS}\n");
        assert!(script.contains(&minimum), "batch.lua declares {minimum}");
        let inspect = include_str!("scripts/inspect.lua");
        assert!(
            inspect.contains(&declared),
            "inspect.lua declares {declared}"
        );
        // Both announce a release on the channel the waiters subscribe to.
        let channel = format!("\"{}\" ..", CHANNEL_PREFIX);
        for (name, source) in [("batch.lua", script), ("inspect.lua", inspect)] {
            assert!(
                source.contains(&channel),
                "{name} publishes on {channel} KEY"
            );
        }
    }
}
