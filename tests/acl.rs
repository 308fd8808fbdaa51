//! ACL users and passwords: a user allowed only what redfence needs can lock (the README's ACL
//! line), a missing permission is a per-node error that names it, NOSCRIPT still falls back to
//! loading the script, and a node whose password was wrong at first recovers once the operator
//! fixes it (no restart of the process).

mod support;

use std::time::{Duration, Instant};

use redfence::{Error, NodeFailure, Redlock, RedlockBuilder};
use support::Servers;

const TTL: Duration = Duration::from_secs(10);

/// The README's rules for a user that can lock under the `locks:` prefix, and nothing else.
const LOCKER_RULES: &str = "on >locker-secret resetkeys ~locks:* resetchannels \
                            &redfence:released:locks:* -@all +evalsha +script|load +get +getrange +set \
                            +pexpire +del +exists +publish +subscribe +unsubscribe +time +info";

/// The README's additions for fair mode.
const FAIR_RULES: &str = "+zadd +zrem +zrange +zrangebyscore +zremrangebyscore +pttl +time +type";

/// docs/production.md's additions for read-write locks (and inspecting them).
const RWLOCK_RULES: &str =
    "+zadd +zrem +zscore +zcard +zrangebyscore +zremrangebyscore +pttl +time";

/// The minimal rules of earlier versions, without release notifications.
const OLD_LOCKER_RULES: &str = "on >locker-secret resetkeys ~locks:* resetchannels -@all \
                                +evalsha +script|load +get +set +pexpire +del";

/// `ACL SETUSER name rules...` on server `i`.
fn set_user(servers: &Servers, i: usize, name: &str, rules: &str) {
    let mut args = vec!["ACL", "SETUSER", name];
    args.extend(rules.split_whitespace());
    servers.cmd::<()>(i, &args);
}

/// Every server's URL with `user:password`.
fn urls_as(servers: &Servers, user: &str, password: &str) -> Vec<String> {
    (0..servers.len())
        .map(|i| format!("redis://{user}:{password}@127.0.0.1:{}", servers.port(i)))
        .collect()
}

fn builder(urls: Vec<String>) -> RedlockBuilder {
    Redlock::builder()
        .nodes(urls)
        .node_timeout(Duration::from_millis(200))
        .retry_delay(Duration::from_millis(10))
        .retry_jitter(Duration::from_millis(10))
}

/// The per-node failures of a `QuorumUnreachable`, or a panic.
fn node_failures(err: &Error) -> Vec<&NodeFailure> {
    match err {
        Error::QuorumUnreachable { errors, .. } => errors.iter().map(|e| &e.failure).collect(),
        other => panic!("expected QuorumUnreachable, got {other}"),
    }
}

#[tokio::test]
async fn a_least_privilege_user_locks_and_reloads_flushed_scripts() {
    let servers = Servers::start(3);
    for i in 0..3 {
        set_user(&servers, i, "locker", LOCKER_RULES);
    }
    let redlock = builder(urls_as(&servers, "locker", "locker-secret"))
        .key_prefix("locks:")
        .build()
        .expect("config");

    let mut lock = redlock.acquire(&["invoice:1"], TTL).await.expect("acquire");
    // Acquire returns at the majority; the last node's grant may still be on its way.
    assert!(
        support::eventually(|| servers.holders("locks:invoice:1", lock.token(), 0..3).len() == 3)
            .await,
        "every node granted"
    );

    // A flushed script cache (a restart, SCRIPT FLUSH): EVALSHA answers NOSCRIPT and the
    // script is loaded again, with the user's own `script|load` permission.
    for i in 0..3 {
        servers.cmd::<()>(i, &["SCRIPT", "FLUSH"]);
    }
    lock.extend(Duration::from_secs(60)).await.expect("extend");
    assert!(
        support::eventually(|| (0..3).all(|i| servers.pttl(i, "locks:invoice:1") > 30_000)).await,
        "the extension reached every node"
    );
    lock.release().await.expect("release");
    assert!(
        support::eventually(|| servers.on_every_node("locks:invoice:1", Option::is_none)).await,
        "the release reached every node"
    );

    // The key pattern holds: without the prefix the keys are outside `~locks:*`.
    let unprefixed = builder(urls_as(&servers, "locker", "locker-secret"))
        .retry_count(0)
        .build()
        .expect("config");
    let err = unprefixed
        .acquire(&["invoice:1"], TTL)
        .await
        .expect_err("keys outside the user's pattern");
    let failures = node_failures(&err);
    assert_eq!(failures.len(), 3, "{err}");
    assert!(
        failures
            .iter()
            .all(|f| matches!(f, NodeFailure::Permission(_))),
        "{err}"
    );
}

#[tokio::test]
async fn a_user_without_evalsha_gets_a_permission_error_that_names_it() {
    let servers = Servers::start(3);
    for i in 0..3 {
        set_user(&servers, i, "noeval", "on >pw ~* &* +@all -evalsha");
    }
    // The script only: on a server with compare-and-delete (Valkey 9) this user could lock
    // one key with plain commands, which it may run (tests/native_commands.rs).
    let redlock = builder(urls_as(&servers, "noeval", "pw"))
        .retry_count(0)
        .native_commands(false)
        .build()
        .expect("config");
    // No script call ever succeeds, so no lock is granted that this user could neither extend
    // nor release.
    for _ in 0..2 {
        let err = redlock
            .acquire(&["a"], TTL)
            .await
            .expect_err("EVALSHA is refused");
        assert!(matches!(err, Error::QuorumUnreachable { .. }), "{err}");
    }
    for i in 0..3 {
        assert_eq!(servers.get(i, "a"), None, "node {i}");
        assert!(
            support::eventually(|| servers.keys(i).is_empty()).await,
            "node {i}: {:?}",
            servers.keys(i)
        );
    }
    let err = redlock
        .acquire(&["a"], TTL)
        .await
        .expect_err("EVALSHA is refused");
    let failures = node_failures(&err);
    assert_eq!(failures.len(), 3, "{err}");
    assert!(
        failures
            .iter()
            .all(|f| matches!(f, NodeFailure::Permission(_))),
        "{err}"
    );
    let shown = err.to_string();
    assert!(shown.contains("permission denied"), "{shown}");
    assert!(
        shown.contains("evalsha"),
        "the missing permission is named: {shown}"
    );
    for i in 0..3 {
        assert!(
            shown.contains(&format!("node #{i} (127.0.0.1:{}", servers.port(i))),
            "{shown}"
        );
    }
}

/// Tries `try_acquire` until it succeeds or the deadline passes.
async fn lock_eventually(redlock: &Redlock, resource: &str) -> Result<redfence::Lock, Error> {
    let deadline = Instant::now() + support::DEADLINE;
    loop {
        match redlock.try_acquire(&[resource], TTL).await {
            Ok(lock) => return Ok(lock),
            Err(err) if Instant::now() >= deadline => return Err(err),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

#[tokio::test]
async fn a_node_whose_password_was_wrong_recovers_when_the_operator_fixes_it() {
    let servers = Servers::start(3);
    for i in 0..3 {
        set_user(&servers, i, "app", "on >old ~* &* +@all");
    }
    // The application already has the new password; the servers do not yet.
    let redlock = builder(urls_as(&servers, "app", "new"))
        .build()
        .expect("config");
    let err = redlock
        .try_acquire(&["job"], TTL)
        .await
        .expect_err("wrong password");
    // Authentication failures, not timeouts: the node answered.
    let failures = node_failures(&err);
    assert_eq!(failures.len(), 3, "{err}");
    assert!(
        failures.iter().all(|f| matches!(f, NodeFailure::Reply(_))),
        "{err}"
    );
    assert!(err.to_string().contains("auth"), "{err}");

    // A while later, the operator rotates the password on every server.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..3 {
        set_user(&servers, i, "app", "resetpass >new");
    }
    let lock = lock_eventually(&redlock, "job")
        .await
        .expect("the nodes reconnect with the right password");
    assert!(
        servers.holders("job", lock.token(), 0..3).len() >= 2,
        "a majority holds the lock"
    );
    lock.release().await.expect("release");
}

#[tokio::test]
async fn requirepass_set_after_the_first_connection_attempt_is_picked_up() {
    let servers = Servers::start(1);
    let url = format!("redis://:s3cret@127.0.0.1:{}", servers.port(0));
    let redlock = builder(vec![url]).build().expect("config");
    // The server has no password yet: AUTH fails.
    let err = redlock
        .try_acquire(&["job"], TTL)
        .await
        .expect_err("no password is configured on the server");
    assert!(
        matches!(node_failures(&err)[..], [NodeFailure::Reply(_)]),
        "{err}"
    );

    servers.cmd::<()>(0, &["CONFIG", "SET", "requirepass", "s3cret"]);
    let lock = lock_eventually(&redlock, "job")
        .await
        .expect("the node reconnects once the password is set");
    assert_eq!(lock.resources(), ["job"]);
    lock.release().await.expect("release");
}

#[tokio::test]
async fn without_the_notification_permissions_locks_still_release_and_waiters_poll() {
    let servers = Servers::start(3);
    for i in 0..3 {
        set_user(&servers, i, "locker", OLD_LOCKER_RULES);
    }
    let redlock = builder(urls_as(&servers, "locker", "locker-secret"))
        .key_prefix("locks:")
        .build()
        .expect("config");
    let lock = redlock.acquire(&["invoice:2"], TTL).await.expect("acquire");
    // A waiter in another manager: its subscription is refused, so it polls.
    let other = builder(urls_as(&servers, "locker", "locker-secret"))
        .key_prefix("locks:")
        .retry_count(500)
        .build()
        .expect("config");
    let waiting = tokio::spawn(async move { other.acquire(&["invoice:2"], TTL).await });
    lock.release()
        .await
        .expect("the release does not need PUBLISH");
    let lock = waiting
        .await
        .expect("waiter task")
        .expect("the waiter polled its way to the lock");
    lock.release().await.expect("release");
    assert!(
        support::eventually(|| servers.on_every_node("locks:invoice:2", Option::is_none)).await
    );
}

#[tokio::test]
async fn fair_mode_works_with_the_readme_rules() {
    let servers = Servers::start(3);
    for i in 0..3 {
        set_user(
            &servers,
            i,
            "locker",
            &format!("{LOCKER_RULES} {FAIR_RULES}"),
        );
    }
    let redlock = builder(urls_as(&servers, "locker", "locker-secret"))
        .key_prefix("locks:")
        .fair(true)
        .build()
        .expect("config");
    let lock = redlock.acquire(&["invoice:3"], TTL).await.expect("acquire");
    let waiting = tokio::spawn({
        let redlock = redlock.clone();
        async move { redlock.acquire(&["invoice:3"], TTL).await }
    });
    // The waiter took its place on every node, behind the holder (at the head until it
    // releases).
    assert!(
        support::eventually(|| (0..3)
            .all(|i| { servers.cmd::<i64>(i, &["ZCARD", "locks:invoice:3:redfence:queue"]) == 2 }))
        .await
    );
    lock.release().await.expect("release");
    let lock = waiting
        .await
        .expect("waiter task")
        .expect("acquired in turn");
    lock.release().await.expect("release");
    assert!(support::eventually(|| (0..3).all(|i| servers.keys(i).is_empty())).await);
}

#[tokio::test]
async fn a_key_pattern_without_the_waiting_marks_still_locks_and_releases() {
    let servers = Servers::start(3);
    // Only the lock's own key: not `locks:job:redfence:waiting`, where waiting is marked.
    for i in 0..3 {
        set_user(
            &servers,
            i,
            "locker",
            "on >locker-secret resetkeys ~locks:job resetchannels -@all +evalsha +script|load \
             +get +set +pexpire +del",
        );
    }
    let redlock = builder(urls_as(&servers, "locker", "locker-secret"))
        .key_prefix("locks:")
        .retry_count(0)
        .build()
        .expect("config");
    let lock = redlock.acquire(&["job"], TTL).await.expect("acquire");
    // Refused: its mark is refused too, silently.
    match redlock.try_acquire(&["job"], TTL).await {
        Err(Error::Contended { .. }) => {}
        other => panic!("the lock is held: {other:?}"),
    }
    lock.release()
        .await
        .expect("the release does not need the mark");
    assert!(support::eventually(|| (0..3).all(|i| servers.keys(i).is_empty())).await);
    let lock = redlock.acquire(&["job"], TTL).await.expect("free again");
    lock.release().await.expect("release");
}

/// A read-write lock and a semaphore work for a user with the documented rules and nothing
/// more: readers share, a writer waits for them, a permit is granted and inspected.
#[tokio::test]
async fn rwlocks_and_semaphores_work_with_the_documented_rules() {
    let servers = Servers::start(3);
    for i in 0..3 {
        set_user(
            &servers,
            i,
            "locker",
            // `+type`: what inspect() adds (for the semaphore's slots).
            &format!("{LOCKER_RULES} {RWLOCK_RULES} +type"),
        );
    }
    let redlock = builder(urls_as(&servers, "locker", "locker-secret"))
        .key_prefix("locks:")
        .build()
        .expect("config");
    let config = redlock.rwlock("config").expect("rwlock");
    let a = config.acquire_read(TTL).await.expect("first reader");
    let b = config.acquire_read(TTL).await.expect("second reader");
    let report = config.inspect().await.expect("inspect");
    assert_eq!(report.readers().len(), 2, "{report:?}");
    assert!(matches!(
        config.try_acquire_write(TTL).await,
        Err(Error::Contended { .. })
    ));
    a.release().await.expect("release");
    b.release().await.expect("release");
    let w = config.acquire_write(TTL).await.expect("writer");
    w.release().await.expect("release");

    let jobs = redlock.semaphore("jobs", 2).expect("semaphore");
    let permit = jobs.acquire(TTL).await.expect("permit");
    let slots = jobs.inspect().await.expect("inspect");
    assert_eq!(slots.views().iter().filter(|v| !v.is_free()).count(), 1);
    permit.release().await.expect("release");
}
