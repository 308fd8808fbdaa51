//! Adversarial review of two changes: the phase-fair read-write lock (`rw_op` in
//! `scripts/batch.lua`, `rwlock/acquire.rs`) and the bounded reads of lock values (`held()`
//! and the inline fast path of `batch.lua`, the advisory scripts, the plain-command path), and
//! of the restart quarantine under ACL users. The attacks that found a bug (each fixed) and
//! the ones that failed, kept as regression tests: values.rs (bounded reads), rw_rule.rs (the
//! phase-fair rule on one node under a random schedule).

#[path = "../support/mod.rs"]
mod support;

mod rw_rule;
mod values;

use std::time::{Duration, Instant};

use redfence::{Error, Redlock, RedlockBuilder};
use support::{Servers, TestRedlock};

/// The batch script, run straight on a server by values.rs and rw_rule.rs.
const SCRIPT: &str = include_str!("../../src/scripts/batch.lua");
const TTL: Duration = Duration::from_secs(10);

/// The base ACL line of docs/production.md (a user that locks under `locks:`).
const LOCKER_RULES: &str = "on >locker-secret resetkeys ~locks:* resetchannels \
     &redfence:released:locks:* -@all +evalsha +script|load +get +getrange +set \
     +pexpire +del +exists +publish +subscribe +unsubscribe +time +info";

/// docs/production.md: what read-write locks add (`+zrangebyscore` was listed only "to inspect
/// them" when the review found that phase fairness needs it to grant writers).
const RWLOCK_RULES: &str =
    "+zadd +zrem +zscore +zcard +zrangebyscore +zremrangebyscore +pttl +time";

/// The minimal rules of earlier versions (tests/acl.rs's OLD_LOCKER_RULES), which the library
/// still supports ("without them locks still work and waiters poll"), plus what the CHANGELOG
/// tells ACL users to add since (`+time +info` for the restart quarantine, `+getrange`).
const OLD_RULES_PLUS_GETRANGE: &str = "on >locker-secret resetkeys ~locks:* resetchannels -@all \
     +evalsha +script|load +get +set +pexpire +del +time +info +getrange";

/// `ACL SETUSER name rules...` on every server.
fn set_user(servers: &Servers, name: &str, rules: &str) {
    for i in 0..servers.len() {
        let mut args = vec!["ACL", "SETUSER", name];
        args.extend(rules.split_whitespace());
        servers.cmd::<()>(i, &args);
    }
}

/// Every server's URL with `user:password`.
fn urls_as(servers: &Servers, user: &str, password: &str) -> Vec<String> {
    (0..servers.len())
        .map(|i| format!("redis://{user}:{password}@127.0.0.1:{}", servers.port(i)))
        .collect()
}

fn acl_builder(urls: Vec<String>) -> RedlockBuilder {
    Redlock::builder()
        .nodes(urls)
        .key_prefix("locks:")
        .node_timeout(Duration::from_millis(500))
        .retry_delay(Duration::from_millis(20))
        .retry_jitter(Duration::from_millis(10))
        .acquire_timeout(Duration::from_secs(3))
}

// ---------------------------------------------------------------------------------------
// ACL users
// ---------------------------------------------------------------------------------------

/// A user on the minimal rules of earlier versions takes a free lock over two resources, with
/// `+getrange` (as the CHANGELOG tells ACL users to) and without. `held()` reads GETRANGE (""
/// for a missing key and an empty value alike) and told them apart with `EXISTS`, which this
/// user may not run: a missing key read as another owner's value, and every multi-key acquire
/// (and every repair of a missing key, "E") was refused, forever. It tells them apart with
/// `GET` now, which every rule set allows.
#[tokio::test]
async fn old_acl_rules_with_getrange_take_multi_key_locks() {
    let servers = Servers::start(3);
    set_user(
        &servers,
        "locker",
        &OLD_RULES_PLUS_GETRANGE.replace(" +getrange", ""),
    );
    let redlock = acl_builder(urls_as(&servers, "locker", "locker-secret"))
        .build()
        .expect("config");
    let lock = redlock
        .acquire(&["a", "b"], TTL)
        .await
        .expect("two free keys, without +getrange (GET)");
    lock.release().await.expect("release");
    // The same user, given +getrange.
    set_user(&servers, "locker", "+getrange");
    let one = redlock.acquire(&["solo"], TTL).await.expect("one key");
    one.release().await.expect("release");
    for i in 0..servers.len() {
        assert_eq!(servers.get(i, "locks:a"), None, "a is free");
        assert_eq!(servers.get(i, "locks:b"), None, "b is free");
    }
    let both = redlock.acquire(&["a", "b"], TTL).await;
    let lock = both.unwrap_or_else(|err| {
        panic!("two free keys refused once the user may run GETRANGE: {err}")
    });
    lock.release().await.expect("release");
}

/// A user with the documented read-write lock rules takes the write of a free read-write lock.
/// (Phase fairness made every write acquire call `live()`/`admitted()` (ZRANGEBYSCORE ...
/// LIMIT 0 1), which the rules listed only for inspecting: no writer was ever granted.)
#[tokio::test]
async fn the_documented_rwlock_acl_rules_grant_a_writer() {
    let servers = Servers::start(3);
    set_user(
        &servers,
        "locker",
        &format!("{LOCKER_RULES} {RWLOCK_RULES}"),
    );
    let redlock = acl_builder(urls_as(&servers, "locker", "locker-secret"))
        .build()
        .expect("config");
    let config = redlock.rwlock("config").expect("rwlock");
    let read = config.acquire_read(TTL).await.expect("a reader");
    read.release().await.expect("release the reader");
    let write = config.acquire_write(TTL).await;
    let write = write.unwrap_or_else(|err| {
        panic!("the write of a free read-write lock, with the documented rules: {err}")
    });
    write.release().await.expect("release the writer");
}

// ---------------------------------------------------------------------------------------
// Advisory reads bounded at 4096 bytes
// ---------------------------------------------------------------------------------------

/// A leader whose identity is as long as allowed (1 KiB) is named by `Election::leader()`; a
/// longer one is refused by `build()`. (The record `"{term} {token} {identity}"` is read
/// through `scripts/inspect.lua`, which reads no string over 4096 bytes: a 5 KB identity, then
/// accepted, hid the leader for as long as it led.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_election_identity_is_refused_and_the_longest_leader_is_named() {
    use std::sync::Arc;

    use redfence::{FencingCounter, MemoryCounter};
    let servers = Servers::start(3);
    let counter: Arc<dyn FencingCounter> = Arc::new(MemoryCounter::new());
    let redlock = servers
        .builder()
        .node_timeout(Duration::from_millis(500))
        .fencing(counter)
        .build()
        .expect("config");
    let too_long = format!("host-{}", "x".repeat(5_000));
    assert!(matches!(
        redlock.election("jobs", Some(&too_long)).build(),
        Err(Error::Config(redfence::ConfigError::BadOption { .. }))
    ));
    let identity = format!("host-{}", "x".repeat(1_019));
    assert_eq!(identity.len(), 1_024);
    let election = redlock
        .election("jobs", Some(&identity))
        .lease(Duration::from_secs(3))
        .renew_deadline(Duration::from_millis(1_500))
        .retry_period(Duration::from_millis(400))
        .build()
        .expect("an identity of 1 KiB is accepted");
    let (tx, rx) = tokio::sync::oneshot::channel::<u64>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let leader = election.clone();
    let task = tokio::spawn(async move {
        let mut tx = Some(tx);
        let mut stop_rx = Some(stop_rx);
        leader
            .run(|leadership| {
                let tx = tx.take();
                let stop = stop_rx.take();
                async move {
                    if let Some(tx) = tx {
                        let _ = tx.send(leadership.term());
                    }
                    if let Some(stop) = stop {
                        let _ = stop.await;
                    }
                    Ok::<(), Error>(())
                }
            })
            .await
    });
    let term = tokio::time::timeout(Duration::from_secs(10), rx)
        .await
        .expect("elected within 10 s")
        .expect("term");
    // The record is written right after the term starts: give it a few renewals.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut named = None;
    while Instant::now() < deadline {
        named = election.leader().await.expect("read");
        if named.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    let named = named.unwrap_or_else(|| {
        panic!("leader() named nobody for 3 s while the candidate led term {term}")
    });
    assert_eq!(named.term, term);
    assert_eq!(named.identity, identity);
}

// ---------------------------------------------------------------------------------------
// Outside the two changes: the restart quarantine's ACL fallback on Valkey 9 and Redis 8
// ---------------------------------------------------------------------------------------

/// docs/production.md: "`+time` and `+info` serve the restart quarantine: without them it is
/// off for that server". A user of the documented rules less `+time` locks on Redis 7.0, whose
/// in-script ACL error says "can't run this command" (`Identity::memory_refused_by` knows
/// it). Valkey 9 and Redis 8 word it "ERR ACL failure in script: User ... has no permissions
/// to run the 'time' command": not recognised as a refusal for good, the memory script's
/// failure counts as passing, and every node stays quarantined ("for another 1s") forever.
#[tokio::test]
async fn without_time_the_quarantine_is_off_not_stuck_on_every_server() {
    for (name, launch) in [
        // The control: Redis 7.0 names the refusal as the code expects, and the lock is granted.
        (
            "Redis 7",
            support::Launch::default as fn() -> support::Launch,
        ),
        ("Valkey 9", support::valkey9),
        ("Redis 8", support::redis8),
    ] {
        let servers = Servers::start_launched(3, &[], |_| launch());
        set_user(&servers, "locker", &LOCKER_RULES.replace(" +time", ""));
        let redlock = acl_builder(urls_as(&servers, "locker", "locker-secret"))
            .build()
            .expect("config");
        let deadline = Instant::now() + Duration::from_secs(5);
        let lock = loop {
            match redlock.acquire(&["solo"], TTL).await {
                Ok(lock) => break lock,
                Err(err) if Instant::now() < deadline => {
                    let _ = err;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(err) => panic!("{name}: a free lock, without +time, for 5 s: {err}"),
            }
        };
        lock.release().await.expect("release");
    }
}
