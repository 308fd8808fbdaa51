//! `using()`: automatic extension, the abort signal, bounded renewal and release on every
//! exit path, against real redis-server processes.

mod support;

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use redfence::{
    Error, Event, InvalidInput, LossReason, Redlock, RedlockBuilder, RenewalLimit, Signal,
};
use support::{DEADLINE, Servers, TestRedlock, eventually};

const MS: Duration = Duration::from_millis(1);

/// A node timeout generous enough that a loaded machine never fails a healthy local node.
const PATIENT: Duration = Duration::from_millis(500);

/// A `Redlock` over every server with [`PATIENT`] node calls.
fn patient(servers: &Servers) -> Redlock {
    servers
        .builder()
        .node_timeout(PATIENT)
        .build()
        .expect("config")
}

/// Every event the hook received.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<Event>>>);

impl Events {
    fn all(&self) -> Vec<Event> {
        self.0.lock().expect("events").clone()
    }

    fn count(&self, pred: impl Fn(&Event) -> bool) -> usize {
        self.all().iter().filter(|e| pred(e)).count()
    }

    fn extended(&self) -> usize {
        self.count(|e| matches!(e, Event::Extended { .. }))
    }

    fn aborted(&self) -> usize {
        self.count(|e| matches!(e, Event::Aborted { .. }))
    }
}

/// Builds `builder` with a hook that records every event.
fn recorded(builder: RedlockBuilder) -> (Events, Redlock) {
    let events = Events::default();
    let sink = events.clone();
    let redlock = builder
        .on_event(move |e: &Event| sink.0.lock().expect("events").push(e.clone()))
        .build()
        .expect("config");
    (events, redlock)
}

/// Waits for the signal to abort (bounded), and returns why with the validity left then.
async fn abort_of(signal: &Signal) -> (Error, Duration) {
    let err = tokio::time::timeout(DEADLINE, signal.aborted())
        .await
        .expect("the signal aborts");
    (err, signal.remaining())
}

/// Waits until every node holds the token. A scope that ends within milliseconds of its
/// acquisition can otherwise race the acquire calls still in flight on the slowest nodes
/// (see `a_scope_that_ends_at_once_leaves_no_key`); tests of other things start from here.
async fn held_everywhere(servers: &Servers, signal: &Signal) {
    let all = 0..servers.len();
    let everywhere =
        eventually(|| servers.holders("job", signal.token(), all.clone()).len() == servers.len())
            .await;
    assert!(
        everywhere,
        "the token reached only nodes {:?}",
        servers.holders("job", signal.token(), all)
    );
}

#[tokio::test]
async fn a_routine_running_five_ttls_keeps_the_lock_throughout() {
    let servers = Servers::start(5);
    let ttl = Duration::from_secs(1);
    let (events, redlock) = recorded(
        servers
            .builder()
            .node_timeout(250 * MS)
            .automatic_extension_threshold(400 * MS),
    );
    let competitor = servers
        .builder()
        .node_timeout(250 * MS)
        .retry_count(0)
        .build()
        .expect("config");

    let started = Instant::now();
    let refused = redlock
        .using(&["job"], ttl, |signal| {
            let competitor = competitor.clone();
            async move {
                let mut refused = 0;
                while started.elapsed() < 5 * ttl {
                    tokio::time::sleep(100 * MS).await;
                    match competitor.try_acquire(&["job"], ttl).await {
                        Err(Error::Contended { .. }) => refused += 1,
                        other => panic!("competitor at {:?}: {other:?}", started.elapsed()),
                    }
                    signal.check()?;
                    assert!(signal.remaining() > Duration::ZERO);
                }
                // Extensions moved the expiry: far more than one TTL after the start.
                assert!(signal.remaining() > 100 * MS);
                Ok::<_, Error>(refused)
            }
        })
        .await
        .expect("using");
    // Free as soon as `using` returns.
    let lock = competitor
        .try_acquire(&["job"], ttl)
        .await
        .expect("free right after the routine");
    lock.release().await.expect("release");
    assert!(refused >= 25, "only {refused} competing attempts");
    assert!(events.extended() >= 5, "{:?}", events.all());
    assert_eq!(events.aborted(), 0, "{:?}", events.all());
}

#[tokio::test]
async fn killing_a_majority_aborts_before_the_lock_expires() {
    let mut servers = Servers::start(5);
    let (events, redlock) = recorded(servers.builder().node_timeout(200 * MS));
    let ttl = Duration::from_secs(2);
    let watch = events.clone();
    let killer = &mut servers;
    let (err, remaining, checked) = redlock
        .using(&["job"], ttl, |signal| async move {
            // Mid-routine, after the lock was renewed once.
            assert!(eventually(|| watch.extended() >= 1).await);
            for i in 0..3 {
                killer.kill(i);
            }
            let (err, remaining) = abort_of(&signal).await;
            Ok::<_, Error>((err, remaining, signal.check()))
        })
        .await
        .expect("using returns the routine's result");

    // Aborted while validity was left, with that validity in the reason: early, not late.
    assert!(remaining > Duration::ZERO, "aborted only after expiry");
    match &err {
        Error::LockLost {
            reason: LossReason::Unconfirmed {
                remaining: at_abort,
            },
            resources,
        } => {
            assert!(
                *at_abort > Duration::ZERO && *at_abort <= 500 * MS,
                "{at_abort:?}"
            );
            assert!(remaining <= *at_abort);
            assert_eq!(resources, &["job".to_string()]);
        }
        other => panic!("expected LockLost(Unconfirmed), got {other:?}"),
    }
    assert!(
        matches!(checked, Err(Error::LockLost { .. })),
        "{checked:?}"
    );

    // Every failed round reached the hook with the three dead nodes' errors.
    let failures: Vec<_> = events
        .all()
        .into_iter()
        .filter_map(|e| match e {
            Event::ExtensionFailed {
                error, remaining, ..
            } => Some((error, remaining)),
            _ => None,
        })
        .collect();
    let mut with_node_errors = 0;
    for (error, remaining) in &failures {
        match error {
            Error::QuorumUnreachable { errors, .. } => {
                let mut dead: Vec<_> = errors.iter().map(|e| e.index).collect();
                dead.sort();
                assert_eq!(dead, vec![0, 1, 2], "{error}");
                with_node_errors += 1;
            }
            // A round still running at the threshold is cut short (no node errors yet).
            Error::LockLost {
                reason: LossReason::Unconfirmed { .. },
                ..
            } => {}
            other => panic!("expected QuorumUnreachable, got {other:?}"),
        }
        assert!(*remaining > Duration::ZERO);
    }
    assert!(with_node_errors >= 1, "{failures:?}");
    assert_eq!(events.aborted(), 1);
    // The release reached only two nodes: reported, without hiding the routine's result.
    assert_eq!(
        events.count(|e| matches!(e, Event::ReleaseFailed { .. })),
        1
    );
    assert!(servers.keys(3).is_empty() && servers.keys(4).is_empty());
}

#[tokio::test]
async fn pausing_a_majority_longer_than_the_ttl_aborts_and_frees_the_lock() {
    let servers = Servers::start(5);
    let redlock = servers
        .builder()
        .node_timeout(200 * MS)
        .build()
        .expect("config");
    let ttl = Duration::from_secs(1);
    let pauser = &servers;
    let (err, remaining, paused_at) = redlock
        .using(&["job"], ttl, |signal| async move {
            for i in 0..3 {
                pauser.pause(i);
            }
            let paused_at = Instant::now();
            let (err, remaining) = abort_of(&signal).await;
            Ok::<_, Error>((err, remaining, paused_at))
        })
        .await
        .expect("using returns");
    assert!(
        matches!(
            err,
            Error::LockLost {
                reason: LossReason::Unconfirmed { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(remaining > Duration::ZERO);

    // Keep the majority paused for longer than the TTL, then resume it.
    tokio::time::sleep_until((paused_at + ttl + 200 * MS).into()).await;
    for i in 0..3 {
        servers.resume(i);
    }
    let other = servers
        .builder()
        .node_timeout(PATIENT)
        .retry_count(100)
        .build()
        .expect("config");
    let lock = other
        .acquire(&["job"], ttl)
        .await
        .expect("another owner acquires");
    assert!(servers.holders("job", lock.token(), 0..5).len() >= 3);
    lock.release().await.expect("release");
}

#[tokio::test]
async fn max_extensions_stops_renewal_and_aborts_with_renewal_limit() {
    let servers = Servers::start(5);
    let threshold = 300 * MS;
    let (events, redlock) = recorded(
        servers
            .builder()
            .node_timeout(250 * MS)
            .automatic_extension_threshold(threshold)
            .max_extensions(2),
    );
    let checker = &servers;
    let (err, remaining, extended_at_abort) = redlock
        .using(&["job"], Duration::from_secs(1), |signal| {
            let events = events.clone();
            async move {
                let (err, remaining) = abort_of(&signal).await;
                let extended = events.extended();
                // The routine keeps going: the lock expires on its own.
                assert!(eventually(|| (0..5).all(|i| checker.get(i, "job").is_none())).await);
                assert!(signal.is_aborted());
                Ok::<_, Error>((err, remaining, extended))
            }
        })
        .await
        .expect("using");
    assert!(
        matches!(
            err,
            Error::RenewalLimit {
                limit: RenewalLimit::Extensions(2),
                ..
            }
        ),
        "{err:?}"
    );
    // Aborted when the next extension was needed: below the threshold, before expiry.
    assert!(
        remaining > Duration::ZERO && remaining <= threshold,
        "{remaining:?}"
    );
    assert_eq!(extended_at_abort, 2);
    assert_eq!(events.extended(), 2, "{:?}", events.all());
    assert_eq!(
        events.count(|e| matches!(e, Event::ExtensionFailed { .. })),
        0
    );
}

#[tokio::test]
async fn max_hold_bounds_how_long_the_lock_lives() {
    let servers = Servers::start(5);
    let max_hold = Duration::from_secs(2);
    let (events, redlock) = recorded(
        servers
            .builder()
            .node_timeout(250 * MS)
            .automatic_extension_threshold(300 * MS)
            .max_hold(max_hold),
    );
    let checker = &servers;
    let started = Instant::now();
    let (err, gone_after) = redlock
        .using(&["job"], Duration::from_secs(1), |signal| async move {
            let (err, _) = abort_of(&signal).await;
            assert!(eventually(|| (0..5).all(|i| checker.get(i, "job").is_none())).await);
            Ok::<_, Error>((err, started.elapsed()))
        })
        .await
        .expect("using");
    assert!(
        matches!(
            err,
            Error::RenewalLimit {
                limit: RenewalLimit::Hold(h),
                ..
            } if h == max_hold
        ),
        "{err:?}"
    );
    assert!(events.extended() >= 1, "{:?}", events.all());
    // Renewed past one TTL, but gone (give or take polling) by max_hold.
    assert!(
        gone_after > Duration::from_secs(1) && gone_after < max_hold + Duration::from_secs(1),
        "keys lived {gone_after:?}"
    );
}

#[tokio::test]
async fn the_signal_aborts_before_max_hold_and_a_longer_ttl_is_refused() {
    let servers = Servers::start(3);
    let max_hold = 1_500 * MS;
    let redlock = servers
        .builder()
        .automatic_extension_threshold(300 * MS)
        .max_hold(max_hold)
        .build()
        .expect("config");
    // A first lease longer than max_hold: refused before any traffic, the routine never runs.
    let ran = AtomicBool::new(false);
    let err = redlock
        .using(&["job"], Duration::from_secs(3), |_| async {
            ran.store(true, Ordering::SeqCst);
            Ok::<_, Error>(())
        })
        .await
        .expect_err("ttl above max_hold");
    assert!(
        matches!(
            err,
            Error::InvalidInput(InvalidInput::TtlAboveMaxHold { .. })
        ),
        "{err:?}"
    );
    assert!(!ran.load(Ordering::SeqCst));
    assert!(servers.keys(0).is_empty());
    // Within the bound: the signal aborts before max_hold has passed, never after.
    let started = Instant::now();
    let aborted_after = redlock
        .using(&["job"], Duration::from_secs(1), |signal| async move {
            let (err, _) = abort_of(&signal).await;
            assert!(matches!(err, Error::RenewalLimit { .. }), "{err:?}");
            Ok::<_, Error>(started.elapsed())
        })
        .await
        .expect("using");
    assert!(aborted_after < max_hold, "aborted after {aborted_after:?}");
}

#[tokio::test]
async fn a_panicking_routine_releases_the_lock_then_propagates() {
    let servers = Servers::start(5);
    let redlock = patient(&servers);
    let checker = &servers;
    let outcome =
        AssertUnwindSafe(
            redlock.using(&["job"], Duration::from_secs(10), |signal| async move {
                held_everywhere(checker, &signal).await;
                if signal.remaining() > Duration::ZERO {
                    panic!("routine panicked on purpose");
                }
                Ok::<(), Error>(())
            }),
        )
        .catch_unwind()
        .await;
    let panic = outcome.expect_err("the panic propagates");
    assert_eq!(
        panic.downcast_ref::<&str>(),
        Some(&"routine panicked on purpose")
    );
    // Released on every node before the panic resumed.
    for i in 0..5 {
        assert!(
            servers.keys(i).is_empty(),
            "node {i}: {:?}",
            servers.keys(i)
        );
    }
}

#[tokio::test]
async fn a_panic_in_a_spawned_scope_is_a_join_error_and_releases() {
    let servers = Arc::new(Servers::start(3));
    let redlock = patient(&servers);
    let checker = Arc::clone(&servers);
    let task = tokio::spawn(async move {
        redlock
            .using(&["job"], Duration::from_secs(10), |signal| async move {
                held_everywhere(&checker, &signal).await;
                let fail = true;
                if fail {
                    panic!("boom");
                }
                Ok::<(), Error>(())
            })
            .await
    });
    let err = task.await.expect_err("the task panicked");
    assert!(err.is_panic());
    for i in 0..3 {
        assert!(servers.keys(i).is_empty(), "node {i}");
    }
}

#[tokio::test]
async fn dropping_the_using_future_releases_the_lock_promptly() {
    let servers = Servers::start(5);
    let redlock = patient(&servers);
    let checker = &servers;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let token = tokio::select! {
        result = redlock.using(&["job"], Duration::from_secs(10), |signal| async move {
            held_everywhere(checker, &signal).await;
            let _ = started_tx.send(signal.token().to_owned());
            std::future::pending::<Result<(), Error>>().await
        }) => panic!("the routine never returns: {result:?}"),
        token = started_rx => token.expect("the routine started"),
    };
    // The `using` future is dropped here, mid-routine.
    let dropped = Instant::now();
    assert_eq!(servers.holders("job", &token, 0..5).len(), 5);
    assert!(eventually(|| (0..5).all(|i| servers.get(i, "job").is_none())).await);
    let took = dropped.elapsed();
    assert!(took < Duration::from_secs(2), "released after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_scopes_all_keep_their_locks() {
    let servers = Servers::start(5);
    // A 1 s TTL leaves a 244 ms window for extension rounds before the 500 ms threshold:
    // a node timeout well inside it leaves room for retries when the machine is busy.
    let (events, redlock) = recorded(servers.builder().node_timeout(100 * MS));
    let mut conns = Vec::new();
    for url in servers.urls() {
        let client = redis::Client::open(url).expect("url");
        conns.push(
            client
                .get_multiplexed_async_connection()
                .await
                .expect("connect"),
        );
    }
    let conns = Arc::new(conns);
    // Warm connections and scripts, as in a running service: the test is about keeping 200
    // locks alive, not about 200 cold acquisitions racing to load the scripts.
    redlock
        .using(&["warm"], Duration::from_secs(1), |_| async {
            Ok::<_, Error>(())
        })
        .await
        .expect("warm-up");
    let tasks: Vec<_> = (0..200)
        .map(|n| {
            let redlock = redlock.clone();
            let conns = Arc::clone(&conns);
            tokio::spawn(async move {
                let key = format!("job:{n}");
                let resource = key.clone();
                redlock
                    .using(&[resource], Duration::from_secs(1), |signal| async move {
                        let started = Instant::now();
                        while started.elapsed() < Duration::from_secs(3) {
                            tokio::select! {
                                err = signal.aborted() => return Err(err),
                                () = tokio::time::sleep(100 * MS) => {}
                            }
                        }
                        signal.check()?;
                        let mut holders = 0;
                        for conn in conns.iter() {
                            let value: Option<String> = redis::cmd("GET")
                                .arg(&key)
                                .query_async(&mut conn.clone())
                                .await
                                .expect("GET");
                            if value.as_deref() == Some(signal.token()) {
                                holders += 1;
                            }
                        }
                        Ok(holders)
                    })
                    .await
            })
        })
        .collect();
    // Collect every outcome first: one failure must not take the servers down under the rest.
    let mut failures = Vec::new();
    for (n, task) in tasks.into_iter().enumerate() {
        match task.await.expect("task") {
            Ok(holders) if holders >= 3 => {}
            Ok(holders) => failures.push(format!("job:{n}: token on {holders} node(s)")),
            Err(err) => failures.push(format!("job:{n}: {err}")),
        }
    }
    let failed_rounds: Vec<String> = events
        .all()
        .iter()
        .filter_map(|e| match e {
            Event::ExtensionFailed {
                error, remaining, ..
            } => Some(format!("{remaining:?} left: {error}")),
            _ => None,
        })
        .take(5)
        .collect();
    assert!(
        failures.is_empty(),
        "{} of 200 scopes lost their lock: {failures:#?}\nfailed rounds (first 5): {failed_rounds:#?}",
        failures.len()
    );
    assert_eq!(events.aborted(), 0);
    // Each of the 200 locks was renewed several times.
    assert!(events.extended() >= 200 * 2, "{}", events.extended());
    for i in 0..5 {
        assert!(servers.keys(i).is_empty(), "node {i}");
    }
}

#[derive(Debug)]
enum AppError {
    Lock(Error),
    Ledger(&'static str),
}

impl From<Error> for AppError {
    fn from(err: Error) -> Self {
        AppError::Lock(err)
    }
}

#[tokio::test]
async fn the_routines_result_and_error_come_back_unchanged() {
    let servers = Servers::start(3);
    let redlock = patient(&servers);
    let checker = &servers;
    let ok: Result<u32, AppError> = redlock
        .using(&["job"], Duration::from_secs(5), |signal| async move {
            held_everywhere(checker, &signal).await;
            Ok(42)
        })
        .await;
    assert!(matches!(ok, Ok(42)), "{ok:?}");
    let err: Result<u32, AppError> = redlock
        .using(&["job"], Duration::from_secs(5), |signal| async move {
            held_everywhere(checker, &signal).await;
            Err(AppError::Ledger("rejected"))
        })
        .await;
    assert!(matches!(err, Err(AppError::Ledger("rejected"))), "{err:?}");
    for i in 0..3 {
        assert!(servers.keys(i).is_empty(), "node {i}");
    }

    // A lock held elsewhere: the acquire error goes through `E::from`; the routine never runs.
    let held = redlock
        .acquire(&["job"], Duration::from_secs(5))
        .await
        .expect("acquire");
    let once = servers
        .builder()
        .node_timeout(PATIENT)
        .retry_count(1)
        .build()
        .expect("config");
    let err: Result<(), AppError> = once
        .using(&["job"], Duration::from_secs(5), |_| async {
            panic!("the routine must not run")
        })
        .await;
    assert!(
        matches!(err, Err(AppError::Lock(Error::Contended { .. }))),
        "{err:?}"
    );
    held.release().await.expect("release");
}

#[tokio::test]
async fn bad_input_is_rejected_before_any_traffic() {
    // Nothing listens there: any traffic would fail with QuorumUnreachable instead.
    let redlock = Redlock::builder()
        .nodes([
            "redis://127.0.0.1:1",
            "redis://127.0.0.1:2",
            "redis://127.0.0.1:3",
        ])
        .automatic_extension_threshold(500 * MS)
        .build()
        .expect("config");
    let ran = AtomicBool::new(false);
    let run = |resources: &'static [&'static str], ttl: Duration| {
        let redlock = redlock.clone();
        let ran = &ran;
        async move {
            let started = Instant::now();
            let result: Result<(), AppError> = redlock
                .using(resources, ttl, |_| async move {
                    ran.store(true, Ordering::SeqCst);
                    Ok(())
                })
                .await;
            assert!(started.elapsed() < 100 * MS, "sent traffic first");
            match result {
                Err(AppError::Lock(Error::InvalidInput(e))) => e,
                other => panic!("expected InvalidInput, got {other:?}"),
            }
        }
    };
    let secs = Duration::from_secs(5);
    assert_eq!(run(&[], secs).await, InvalidInput::NoResources);
    assert!(matches!(
        run(&["a", ""], secs).await,
        InvalidInput::EmptyResource { index: 1 }
    ));
    assert!(matches!(
        run(&["a", "a"], secs).await,
        InvalidInput::DuplicateResource { .. }
    ));
    assert!(matches!(
        run(&["a"], Duration::ZERO).await,
        InvalidInput::ZeroTtl { .. }
    ));
    for ttl in [100 * MS, 500 * MS, 507 * MS] {
        let e = run(&["a"], ttl).await;
        assert!(
            matches!(e, InvalidInput::TtlNotAboveThreshold { ttl: t, threshold, .. }
                if t == ttl && threshold == 500 * MS),
            "{e:?}"
        );
    }
    assert!(!ran.load(Ordering::SeqCst));
}

#[tokio::test(flavor = "current_thread")]
async fn no_task_outlives_the_using_call() {
    // One node: a quorum of one leaves no straggler call running after a round, so the
    // count of live tasks is exact.
    let servers = Servers::start(1);
    let (events, redlock) = recorded(
        servers
            .builder()
            .node_timeout(250 * MS)
            .automatic_extension_threshold(200 * MS),
    );
    let metrics = tokio::runtime::Handle::current().metrics();
    // Warm the connections (each node's connection has its own driver task).
    redlock
        .using(&["warm"], Duration::from_secs(1), |_| async {
            Ok::<_, Error>(())
        })
        .await
        .expect("using");
    let baseline = metrics.num_alive_tasks();
    let during = redlock
        .using(&["job"], 500 * MS, |signal| {
            let events = events.clone();
            async move {
                // Run through a few extensions.
                assert!(eventually(|| events.extended() >= 3).await);
                signal.check()?;
                Ok::<_, Error>(metrics_now())
            }
        })
        .await
        .expect("using");
    assert_eq!(
        during,
        baseline + 1,
        "the extension task is the only extra task"
    );
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        baseline,
        "a task outlived using()"
    );
}

fn metrics_now() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// When an acquire round is decided by a majority, the calls still running on the other nodes
/// go on in the background; one that had not yet written its command must not land its SET
/// after the release of a scope that ended within milliseconds (the lock's requests follow
/// each other on every node).
#[tokio::test]
async fn a_scope_that_ends_at_once_leaves_no_key() {
    let mut leftovers = Vec::new();
    for round in 0..40 {
        let servers = Servers::start(3);
        let redlock = servers.redlock();
        redlock
            .using(&["job"], Duration::from_secs(5), |_| async {
                Ok::<_, Error>(())
            })
            .await
            .expect("using");
        for i in 0..3 {
            if servers.get(i, "job").is_some() {
                leftovers.push((round, i, servers.pttl(i, "job")));
            }
        }
    }
    assert!(
        leftovers.is_empty(),
        "(round, node, PTTL ms) left: {leftovers:?}"
    );
}

/// A hook that panics on every event must not take the extension task, and with it the lock,
/// down: the lock keeps being extended and the signal stays clear.
#[tokio::test]
async fn a_panicking_event_hook_does_not_lose_the_lock() {
    let servers = Servers::start(3);
    let redlock = servers
        .builder()
        .node_timeout(PATIENT)
        .automatic_extension_threshold(200 * MS)
        .on_event(|_: &Event| panic!("a buggy metrics hook"))
        .build()
        .expect("config");
    let other = patient(&servers);
    let ttl = 600 * MS;
    redlock
        .using(&["job"], ttl, |signal| async move {
            // Three TTLs: several extensions, each emitting an event to the panicking hook.
            let until = Instant::now() + ttl * 3;
            while Instant::now() < until {
                assert!(!signal.is_aborted(), "{:?}", signal.error());
                let err = other.try_acquire(&["job"], ttl).await.expect_err("held");
                assert!(matches!(err, Error::Contended { .. }), "{err:?}");
                tokio::time::sleep(100 * MS).await;
            }
            Ok::<_, Error>(())
        })
        .await
        .expect("using");
}
