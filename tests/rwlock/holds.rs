//! Who may hold at once (many readers, or one writer; a waiting writer first), expiry,
//! extension, `using()` for both sides, and the writer's fences.

use std::time::{Duration, Instant};

use redfence::Error;

use crate::support::{DEADLINE, PATIENT, Servers, TestRedlock, eventually};
use crate::{READERS, TTL, WAITING, WRITER, contended, readers, rwlock, soon, waiting};

/// A TTL meant to run out during a test, but not before the hold's next two rounds (each
/// bounded by the [`PATIENT`] node timeout) have landed, however loaded the machine: 400 and
/// 300 ms TTLs left less than a node timeout for them.
const SHORT: Duration = Duration::from_millis(PATIENT.as_millis() as u64 * 3);

#[tokio::test]
async fn many_readers_hold_at_once_and_inspect_shows_them() {
    let servers = Servers::start(3);
    let redlock = servers.patient();
    let lock = rwlock(&redlock);
    let mut reads = Vec::new();
    for _ in 0..5 {
        reads.push(lock.try_acquire_read(TTL).await.expect("a reader"));
    }
    assert!(eventually(|| (0..3).all(|i| readers(&servers, i) == 5)).await);
    let report = lock.inspect().await.expect("inspect");
    assert_eq!(report.name(), "cfg");
    assert_eq!(report.readers().len(), 5);
    assert_eq!(report.writer(), None);
    assert!(!report.writer_waiting());
    for read in &reads {
        let prefix = &read.token()[..redfence::TOKEN_PREFIX_LEN];
        assert!(report.readers().contains(&prefix));
    }
    for read in reads {
        read.release().await.expect("release");
    }
    assert!(soon(|| (0..3).all(|i| readers(&servers, i) == 0)).await);
}

#[tokio::test]
async fn a_writer_excludes_readers_and_writers_and_its_release_frees_at_once() {
    let servers = Servers::start(3);
    let redlock = servers.patient();
    let lock = rwlock(&redlock);
    let write = lock.try_acquire_write(TTL).await.expect("writer");
    assert!(
        eventually(
            || servers.on_every_node(WRITER, |value| value.as_deref() == Some(write.token()))
        )
        .await
    );
    contended(lock.try_acquire_read(TTL).await, "a reader beside a writer");
    contended(lock.try_acquire_write(TTL).await, "a second writer");
    let report = lock.inspect().await.expect("inspect");
    assert_eq!(report.writer(), Some(&write.token()[..8]));
    assert!(report.readers().is_empty());
    // A try leaves no waiting mark.
    assert!(servers.on_every_node(WAITING, Option::is_none));
    write.release().await.expect("release");
    assert!(soon(|| servers.on_every_node(WRITER, Option::is_none)).await);
    let read = lock.try_acquire_read(TTL).await.expect("a reader at once");
    read.release().await.expect("release");
}

#[tokio::test]
async fn readers_exclude_a_writer_until_the_last_one_leaves() {
    let servers = Servers::start(3);
    let redlock = servers.patient();
    let lock = rwlock(&redlock);
    let a = lock.try_acquire_read(TTL).await.expect("a");
    let b = lock.try_acquire_read(TTL).await.expect("b");
    contended(lock.try_acquire_write(TTL).await, "a writer beside readers");
    a.release().await.expect("release a");
    contended(
        lock.try_acquire_write(TTL).await,
        "a writer beside one reader",
    );
    b.release().await.expect("release b");
    let write = lock
        .try_acquire_write(TTL)
        .await
        .expect("the writer at once");
    write.release().await.expect("release");
}

/// A writer waiting behind a reader marks the lock: new readers are refused (no writer
/// starvation), and it gets in as soon as the reader leaves, taking its mark away.
#[tokio::test]
async fn a_waiting_writer_blocks_new_readers_and_gets_in_when_they_leave() {
    let servers = Servers::start(3);
    let redlock = waiting(&servers);
    let lock = rwlock(&redlock);
    let first = lock.acquire_read(TTL).await.expect("first reader");
    let writer = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire_write(TTL).await }
    });
    assert!(
        eventually(|| servers.on_every_node(WAITING, Option::is_some)).await,
        "the waiting writer marks the lock"
    );
    assert!(lock.inspect().await.expect("inspect").writer_waiting());
    contended(
        lock.try_acquire_read(TTL).await,
        "a new reader behind a waiting writer",
    );
    assert!(!writer.is_finished(), "the writer got in beside a reader");
    first.release().await.expect("release");
    let write = tokio::time::timeout(DEADLINE, writer)
        .await
        .expect("the writer gets in once the reader left")
        .expect("task")
        .expect("acquire_write");
    assert!(
        eventually(|| servers.on_every_node(WAITING, Option::is_none)).await,
        "the writer takes its mark away"
    );
    contended(
        lock.try_acquire_read(TTL).await,
        "a reader beside the writer",
    );
    write.release().await.expect("release");
    let read = lock.try_acquire_read(TTL).await.expect("readers again");
    read.release().await.expect("release");
}

/// A hold never released frees the lock at its TTL, on both sides.
#[tokio::test]
async fn expiry_frees_the_lock() {
    let servers = Servers::start(3);
    let redlock = servers.patient();
    let lock = rwlock(&redlock);
    let ttl = SHORT;
    let read = lock.try_acquire_read(ttl).await.expect("reader");
    let since = Instant::now();
    std::mem::forget(read); // never released
    contended(
        lock.try_acquire_write(TTL).await,
        "a writer beside a live reader",
    );
    let write = loop {
        match lock.try_acquire_write(ttl).await {
            Ok(write) => break write,
            Err(Error::Contended { .. }) if since.elapsed() < DEADLINE => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(err) => panic!("the expired reader still holds: {err}"),
        }
    };
    assert!(
        since.elapsed() >= ttl - Duration::from_millis(50),
        "freed early"
    );
    let since = Instant::now();
    std::mem::forget(write);
    contended(
        lock.try_acquire_read(TTL).await,
        "a reader beside a live writer",
    );
    let read = loop {
        match lock.try_acquire_read(TTL).await {
            Ok(read) => break read,
            Err(Error::Contended { .. }) if since.elapsed() < DEADLINE => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(err) => panic!("the expired writer still holds: {err}"),
        }
    };
    read.release().await.expect("release");
}

#[tokio::test]
async fn extend_keeps_both_sides() {
    let servers = Servers::start(3);
    let redlock = servers.patient();
    let lock = rwlock(&redlock);
    let short = SHORT;
    let mut read = lock.try_acquire_read(short).await.expect("reader");
    read.extend(TTL).await.expect("extend the read");
    assert!(read.remaining() > Duration::from_secs(4));
    let past = Instant::now() + short * 2;
    tokio::time::sleep_until(past.into()).await;
    contended(
        lock.try_acquire_write(TTL).await,
        "a writer beside an extended reader",
    );
    assert!(eventually(|| (0..3).all(|i| readers(&servers, i) == 1)).await);
    read.release().await.expect("release");

    let mut write = lock.try_acquire_write(short).await.expect("writer");
    write.extend(TTL).await.expect("extend the write");
    assert!(eventually(|| (0..3).all(|i| servers.pttl(i, WRITER) > 4_000)).await);
    tokio::time::sleep(short * 2).await;
    contended(
        lock.try_acquire_read(TTL).await,
        "a reader beside an extended writer",
    );
    write.release().await.expect("release");
    // A released side cannot be extended: another guard's extension is refused.
    let mut other = lock.try_acquire_read(TTL).await.expect("reader");
    for i in 0..3 {
        let _: i64 = servers.cmd(i, &["ZREM", READERS, other.token()]);
    }
    assert!(matches!(
        other.extend(TTL).await,
        Err(Error::LockLost { .. })
    ));
}

#[tokio::test]
async fn using_keeps_both_sides_and_signals_their_loss() {
    let servers = Servers::start(3);
    // Rounds about every 300 ms, each with 300 ms to be confirmed (an 800 ms TTL at a 200 ms
    // threshold left 200 ms, less than the node timeout).
    let threshold = Duration::from_millis(300);
    let redlock = servers
        .builder()
        .node_timeout(PATIENT)
        .automatic_extension_threshold(threshold)
        .fencing(redfence::MemoryCounter::new())
        .build()
        .expect("config");
    let lock = rwlock(&redlock);
    let ttl = crate::support::ttl_for_window(threshold);
    let kept = |fenced: bool| {
        move |signal: redfence::Signal| async move {
            assert_eq!(signal.fence().is_some(), fenced);
            let until = Instant::now() + ttl * 3;
            while Instant::now() < until {
                signal.check()?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok::<_, Error>(())
        }
    };
    lock.using_read(ttl, kept(false))
        .await
        .expect("read kept alive");
    assert!(
        soon(|| (0..3).all(|i| readers(&servers, i) == 0)).await,
        "released after"
    );
    lock.using_write(ttl, kept(true))
        .await
        .expect("write kept alive");
    assert!(
        soon(|| servers.on_every_node(WRITER, Option::is_none)).await,
        "released after"
    );

    // Lost: the reader's member disappears (extensions do not set it again).
    let lost = lock
        .using_read(ttl, |signal| {
            let servers = &servers;
            async move {
                for i in 0..3 {
                    let _: i64 = servers.cmd(i, &["ZREM", READERS, signal.token()]);
                }
                Ok::<_, Error>(
                    tokio::time::timeout(ttl * 4, signal.aborted())
                        .await
                        .is_ok(),
                )
            }
        })
        .await
        .expect("scope");
    assert!(lost, "the read's signal aborts once it is lost");
    // Lost: another owner holds the writer key.
    let lost = lock
        .using_write(ttl, |signal| {
            let servers = &servers;
            async move {
                for i in 0..3 {
                    let _: () = servers.cmd(i, &["SET", WRITER, "someone-else", "PX", "60000"]);
                }
                Ok::<_, Error>(
                    tokio::time::timeout(ttl * 4, signal.aborted())
                        .await
                        .is_ok(),
                )
            }
        })
        .await
        .expect("scope");
    assert!(lost, "the write's signal aborts once it is lost");
    assert!((0..3).all(|i| servers.get(i, WRITER).as_deref() == Some("someone-else")));
}

#[tokio::test]
async fn writers_fences_increase_and_readers_have_none() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .node_timeout(PATIENT)
        .fencing(redfence::MemoryCounter::new())
        .build()
        .expect("config");
    let lock = rwlock(&redlock);
    let mut last = 0;
    for _ in 0..3 {
        let write = lock.acquire_write(TTL).await.expect("writer");
        let fence = write.fence().expect("a writer is fenced");
        assert!(fence > last, "{fence} after {last}");
        last = fence;
        write.release().await.expect("release");
        let read = lock.acquire_read(TTL).await.expect("reader");
        read.release().await.expect("release");
    }
    let read_fence = lock
        .using_read(TTL, |signal| async move { Ok::<_, Error>(signal.fence()) })
        .await
        .expect("using_read");
    assert_eq!(read_fence, None);
}

/// Waiting is not polling: with a 30 s retry delay, a writer behind another client's reader
/// gets in within seconds of the reader's release (the last reader's release is announced
/// while a writer waits), and a reader behind that writer is woken by its release (announced
/// on every writer release, and in process at once).
#[tokio::test]
async fn waiters_are_woken_by_releases_not_their_retry_delay() {
    let servers = Servers::start(3);
    let (ours, theirs) = (servers.slow_retries(), servers.slow_retries());
    let reader = rwlock(&theirs)
        .acquire_read(TTL)
        .await
        .expect("their reader");
    let subscribers = |i: usize| servers.release_subscribers(i, WRITER);
    let before: Vec<i64> = (0..3).map(subscribers).collect();
    let writer = tokio::spawn({
        let lock = rwlock(&ours);
        async move { lock.acquire_write(TTL).await }
    });
    assert!(
        eventually(|| servers.on_every_node(WAITING, Option::is_some)).await,
        "the writer waits"
    );
    // The writer listens on every node before the release (a message sent earlier is missed,
    // and the writer would poll: here after its 30 s retry delay).
    assert!(
        eventually(|| (0..3).all(|i| subscribers(i) > before[i])).await,
        "the writer subscribed"
    );
    reader.release().await.expect("release");
    let write = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the writer is woken by the last reader's release")
        .expect("task")
        .expect("acquire_write");

    let late = tokio::spawn({
        let lock = rwlock(&theirs);
        async move { lock.acquire_read(TTL).await }
    });
    // The late reader was refused (the writer holds) and now waits its 30 s delay, watching
    // the writer key's channel: its Redlock subscribed there beside ours (which stays
    // subscribed while our writer holds the key).
    assert!(
        eventually(|| (0..3).all(|i| subscribers(i) == 2)).await,
        "the late reader waits for a release"
    );
    assert!(!late.is_finished(), "a reader got in beside the writer");
    write.release().await.expect("release");
    let read = tokio::time::timeout(Duration::from_secs(10), late)
        .await
        .expect("the reader is woken by the writer's release")
        .expect("task")
        .expect("acquire_read");
    read.release().await.expect("release");
}
