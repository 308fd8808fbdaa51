//! No released lock's key outlives `close()`, whatever a node answered in between (from an
//! adversarial review of the per-node queue: each test but the burst failed before its fix).

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use redfence::{Error, Redlock};
use support::proxy::{Mode, Proxy};
use support::{Servers, TestRedlock, eventually};

const TTL: Duration = Duration::from_secs(60);

/// A node busy with another client's long script answers `-BUSY`: the release refused that way
/// never ran, so it is sent again, like one given up at a timeout or a lost connection (it once
/// was not, and the key outlived `close()` there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_refused_with_busy_is_sent_again_before_close_returns() {
    let servers = Arc::new(Servers::start(3));
    let redlock = servers.one_attempt(Duration::from_secs(2));
    support::warm_up(&redlock).await;
    let lock = redlock
        .acquire(&["busy:victim"], TTL)
        .await
        .expect("acquire");
    assert!(eventually(|| servers.get(0, "busy:victim").is_some()).await);
    let _: () = servers.cmd(0, &["CONFIG", "SET", "busy-reply-threshold", "20"]);
    // Another client's script keeps node 0 busy until killed.
    let busy = {
        let servers = Arc::clone(&servers);
        std::thread::spawn(move || {
            let mut conn = servers.conn(0);
            let _: redis::RedisResult<()> = redis::cmd("EVAL")
                .arg("while true do end")
                .arg(0)
                .query(&mut conn);
        })
    };
    // Wait until node 0 answers BUSY.
    let busy_now = eventually(|| {
        let mut conn = servers.conn(0);
        let r: redis::RedisResult<String> = redis::cmd("PING").query(&mut conn);
        matches!(&r, Err(e) if e.code() == Some("BUSY"))
    })
    .await;
    assert!(busy_now, "node 0 is busy");
    lock.release().await.expect("nodes 1 and 2 release");
    // The script is killed: node 0 answers again.
    let _: () = servers.cmd(0, &["SCRIPT", "KILL"]);
    busy.join().expect("busy thread");
    tokio::time::timeout(Duration::from_secs(30), redlock.close())
        .await
        .expect("close returns");
    assert_eq!(
        servers.get(0, "busy:victim"),
        None,
        "the released lock's key outlived close() on node 0 (PTTL {} ms)",
        servers.pttl(0, "busy:victim")
    );
}

/// A failed extension to a longer TTL that landed on one node leaves the key there for the
/// new TTL: the lock's release, given up on that node (its connection reset), is sent again
/// for as long (it once was only for the old TTL, after which `close()` returned with the key
/// still there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_failed_longer_extension_is_resent_for_as_long_as_the_key_may_live() {
    let servers = Servers::start(3);
    let proxy = Proxy::in_front_of(&servers.url(0), Mode::Pass).await;
    let urls = vec![proxy.url(), servers.url(1), servers.url(2)];
    let redlock = Redlock::builder()
        .nodes(urls)
        .node_timeout(Duration::from_millis(300))
        .retry_count(0)
        .build()
        .expect("config");
    support::warm_up(&redlock).await;
    let mut lock = redlock
        .acquire(&["ext:victim"], Duration::from_secs(1))
        .await
        .expect("acquire");
    assert!(eventually(|| servers.get(0, "ext:victim").is_some()).await);
    // Nodes 1 and 2 lost the key (e.g. a restart); node 0 still has it.
    for n in 1..3 {
        let _: i64 = servers.cmd(n, &["DEL", "ext:victim"]);
    }
    // The extension to 60 s fails (refused by a majority) but lands on node 0.
    let extended = lock.extend(TTL).await;
    assert!(
        extended.is_err(),
        "extension refused by a majority: {extended:?}"
    );
    assert!(
        servers.pttl(0, "ext:victim") > 30_000,
        "node 0 extended the key"
    );
    // Node 0's connection resets for a while: the release there is given up and resent.
    proxy.set(Mode::Cut);
    let _ = lock.release().await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    proxy.set(Mode::Pass);
    let closing = Instant::now();
    tokio::time::timeout(Duration::from_secs(90), redlock.close())
        .await
        .expect("close returns");
    let pttl = servers.pttl(0, "ext:victim");
    assert_eq!(
        servers.get(0, "ext:victim"),
        None,
        "key outlived close() on node 0 (PTTL {pttl} ms; close took {:?})",
        closing.elapsed()
    );
}

/// Node 0 out of memory (noeviction): an acquire fails there, a release still runs (DEL is
/// allowed), also when it shares a batch with an acquire queued before it: the acquire's OOM
/// is its own error (it once aborted the whole script, and the releases in it were lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquires_error_never_fails_a_release_in_its_batch() {
    const N: usize = 200;
    let servers = Arc::new(Servers::start(3));
    let redlock = servers.one_attempt(Duration::from_secs(2));
    support::warm_up(&redlock).await;
    let mut held = Vec::new();
    for i in 0..=N {
        held.push(
            redlock
                .acquire(&[format!("oom:held:{i}")], TTL)
                .await
                .expect("acquire"),
        );
    }
    assert!(
        eventually(|| servers
            .keys(0)
            .iter()
            .filter(|k| k.starts_with("oom:held:"))
            .count()
            == N + 1)
        .await
    );
    let _: () = servers.cmd(0, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let _: () = servers.cmd(0, &["CONFIG", "SET", "maxmemory", "1"]);
    // Control: under OOM a release alone still runs on node 0, and an acquire alone fails.
    let alone = redlock
        .acquire(&["oom:alone"], TTL)
        .await
        .expect("nodes 1 and 2 grant");
    assert_eq!(servers.get(0, "oom:alone"), None, "node 0 refuses writes");
    let control = held.pop().expect("a held lock");
    let control_key = control.resources()[0].clone();
    control.release().await.expect("release alone");
    assert!(
        eventually(|| servers.get(0, &control_key).is_none()).await,
        "a release alone runs on node 0 under OOM"
    );
    alone.release().await.expect("release");
    // A call in flight on node 0 (paused for a moment), so that everything below waits
    // behind it and goes in the next batch, acquires and releases interleaved.
    servers.pause(0);
    let blocker = {
        let r = redlock.clone();
        tokio::spawn(async move { r.try_acquire(&["oom:blocker"], TTL).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    enum Outcome {
        Acquired(Result<redfence::Lock, Error>),
        Released(Result<(), Error>),
    }
    let mut ops: Vec<futures::future::BoxFuture<'static, Outcome>> = Vec::new();
    for (i, lock) in held.into_iter().enumerate() {
        let r = redlock.clone();
        ops.push(Box::pin(async move {
            Outcome::Acquired(r.acquire(&[format!("oom:new:{i}")], TTL).await)
        }));
        ops.push(Box::pin(
            async move { Outcome::Released(lock.release().await) },
        ));
    }
    let resumer = {
        let servers = Arc::clone(&servers);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(400));
            servers.resume(0);
        })
    };
    let outcomes = join_all(ops).await;
    resumer.join().expect("resumer");
    if let Ok(Ok(lock)) = blocker.await {
        let _ = lock.release().await;
    }
    let mut new_locks = Vec::new();
    for outcome in outcomes {
        match outcome {
            Outcome::Acquired(Ok(lock)) => new_locks.push(lock),
            Outcome::Acquired(Err(err)) => panic!("acquire: {err}"),
            Outcome::Released(r) => r.expect("a majority released"),
        }
    }
    join_all(new_locks.into_iter().map(|l| l.release())).await;
    let _: () = servers.cmd(0, &["CONFIG", "SET", "maxmemory", "0"]);
    redlock.close().await;
    let left: Vec<String> = servers
        .keys(0)
        .into_iter()
        .filter(|k| k.starts_with("oom:held:"))
        .collect();
    assert!(
        left.is_empty(),
        "{} released locks' keys outlived close() on node 0, e.g. {:?}",
        left.len(),
        &left[..left.len().min(3)]
    );
}

/// A burst of 10,000 concurrent acquisitions on healthy nodes, with the default settings:
/// every one granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_ten_thousand_is_all_granted() {
    const BURST: usize = 10_000;
    let servers = Servers::start(3);
    let redlock = servers.redlock();
    support::warm_up(&redlock).await;
    let results = join_all((0..BURST).map(|i| {
        let redlock = redlock.clone();
        async move { redlock.acquire(&[format!("burst10k:{i}")], TTL).await }
    }))
    .await;
    let mut failed = Vec::new();
    let mut locks = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(lock) => locks.push(lock),
            Err(err) => failed.push((i, err.to_string())),
        }
    }
    join_all(locks.into_iter().map(|l| l.release())).await;
    redlock.close().await;
    assert!(
        failed.is_empty(),
        "{} of {BURST} failed, e.g. {:?}",
        failed.len(),
        &failed[..failed.len().min(2)]
    );
}

/// A node's queue full (the node hung, this client busy): a lock's release submitted then waits
/// for room instead of failing with `Overloaded` (it once was dropped, and its key outlived
/// `close()` there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_finds_a_full_queue_is_not_lost() {
    // (FILL=1000 is the control: with room in the queue the release lands.)
    let fill_count: usize = std::env::var("FILL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(66_600);
    let servers = Arc::new(Servers::start(3));
    let redlock = servers.one_attempt(Duration::from_secs(20));
    support::warm_up(&redlock).await;
    let lock = redlock
        .acquire(&["full:victim"], TTL)
        .await
        .expect("acquire");
    assert!(eventually(|| servers.get(0, "full:victim").is_some()).await);
    servers.pause(0);
    // Node 0's queue fills up behind a call that hangs.
    let fill: Vec<_> = (0..fill_count)
        .map(|_| {
            let r = redlock.clone();
            tokio::spawn(async move { r.try_acquire(&["full:fill"], TTL).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let released = lock.release().await;
    servers.resume(0);
    let mut overloaded = 0;
    for task in fill {
        match task.await.expect("task") {
            Ok(lock) => {
                let _ = lock.release().await;
            }
            Err(Error::Overloaded { .. }) => overloaded += 1,
            Err(_) => {}
        }
    }
    tokio::time::timeout(Duration::from_secs(90), redlock.close())
        .await
        .expect("close returns");
    eprintln!("release: {released:?}; fill attempts overloaded: {overloaded}");
    assert_eq!(
        servers.get(0, "full:victim"),
        None,
        "the released lock's key outlived close() on node 0 (PTTL {} ms)",
        servers.pttl(0, "full:victim")
    );
}
