//! The counting semaphore (K slots, each a Redlock mutex) against real redis-server processes.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redfence::{Error, InvalidInput, MAX_PERMITS, Permit, Redlock};
use support::{PATIENT, Servers, TestRedlock, eventually};
use tokio::task::JoinHandle;

const TTL: Duration = Duration::from_secs(5);
/// Permits held for a whole test.
const LONG: Duration = Duration::from_secs(60);

/// The permit a spawned acquisition got, within `limit`; `what` says what the test waited for.
async fn served(task: JoinHandle<Result<Permit, Error>>, limit: Duration, what: &str) -> Permit {
    tokio::time::timeout(limit, task)
        .await
        .unwrap_or_else(|_| panic!("{what} (not within {limit:?})"))
        .expect("task")
        .expect("acquire")
}

/// An acquisition that gave up, `started` ago, did so no earlier than `early` and before
/// `late`.
fn gave_up_between(started: Instant, early: Duration, late: Duration) {
    let took = started.elapsed();
    assert!(took >= early, "gave up early: {took:?}");
    assert!(took < late, "gave up late: {took:?}");
}

fn invalid<T: std::fmt::Debug>(result: Result<T, Error>) -> InvalidInput {
    match result {
        Err(Error::InvalidInput(e)) => e,
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

/// How many clients are connected to server `i` (the inspecting one included).
fn clients(servers: &Servers, i: usize) -> usize {
    let info: String = servers.cmd(i, &["INFO", "clients"]);
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("connected_clients")
}

/// The interleaving that breaks a "set of holders per node, capped at K" design: 3 nodes,
/// K = 2, holder A on nodes {0, 1} and holder B on nodes {1, 2}. Nodes 0 and 2 each see one
/// holder, so a set-based design would grant C there (a majority with room): three holders.
/// With slots, A holds slot 0 and B slot 1 on those nodes; C finds no slot free on a
/// majority and is refused.
#[tokio::test]
async fn a_third_holder_is_refused_where_a_set_per_node_would_have_room() {
    let servers = Servers::start(3);
    let redlock = servers.patient();
    let sem = redlock.semaphore("jobs", 2).expect("semaphore");
    let slot0 = &sem.slots()[0];
    let slot1 = &sem.slots()[1];
    for node in [0, 1] {
        let _: () = servers.cmd(node, &["SET", slot0, "token-a", "PX", "30000"]);
    }
    for node in [1, 2] {
        let _: () = servers.cmd(node, &["SET", slot1, "token-b", "PX", "30000"]);
    }
    // Each of nodes 0 and 2 holds a single holder's key: room for one more "in a set sense".
    for node in [0, 2] {
        let held = servers
            .keys(node)
            .into_iter()
            .filter(|k| k.contains(":semaphore:slot:"))
            .count();
        assert_eq!(held, 1, "node {node} sees one holder");
    }
    match sem.try_acquire(TTL).await {
        Err(Error::Contended { .. }) => {}
        other => panic!("C must be refused while A and B hold, got {other:?}"),
    }
    // C left nothing behind: each slot key is still A's or B's where it was, absent elsewhere.
    assert_eq!(servers.get(0, slot0).as_deref(), Some("token-a"));
    assert_eq!(servers.get(2, slot1).as_deref(), Some("token-b"));
    assert!(
        eventually(|| servers.get(0, slot1).is_none() && servers.get(2, slot0).is_none()).await
    );

    // Two real holders the same way: the third is refused, the first release lets it in.
    // (The keys go, not the servers' memory: a flush would quarantine them.)
    for i in 0..3 {
        for key in servers.keys(i) {
            let _: () = servers.cmd(i, &["DEL", &key]);
        }
    }
    let a = sem.acquire(TTL).await.expect("A");
    let b = sem.acquire(TTL).await.expect("B");
    assert_ne!(a.slot(), b.slot());
    assert!(matches!(
        sem.try_acquire(TTL).await,
        Err(Error::Contended { .. })
    ));
    let freed = a.slot();
    a.release().await.expect("release A");
    let c = sem.try_acquire(TTL).await.expect("C after A's release");
    assert_eq!(c.slot(), freed);
    drop((b, c));
}

/// 16 tasks, K = 3: each records the window in which its permit was valid, from when the
/// acquisition returned to the earlier of its validity's end and the start of its release.
/// No instant is inside more than K windows, and every task got its permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_k_valid_permits_at_one_instant() {
    at_most_k_permits(false).await;
}

/// The same in fair mode, where the waiters take turns through the semaphore's line and its
/// holder alone goes round the slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_k_valid_permits_in_fair_mode() {
    at_most_k_permits(true).await;
}

async fn at_most_k_permits(fair: bool) {
    const K: u32 = 3;
    const ROUNDS: usize = 5;
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .fair(fair)
        .node_timeout(PATIENT)
        .retry_count(10_000)
        .retry_delay(Duration::from_millis(2))
        .retry_jitter(Duration::from_millis(2))
        .build()
        .expect("config");
    let sem = redlock.semaphore("workers", K).expect("semaphore");
    let windows: Arc<Mutex<Vec<(Instant, Instant, u32)>>> = Arc::default();
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (sem, windows) = (sem.clone(), Arc::clone(&windows));
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let permit = sem.acquire(TTL).await.expect("acquire");
                    let start = Instant::now();
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    let end = Instant::now().min(permit.expires_at());
                    windows
                        .lock()
                        .expect("windows")
                        .push((start, end, permit.slot()));
                    permit.release().await.expect("release");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let windows = windows.lock().expect("windows").clone();
    assert_eq!(windows.len(), 16 * ROUNDS, "every task got every permit");
    let most = support::most_at_once(windows.iter().map(|&(start, end, _)| (start, end)));
    assert!(most <= K as usize, "{most} permits valid at one instant");
    assert!(
        most >= 2,
        "the test never ran permits side by side ({most})"
    );
    // Two windows on one slot never overlap.
    for (i, a) in windows.iter().enumerate() {
        for b in &windows[i + 1..] {
            if a.2 == b.2 {
                assert!(a.1 <= b.0 || b.1 <= a.0, "slot {} held twice at once", a.2);
            }
        }
    }
}

#[tokio::test]
async fn a_client_with_another_number_of_permits_is_refused() {
    let servers = Servers::start(3);
    let redlock = servers.patient();
    let two = redlock.semaphore("pool", 2).expect("semaphore");
    let held = two.acquire(TTL).await.expect("first client");
    assert_eq!(servers.get(0, "pool:semaphore:size").as_deref(), Some("2"));
    let size_ttl = servers.pttl(0, "pool:semaphore:size");
    assert!(
        size_ttl > 3_600_000,
        "the size key expires, late: {size_ttl}"
    );

    let other = servers.patient();
    let three = other.semaphore("pool", 3).expect("semaphore");
    // The size is claimed beside the first tries of the slots: a refused client may take a
    // free slot meanwhile (slot 2, which only it has, or the first client's other one), and
    // must release it before it fails. Several times, so that some refusals do take one.
    let free: Vec<String> = (0..3)
        .filter(|&slot| slot != held.slot())
        .map(|slot| format!("pool:semaphore:slot:{slot}"))
        .collect();
    for _ in 0..10 {
        match three.acquire(TTL).await {
            Err(Error::SemaphoreSize { name, ours, stored }) => {
                assert_eq!((name.as_str(), ours, stored.as_str()), ("pool", 3, "2"));
            }
            other => panic!("expected SemaphoreSize, got {other:?}"),
        }
        assert!(
            eventually(|| free
                .iter()
                .all(|slot| servers.on_every_node(slot, Option::is_none)))
            .await,
            "a refused client left a slot held"
        );
    }
    // The stored size is unchanged.
    assert!(servers.on_every_node("pool:semaphore:size", |size| size.as_deref() == Some("2")));
    let message = three
        .try_acquire(TTL)
        .await
        .expect_err("refused")
        .to_string();
    assert!(message.contains('2') && message.contains('3'), "{message}");
    held.release().await.expect("release");
}

#[tokio::test]
async fn a_client_refused_after_it_took_a_slot_releases_the_slot_first() {
    let servers = Servers::start(3);
    // Another number of permits, stored as a long string of digits. (Its claim's reply once
    // carried those megabytes, which made sure the refused client's first try of a slot was
    // granted before the refusal arrived; now the claim reads no more than a number's worth
    // and answers with the size, so either may come first: both must leave no slot held.)
    let stored = "7".repeat(16 << 20);
    for node in 0..3 {
        let _: () = redis::cmd("SET")
            .arg("slow:semaphore:size")
            .arg(&stored)
            .query(&mut servers.conn(node))
            .expect("SET");
    }
    let redlock = servers.patient();
    let three = redlock.semaphore("slow", 3).expect("semaphore");
    let slots: Vec<String> = three.slots().to_vec();
    // A permit TTL far beyond the wait below: a slot left held would still be there.
    let ttl = Duration::from_secs(60);
    for _ in 0..3 {
        match three.acquire(ttl).await {
            Err(Error::SemaphoreSize { ours, stored, .. }) => {
                assert_eq!((ours, stored.as_str()), (3, "<16777216 bytes>"));
            }
            other => panic!("expected SemaphoreSize, got {other:?}"),
        }
        // Released (awaited when the slot was granted first; in the background when the
        // refusal came first and the try was dropped half-way, as any cancelled attempt).
        assert!(
            eventually(|| slots
                .iter()
                .all(|slot| servers.on_every_node(slot, Option::is_none)))
            .await,
            "a refused client left a slot held"
        );
    }
}

#[tokio::test]
async fn bad_sizes_names_and_ttls_are_refused_before_any_traffic() {
    let servers = Servers::start(1);
    let before = clients(&servers, 0);
    let redlock = Redlock::builder()
        .node(servers.url(0))
        .build()
        .expect("config");
    assert_eq!(
        invalid(redlock.semaphore("jobs", 0)),
        InvalidInput::ZeroPermits
    );
    assert_eq!(
        invalid(redlock.semaphore("jobs", MAX_PERMITS + 1)),
        InvalidInput::TooManyPermits {
            permits: MAX_PERMITS + 1,
            max: MAX_PERMITS
        }
    );
    assert_eq!(
        invalid(redlock.semaphore("", 3)),
        InvalidInput::EmptyResource { index: 0 }
    );
    let long = "x".repeat(redfence::MAX_RESOURCE_LEN);
    assert!(matches!(
        invalid(redlock.semaphore(&long, 3)),
        InvalidInput::ResourceTooLong { .. }
    ));
    let sem = redlock.semaphore("jobs", MAX_PERMITS).expect("at the cap");
    assert!(matches!(
        invalid(sem.acquire(Duration::ZERO).await),
        InvalidInput::ZeroTtl { .. }
    ));
    assert!(matches!(
        invalid(
            sem.using(Duration::from_millis(100), |_| async {
                Ok::<(), Error>(())
            })
            .await
        ),
        InvalidInput::TtlNotAboveThreshold { .. }
    ));
    assert_eq!(clients(&servers, 0), before, "no connection was made");
    assert!(servers.keys(0).is_empty());
}

#[tokio::test]
async fn a_release_frees_a_slot_for_a_waiter() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .node_timeout(PATIENT)
        .retry_count(10_000)
        .build()
        .expect("config");
    let sem = redlock.semaphore("pool", 2).expect("semaphore");
    let a = sem.acquire(TTL).await.expect("a");
    let b = sem.acquire(TTL).await.expect("b");
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire(TTL).await }
    });
    // Still waiting after several retry rounds.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter got a permit while two were held"
    );
    let freed = b.slot();
    b.release().await.expect("release");
    let permit = served(
        waiter,
        Duration::from_secs(10),
        "the waiter gets the freed slot in time",
    )
    .await;
    assert_eq!(permit.slot(), freed);
    assert_ne!(permit.slot(), a.slot());
    drop(a);
    permit.release().await.expect("release");
}

#[tokio::test]
async fn using_extends_the_permit_and_signals_its_loss() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .node_timeout(PATIENT)
        .automatic_extension_threshold(Duration::from_millis(200))
        .build()
        .expect("config");
    let sem = redlock.semaphore("pool", 2).expect("semaphore");
    let ttl = Duration::from_millis(800);

    // Kept well past its TTL.
    let kept = sem
        .using(ttl, |signal| async move {
            let until = Instant::now() + ttl * 3;
            while Instant::now() < until {
                signal.check()?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok::<_, Error>(signal.resources()[0].clone())
        })
        .await
        .expect("kept alive");
    assert!(kept.starts_with("pool:semaphore:slot:"), "{kept}");
    assert!(eventually(|| servers.on_every_node(&kept, Option::is_none)).await);

    // Lost: another owner holds its slot's keys (a deleted key would be set again by the
    // next extension: extensions repair); the signal aborts.
    let lost = sem
        .using(ttl, |signal| {
            let servers = &servers;
            async move {
                let slot = signal.resources()[0].clone();
                for node in 0..3 {
                    let _: () = servers.cmd(node, &["SET", &slot, "someone-else", "PX", "60000"]);
                }
                let aborted = tokio::time::timeout(ttl * 4, signal.aborted()).await;
                Ok::<_, Error>(aborted.is_ok())
            }
        })
        .await
        .expect("scope");
    assert!(lost, "the signal aborts once the slot is lost");
}

/// Fencing tokens are per slot: successive holders of one slot get increasing fences.
#[tokio::test]
async fn fences_increase_per_slot() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .node_timeout(PATIENT)
        .fencing(redfence::MemoryCounter::new())
        .build()
        .expect("config");
    let sem = redlock.semaphore("fenced", 1).expect("semaphore");
    let first = sem.acquire(TTL).await.expect("first");
    let one = first.fence().expect("a fence");
    assert_eq!(first.lock().resources(), ["fenced:semaphore:slot:0"]);
    first.release().await.expect("release");
    let second = sem.acquire(TTL).await.expect("second");
    let two = second.fence().expect("a fence");
    assert!(two > one, "{two} after {one}");
    second.release().await.expect("release");
}

/// With every permit held, `acquire` gives up at `acquire_timeout` (and `try_acquire` at
/// once), saying the slots were contended.
#[tokio::test]
async fn acquire_gives_up_at_the_acquire_timeout() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .node_timeout(PATIENT)
        .retry_count(10_000)
        .acquire_timeout(Duration::from_millis(1500))
        .build()
        .expect("config");
    let sem = redlock.semaphore("full", 2).expect("semaphore");
    let held = [
        sem.acquire(TTL).await.expect("a"),
        sem.acquire(TTL).await.expect("b"),
    ];
    let started = Instant::now();
    match sem.acquire(TTL).await {
        Err(Error::AcquireTimeout { last, attempts, .. }) => {
            assert!(attempts >= 2, "every slot was tried: {attempts}");
            assert!(
                matches!(last.as_deref(), Some(Error::Contended { .. })),
                "{last:?}"
            );
        }
        other => panic!("expected AcquireTimeout, got {other:?}"),
    }
    gave_up_between(
        started,
        Duration::from_millis(1500),
        Duration::from_secs(10),
    );
    assert!(matches!(
        sem.try_acquire(TTL).await,
        Err(Error::Contended { .. })
    ));
    drop(held);
}

/// In fair mode a waiter behind the line's holder gives up at the acquire timeout (on the
/// line's name), and leaves its place in the line's queue on every node.
#[tokio::test]
async fn a_fair_waiter_gives_up_at_the_acquire_timeout_and_leaves_the_line() {
    let servers = Servers::start(3);
    let fair = |timeout| {
        servers
            .builder()
            .fair(true)
            .node_timeout(PATIENT)
            .retry_count(10_000)
            .acquire_timeout(timeout)
            .build()
            .expect("config")
    };
    let (first, second) = (fair(LONG), fair(Duration::from_millis(1500)));
    let held = first
        .semaphore("line-timeout", 1)
        .expect("semaphore")
        .acquire(TTL)
        .await
        .expect("the permit");
    // A waiter of the first client takes the line and goes round the full slot.
    let going_round = tokio::spawn({
        let sem = first.semaphore("line-timeout", 1).expect("semaphore");
        async move { sem.acquire(TTL).await }
    });
    assert!(
        eventually(|| servers.on_every_node("line-timeout:semaphore:line", Option::is_some)).await,
        "the first waiter holds the line"
    );
    let queue = "line-timeout:semaphore:line:redfence:queue";
    let before: Vec<i64> = (0..3).map(|n| servers.cmd(n, &["ZCARD", queue])).collect();
    let started = Instant::now();
    let sem = second.semaphore("line-timeout", 1).expect("semaphore");
    match sem.acquire(TTL).await {
        Err(Error::AcquireTimeout { last, .. }) => match last.as_deref() {
            Some(Error::Contended { resources, .. }) => {
                assert_eq!(*resources, ["line-timeout:semaphore:line"]);
            }
            other => panic!("the line held it up, not {other:?}"),
        },
        other => panic!("expected AcquireTimeout, got {other:?}"),
    }
    // The line's waiter gives up when its next retry delay (10-20 ms here) would end past the
    // timeout, so up to one delay early.
    gave_up_between(
        started,
        Duration::from_millis(1400),
        Duration::from_secs(10),
    );
    // Its place is left on every node: no more places than before it came.
    assert!(
        eventually(|| (0..3).all(|n| servers.cmd::<i64>(n, &["ZCARD", queue]) <= before[n])).await,
        "the waiter left a place in the line's queue"
    );
    held.release().await.expect("release");
    let permit = served(
        going_round,
        Duration::from_secs(30),
        "the first waiter is served",
    )
    .await;
    permit.release().await.expect("release");
}

/// `inspect` shows who holds which slot; a dropped permit frees its slot in the background;
/// slot and size keys go under the key prefix.
#[tokio::test]
async fn inspect_shows_the_holders_and_a_dropped_permit_frees_its_slot() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .node_timeout(PATIENT)
        .key_prefix("app:")
        .build()
        .expect("config");
    let sem = redlock.semaphore("pool", 3).expect("semaphore");
    let a = sem.acquire(TTL).await.expect("a");
    let b = sem.acquire(TTL).await.expect("b");
    let report = sem.inspect().await.expect("inspect");
    let views = report.views();
    assert_eq!(views.len(), 3);
    for (slot, view) in views.iter().enumerate() {
        let holder = view.owner().map(|h| h.token_prefix.clone());
        let expected = [&a, &b]
            .into_iter()
            .find(|p| p.slot() as usize == slot)
            .map(|p| p.token()[..redfence::TOKEN_PREFIX_LEN].to_owned());
        assert_eq!(holder, expected, "slot {slot}: {view}");
    }
    let key = format!("app:pool:semaphore:slot:{}", a.slot());
    assert!(servers.on_every_node(&key, |value| value.as_deref() == Some(a.token())));
    assert_eq!(
        servers.get(0, "app:pool:semaphore:size").as_deref(),
        Some("3")
    );

    drop(a);
    assert!(
        eventually(|| servers.on_every_node(&key, Option::is_none)).await,
        "a dropped permit is released in the background"
    );
    b.release().await.expect("release");
}

/// A permit is granted with one node down (a majority is enough), and the size check too.
#[tokio::test]
async fn a_permit_is_granted_with_a_minority_down() {
    let mut servers = Servers::start(3);
    servers.kill(2);
    let redlock = servers.patient();
    let sem = redlock.semaphore("pool", 2).expect("semaphore");
    let permit = sem.acquire(TTL).await.expect("a majority is up");
    let key = format!("pool:semaphore:slot:{}", permit.slot());
    assert!((0..2).all(|i| servers.get(i, &key).as_deref() == Some(permit.token())));
    permit.release().await.expect("release");
}

/// Waiting for a permit is not polling: with a 30 s retry delay, a waiter gets the slot
/// another client released (announced by the nodes) and then the one a permit of its own
/// process released (woken in process) within seconds, and two waiters of one process are
/// served in the order they came.
#[tokio::test]
async fn waiters_are_woken_by_a_release_and_served_in_order() {
    let servers = Servers::start(3);
    let (ours, theirs) = (servers.slow_retries(), servers.slow_retries());
    let sem = ours.semaphore("woken", 1).expect("semaphore");
    let other = theirs.semaphore("woken", 1).expect("semaphore");
    let held = other.acquire(TTL).await.expect("the other client's permit");
    let slot = sem.slots()[0].clone();
    let before: Vec<i64> = (0..3)
        .map(|i| servers.release_subscribers(i, &slot))
        .collect();
    let first = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire(TTL).await }
    });
    // The first waiter went round once and waits (its try marked the slot).
    assert!(
        eventually(|| {
            let mark = format!("{slot}:redfence:waiting");
            servers.keys(0).contains(&mark)
        })
        .await,
        "the first waiter tried the slot"
    );
    // It listens on every node before the release (a message sent earlier is missed, and the
    // waiter would poll: here after its 30 s retry delay).
    assert!(
        eventually(|| (0..3).all(|i| servers.release_subscribers(i, &slot) > before[i])).await,
        "the first waiter subscribed"
    );
    let second = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire(TTL).await }
    });
    // (The second waits in the process's line behind the first, which keeps its turn.)
    held.release().await.expect("release");
    let permit = served(
        first,
        Duration::from_secs(10),
        "the first waiter is woken, not left to its 30 s retry delay",
    )
    .await;
    assert!(!second.is_finished(), "one permit, one holder");
    permit.release().await.expect("release");
    let permit = served(
        second,
        Duration::from_secs(10),
        "the second waiter is woken by its process's release",
    )
    .await;
    permit.release().await.expect("release");
}

/// Fair mode across processes: eight waiters, each with its own client (as eight processes)
/// and starting once the one before has its place in the semaphore's line on every node, get
/// their permits in that order. They poll rarely (every 400 ms), so the order comes from the
/// line: its holder goes round the slots, the others wait their turn in the nodes' queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mode_serves_waiters_of_several_processes_in_arrival_order() {
    fn micros_since_epoch() -> u128 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_micros()
    }
    let servers = Servers::start(3);
    let clients: Vec<Redlock> = (0..8)
        .map(|_| servers.fair(Duration::from_millis(400)))
        .collect();
    for client in &clients {
        support::warm_up(client).await;
    }
    // Both permits held by a client outside fair mode: one for the whole test, one released
    // when every waiter is in line.
    let other = servers.patient().semaphore("fair", 2).expect("semaphore");
    let kept = other.acquire(LONG).await.expect("first permit");
    let first = other.acquire(LONG).await.expect("second permit");
    let queue = "fair:semaphore:line:redfence:queue";
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    // Queue places are scored by the waiter's wall clock when it started waiting (µs); the
    // line's holder may drop out of the queue once its place's lease ends, so count only the
    // places taken after waiter 0 held the line.
    let mut since = String::new();
    for (i, client) in clients.iter().enumerate() {
        let sem = client.semaphore("fair", 2).expect("semaphore");
        let order = Arc::clone(&order);
        waiters.push(tokio::spawn(async move {
            let permit = sem.acquire(TTL).await.expect("every waiter gets a permit");
            order.lock().expect("order").push(i);
            tokio::time::sleep(Duration::from_millis(5)).await;
            permit.release().await.expect("release");
        }));
        if i == 0 {
            // Waiter 0 takes the line and goes round the full slots.
            assert!(
                eventually(|| servers.on_every_node("fair:semaphore:line", Option::is_some)).await,
                "waiter 0 holds the line"
            );
            since = format!("{}", micros_since_epoch());
            continue;
        }
        // Waiter i has its place on every node before waiter i + 1 starts. Its place is
        // taken when it first asks for the line, after a round trip to claim the size, so
        // waiters started together could take theirs in any order.
        let in_line = || {
            (0..3).all(|n| servers.cmd::<i64>(n, &["ZCOUNT", queue, &since, "+inf"]) == i as i64)
        };
        assert!(
            eventually(in_line).await,
            "waiter {i} did not take its place"
        );
    }
    first.release().await.expect("release");
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(60), waiter)
            .await
            .expect("the waiters are served in time")
            .expect("waiter");
    }
    assert_eq!(*order.lock().expect("order"), (0..8).collect::<Vec<_>>());
    kept.release().await.expect("release");
    // The line was left (its queue too) and every slot released: only the size key is left
    // on each node, and waiting marks, which expire on their own (a line granted by a
    // majority while a straggler refused it leaves the straggler's mark).
    let left = |n| {
        let mut keys = servers.keys(n);
        keys.retain(|key| !key.ends_with(":redfence:waiting"));
        keys
    };
    assert!(
        eventually(|| (0..3).all(|n| left(n) == ["fair:semaphore:size"])).await,
        "keys left: {:?}",
        (0..3).map(left).collect::<Vec<_>>()
    );
}

/// In fair mode a `try_acquire` respects the line: with a waiter in line (here going round
/// the full slots), it is refused on the line's name, although a try of the slots alone
/// would have found none free either way; once nobody waits, it gets a free slot at once.
#[tokio::test]
async fn a_fair_try_acquire_does_not_pass_a_waiter_in_line() {
    let servers = Servers::start(3);
    let client = servers.fair(Duration::from_millis(50));
    let sem = client.semaphore("queued", 1).expect("semaphore");
    let held = sem.acquire(TTL).await.expect("the permit");
    // That acquisition gave its line up in the background: gone everywhere before the waiter
    // comes, so that the line seen next is the waiter's.
    assert!(
        eventually(|| servers.on_every_node("queued:semaphore:line", Option::is_none)).await,
        "the line was given up with the permit"
    );
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire(TTL).await }
    });
    assert!(
        eventually(|| servers.on_every_node("queued:semaphore:line", Option::is_some)).await,
        "the waiter holds the line"
    );
    match sem.try_acquire(TTL).await {
        Err(Error::Contended { resources, .. }) => {
            assert_eq!(resources, ["queued:semaphore:line"]);
        }
        other => panic!("a try passed the waiter in line: {other:?}"),
    }
    held.release().await.expect("release");
    let permit = served(waiter, Duration::from_secs(30), "the waiter is served").await;
    assert_eq!(permit.slot(), 0);
    permit.release().await.expect("release");
    // Nobody waits: a try gets the free slot.
    let permit = sem.try_acquire(TTL).await.expect("a free slot");
    permit.release().await.expect("release");
}
