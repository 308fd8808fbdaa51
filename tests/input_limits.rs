//! Edge inputs that pass validation must work, or be refused before any traffic, never fail
//! on the nodes or panic (from an adversarial review: each test failed before its fix).

mod support;

use std::time::Duration;

use redfence::{Error, InvalidInput, MAX_TTL};
use support::{Servers, TestRedlock};

const TTL: Duration = Duration::from_secs(5);

/// A semaphore whose every slot is taken, over a builder whose retry delay is
/// `Duration::MAX` (accepted by `build()`): the waiter gives up at `acquire_timeout` with
/// `AcquireTimeout`, as a mutex does (it once panicked on `Instant + Duration::MAX`).
#[tokio::test]
async fn a_semaphore_with_an_endless_retry_delay_times_out_instead_of_panicking() {
    let servers = Servers::start(3);
    let holder = servers.patient();
    let sem = holder.semaphore("jobs", 1).expect("semaphore");
    let permit = sem.acquire(TTL).await.expect("first permit");

    let waiter = servers
        .builder()
        .node_timeout(support::PATIENT)
        .retry_delay(Duration::MAX)
        .retry_jitter(Duration::ZERO)
        .retry_count(3)
        .acquire_timeout(Duration::from_secs(1))
        .build()
        .expect("builder accepts Duration::MAX as a retry delay");
    // Control: the mutex path handles the same configuration without panicking.
    let mutex_holder = holder.acquire(&["m"], TTL).await.expect("mutex");
    let mutex = tokio::time::timeout(Duration::from_secs(20), waiter.acquire(&["m"], TTL))
        .await
        .expect("mutex acquire ends");
    assert!(
        matches!(mutex, Err(Error::AcquireTimeout { .. })),
        "mutex: {mutex:?}"
    );
    mutex_holder.release().await.expect("release");

    let sem2 = waiter.semaphore("jobs", 1).expect("semaphore");
    let task = tokio::spawn(async move { sem2.acquire(TTL).await.map(|_| ()) });
    let joined = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("semaphore acquire ends");
    match joined {
        Err(join) => panic!("semaphore acquire panicked: {join}"),
        Ok(result) => assert!(
            matches!(result, Err(Error::AcquireTimeout { .. })),
            "semaphore: {result:?}"
        ),
    }
    permit.release().await.expect("release");
}

/// Whatever a TTL that `validate_ttl` accepts does, it must not come back as a node failure
/// after traffic: either it works, or it is `InvalidInput` before any connection.
fn works_or_refused_up_front<T: std::fmt::Debug>(what: &str, result: &Result<T, Error>) {
    match result {
        Ok(_) | Err(Error::InvalidInput(InvalidInput::TtlTooLong { .. })) => {}
        Err(other) => panic!("{what}: a TTL the library accepted failed on the nodes: {other}"),
    }
}

/// `MAX_TTL` is documented as "the longest TTL redfence sends to Redis"; a mutex takes it
/// (checked here), and so does a semaphore permit, whose size key once asked to live
/// `2 × ttl`, which Redis refused on every node.
#[tokio::test]
async fn a_semaphore_permit_of_max_ttl_is_granted_or_refused_up_front() {
    let servers = Servers::start(3);
    let redlock = servers.patient();
    let lock = redlock.try_acquire(&["m"], MAX_TTL).await;
    works_or_refused_up_front("mutex", &lock);
    if let Ok(lock) = lock {
        lock.release().await.expect("release");
    }
    let sem = redlock.semaphore("jobs", 2).expect("semaphore");
    let permit = sem.try_acquire(MAX_TTL).await;
    works_or_refused_up_front("semaphore", &permit);
    if let Ok(permit) = permit {
        permit.release().await.expect("release");
    }
}

/// A read-write lock's script once handed its TTL back to `SET ... PX` / `PEXPIRE` as a Lua
/// number: from 1e17 ms up Redis received it in exponent form and refused it on every node.
/// It now sends the digits it was given.
#[tokio::test]
async fn a_rwlock_side_of_a_long_accepted_ttl_is_granted_or_refused_up_front() {
    let servers = Servers::start(3);
    let redlock = servers.patient();
    let rw = redlock.rwlock("cfg").expect("rwlock");
    let write = rw.try_acquire_write(MAX_TTL).await;
    works_or_refused_up_front("write", &write);
    if let Ok(write) = write {
        write.release().await.expect("release");
    }
    let read = rw.try_acquire_read(MAX_TTL).await;
    works_or_refused_up_front("read", &read);
    if let Ok(read) = read {
        read.release().await.expect("release");
    }
}

/// `inspect` / `force_release` refuse a resource whose key ends like another lock's helper
/// key (`ReservedName`), as `acquire` does: `force_release(["job:redfence:queue"])` once
/// deleted lock `job`'s fair queue on every node.
#[tokio::test]
async fn force_release_refuses_a_helper_key_name_as_acquire_does() {
    let servers = Servers::start(3);
    let fair = servers.fair(Duration::from_millis(20));
    let held = fair.acquire(&["job"], TTL).await.expect("holder");
    // A second fair waiter lines up in job's queue on every node.
    let waiter = {
        let fair = fair.clone();
        tokio::spawn(async move {
            fair.acquire(&["job"], TTL)
                .await
                .map(|l| l.token().to_owned())
        })
    };
    assert!(
        support::eventually(|| servers.keys(0).iter().any(|k| k == "job:redfence:queue")).await,
        "the waiter lined up"
    );
    let acquire = fair.try_acquire(&["job:redfence:queue"], TTL).await;
    assert!(
        matches!(
            acquire,
            Err(Error::InvalidInput(InvalidInput::ReservedName { .. }))
        ),
        "{acquire:?}"
    );
    let forced = fair.force_release(&["job:redfence:queue"]).await;
    let queue_left = servers.keys(0).iter().any(|k| k == "job:redfence:queue");
    waiter.abort();
    held.release().await.expect("release");
    assert!(
        matches!(
            forced,
            Err(Error::InvalidInput(InvalidInput::ReservedName { .. }))
        ),
        "force_release took a reserved name ({}): {forced:?}",
        if queue_left {
            "queue still there"
        } else {
            "and deleted job's fair queue"
        }
    );
}
