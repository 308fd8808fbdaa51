//! Leader election against real redis-server processes: one leader at a time with
//! increasing terms, takeover after a leader dies, the signal firing before the lease ends
//! (leader partitioned, or a majority of nodes down), `resign` handing over at once, and a
//! deposed leader's late write rejected by PostgreSQL (in `redfence-postgres/tests/`).
//!
//! Candidates whose network the tests break reach the nodes through `support::proxy`.
//! Shutting down a leader is in `shutdown.rs`.

mod shutdown;
#[path = "../support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redfence::{Election, Error, FencingCounter, LossReason, MemoryCounter};
use support::candidates::{LEASE, RENEW_DEADLINE, RETRY_PERIOD, candidate};
use support::proxy::Mode;
use support::{DEADLINE, Servers, eventually};
use tokio::sync::mpsc;

/// Slack for a loaded machine on every timing bound.
const SLACK: Duration = Duration::from_millis(700);
const LOCK_KEY: &str = "election:{jobs}";

fn memory_counter() -> Arc<dyn FencingCounter> {
    Arc::new(MemoryCounter::new())
}

/// A term as a routine saw it.
#[derive(Clone, Debug)]
struct Elected {
    candidate: usize,
    term: u64,
    at: Instant,
}

/// Runs candidate `id` in a task: each term reports itself on `terms`, waits until
/// leadership is lost, reports that instant on `lost` and returns the loss as an error.
fn campaign_until_lost(
    id: usize,
    election: Election,
    terms: mpsc::UnboundedSender<Elected>,
    lost: mpsc::UnboundedSender<(usize, Instant, Error)>,
) -> tokio::task::JoinHandle<Result<(), Error>> {
    tokio::spawn(async move {
        election
            .run(|leadership| {
                let (terms, lost) = (terms.clone(), lost.clone());
                async move {
                    let _ = terms.send(Elected {
                        candidate: id,
                        term: leadership.term(),
                        at: Instant::now(),
                    });
                    let error = leadership.lost().await;
                    let _ = lost.send((id, Instant::now(), error.clone()));
                    Err(error)
                }
            })
            .await
    })
}

async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>, within: Duration, what: &str) -> T {
    tokio::time::timeout(within, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {within:?}"))
        .expect("senders alive")
}

/// The lock key's value and PTTL on each server.
/// `election.observe()`, forwarded to a channel by a task (abort it when done).
fn watch(
    election: &Election,
) -> (
    mpsc::UnboundedReceiver<Option<redfence::Leader>>,
    tokio::task::JoinHandle<()>,
) {
    let (changes_tx, changes) = mpsc::unbounded_channel();
    let watcher = election.observe();
    let watching = tokio::spawn(async move {
        use futures::StreamExt;
        let mut watcher = std::pin::pin!(watcher);
        while let Some(change) = watcher.next().await {
            if changes_tx.send(change).is_err() {
                return;
            }
        }
    });
    (changes, watching)
}

fn lock_state(servers: &Servers) -> Vec<(Option<String>, i64)> {
    (0..servers.len())
        .map(|i| (servers.get(i, LOCK_KEY), servers.pttl(i, LOCK_KEY)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_candidates_one_leader_at_a_time_and_terms_increase() {
    let servers = Servers::start(3);
    let counter = memory_counter();
    let leading = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let log: Arc<Mutex<Vec<(usize, u64, bool)>>> = Arc::default();
    let mut tasks = Vec::new();
    for id in 0..3 {
        let election = candidate(&servers, &counter, id, false, true)
            .await
            .election;
        let (leading, overlaps, log) = (leading.clone(), overlaps.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            election
                .run(|leadership| {
                    let (leading, overlaps, log) = (leading.clone(), overlaps.clone(), log.clone());
                    let reader = election.clone();
                    async move {
                        if leading.fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        // leader() names this term while it leads.
                        let read = reader.leader().await.ok().flatten();
                        let named = read.as_ref() == Some(leadership.leader());
                        // Lead for a while (renewing), then step down for the others.
                        tokio::select! {
                            _ = leadership.lost() => {}
                            () = tokio::time::sleep(Duration::from_millis(600)) => {}
                        }
                        log.lock()
                            .expect("log")
                            .push((id, leadership.term(), named));
                        leading.fetch_sub(1, Ordering::SeqCst);
                        // Step down now (with rejoin, an error campaigns again).
                        leadership.resign().await;
                        Err::<(), Error>(leadership.lost().await)
                    }
                })
                .await
        }));
    }
    let enough = eventually(|| log.lock().expect("log").len() >= 6).await;
    for task in &tasks {
        task.abort();
    }
    let log = log.lock().expect("log").clone();
    assert!(enough, "six terms within {DEADLINE:?}: {log:?}");
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two leaders at once: {log:?}"
    );
    let terms: Vec<u64> = log.iter().map(|(_, term, _)| *term).collect();
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms strictly increase: {log:?}"
    );
    assert!(
        log.iter().all(|(_, _, named)| *named),
        "leader() named each leader: {log:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_leader_is_replaced_within_lease_plus_retry_period() {
    let servers = Servers::start(3);
    let counter = memory_counter();
    let (terms_tx, mut terms) = mpsc::unbounded_channel();
    let (lost_tx, _lost) = mpsc::unbounded_channel();
    let mut candidates = Vec::new();
    let mut tasks = Vec::new();
    for id in 0..3 {
        let c = candidate(&servers, &counter, id, true, false).await;
        tasks.push(campaign_until_lost(
            id,
            c.election.clone(),
            terms_tx.clone(),
            lost_tx.clone(),
        ));
        candidates.push(c);
    }
    let first = next(&mut terms, DEADLINE, "a first leader").await;
    // Let it renew a few times, then it "dies": its connections are cut (nothing it sends
    // arrives, so it cannot release) and its task is gone.
    tokio::time::sleep(3 * RETRY_PERIOD).await;
    let died = Instant::now();
    candidates[first.candidate].set(Mode::Cut);
    tasks[first.candidate].abort();

    let second = next(&mut terms, LEASE + RETRY_PERIOD + SLACK, "a new leader").await;
    let waited = second.at - died;
    assert_ne!(second.candidate, first.candidate);
    assert!(second.term > first.term, "{second:?} after {first:?}");
    // Not before the dead leader's lease (renewed at most a retry period before it died)
    // ran out, and within lease + retry_period.
    assert!(
        waited + RETRY_PERIOD + Duration::from_millis(100) >= LEASE,
        "took over after {waited:?}, before the lease ran out"
    );
    assert!(waited <= LEASE + RETRY_PERIOD + SLACK, "{waited:?}");
    for task in &tasks {
        task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_past_its_renew_deadline_is_told_before_its_lease_ends() {
    let servers = Servers::start(3);
    let counter = memory_counter();
    let (terms_tx, mut terms) = mpsc::unbounded_channel();
    let (lost_tx, mut lost) = mpsc::unbounded_channel();
    let mut candidates = Vec::new();
    let mut tasks = Vec::new();
    for id in 0..2 {
        let c = candidate(&servers, &counter, id, true, false).await;
        tasks.push(campaign_until_lost(
            id,
            c.election.clone(),
            terms_tx.clone(),
            lost_tx.clone(),
        ));
        candidates.push(c);
    }
    let first = next(&mut terms, DEADLINE, "a first leader").await;
    tokio::time::sleep(3 * RETRY_PERIOD).await;
    let token = (0..3)
        .find_map(|i| servers.get(i, LOCK_KEY))
        .expect("the leader's token");
    // Paused, as far as the nodes can tell: nothing it sends gets through.
    let paused = Instant::now();
    candidates[first.candidate].set(Mode::Blackhole);

    let (who, fired, error) = next(&mut lost, RENEW_DEADLINE + SLACK, "the signal").await;
    let held = lock_state(&servers);
    assert_eq!(who, first.candidate);
    assert!(
        matches!(
            error,
            Error::LockLost {
                reason: LossReason::Unconfirmed { .. },
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        fired - paused <= RENEW_DEADLINE + SLACK,
        "{:?}",
        fired - paused
    );
    // When it fired, its lease was still running on a majority, by a wide margin.
    let running = held
        .iter()
        .filter(|(value, pttl)| value.as_deref() == Some(token.as_str()) && *pttl >= 500)
        .count();
    assert!(running >= 2, "signal after the lease ran low: {held:?}");

    let second = next(&mut terms, LEASE + SLACK, "the next leader").await;
    assert_ne!(second.candidate, first.candidate);
    assert!(second.term > first.term, "{second:?} after {first:?}");
    assert!(
        second.at > fired,
        "the old leader was told before a new one was elected"
    );
    for task in &tasks {
        task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_down_ends_leadership_before_the_lease_and_nobody_leads_until_recovery() {
    let servers = Servers::start(3);
    let counter = memory_counter();
    let (terms_tx, mut terms) = mpsc::unbounded_channel();
    let (lost_tx, mut lost) = mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    let mut elections = Vec::new();
    for id in 0..2 {
        let election = candidate(&servers, &counter, id, false, true)
            .await
            .election;
        tasks.push(campaign_until_lost(
            id,
            election.clone(),
            terms_tx.clone(),
            lost_tx.clone(),
        ));
        elections.push(election);
    }
    let first = next(&mut terms, DEADLINE, "a first leader").await;
    // An observer, which names the first leader and must stop naming it.
    let (mut changes, watching) = watch(&elections[0]);
    let seen = next(&mut changes, DEADLINE, "the first observation").await;
    assert_eq!(seen.map(|l| l.term), Some(first.term));
    tokio::time::sleep(3 * RETRY_PERIOD).await;
    let paused = Instant::now();
    servers.pause(1);
    servers.pause(2);

    let (who, fired, _) = next(&mut lost, RENEW_DEADLINE + SLACK, "the signal").await;
    assert_eq!(who, first.candidate);
    assert!(
        fired - paused < LEASE,
        "stepped down {:?} after the pause",
        fired - paused
    );
    // Nobody leads while a majority is down: no term starts for two leases.
    assert!(
        tokio::time::timeout(2 * LEASE, terms.recv()).await.is_err(),
        "a leader was elected without a majority"
    );
    assert!(
        elections[0].leader().await.is_err(),
        "no majority to read from"
    );
    // The observer stopped naming the old leader: no read succeeded for a lease.
    let unnamed = tokio::time::timeout(Duration::ZERO, changes.recv()).await;
    assert!(
        matches!(unnamed, Ok(Some(None))),
        "the observer still names the old leader: {unnamed:?}"
    );
    watching.abort();

    servers.resume(1);
    servers.resume(2);
    let again = next(&mut terms, DEADLINE, "a leader after recovery").await;
    assert!(again.term > first.term, "{again:?} after {first:?}");
    // The record is advisory (each node's write bounded by the node timeout), and the nodes
    // have just resumed: read until it names the new term.
    let deadline = Instant::now() + DEADLINE;
    let named = loop {
        let read = elections[0].leader().await.expect("read");
        match read {
            Some(named) if named.term >= again.term => break named,
            _ if Instant::now() >= deadline => panic!("no record of term {}: {read:?}", again.term),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    assert_eq!(named.term, again.term);
    assert_eq!(named.identity, format!("candidate-{}", again.candidate));
    for task in &tasks {
        task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resign_hands_over_within_one_retry_period() {
    let servers = Servers::start(3);
    let counter = memory_counter();
    let (terms_tx, mut terms) = mpsc::unbounded_channel();
    let (lost_tx, mut lost) = mpsc::unbounded_channel();
    let mut elections = Vec::new();
    let mut tasks = Vec::new();
    for id in 0..2 {
        let election = candidate(&servers, &counter, id, false, false)
            .await
            .election;
        tasks.push(campaign_until_lost(
            id,
            election.clone(),
            terms_tx.clone(),
            lost_tx.clone(),
        ));
        elections.push(election);
    }
    let first = next(&mut terms, DEADLINE, "a first leader").await;
    // Watch from the other candidate, from now on.
    let (mut changes, watching) = watch(&elections[1 - first.candidate]);
    let seen_first = next(&mut changes, DEADLINE, "the first observation").await;
    assert_eq!(seen_first.map(|l| l.term), Some(first.term));
    tokio::time::sleep(3 * RETRY_PERIOD).await;

    let resigned = Instant::now();
    elections[first.candidate].resign().await;
    let (who, _, error) = next(&mut lost, SLACK, "the resigned signal").await;
    assert_eq!(who, first.candidate);
    assert!(matches!(
        error,
        Error::LockLost {
            reason: LossReason::Resigned,
            ..
        }
    ));
    let second = next(&mut terms, RETRY_PERIOD + SLACK, "the next leader").await;
    assert!(
        second.at - resigned <= RETRY_PERIOD + SLACK,
        "{:?}",
        second.at - resigned
    );
    assert_ne!(second.candidate, first.candidate);
    assert!(second.term > first.term);
    // The resigned run returned (no rejoin) with the loss.
    let ended = tokio::time::timeout(DEADLINE, &mut tasks[first.candidate])
        .await
        .expect("run returned")
        .expect("task");
    assert!(matches!(ended, Err(Error::LockLost { .. })));

    // observe() then saw (perhaps nobody, then) the second leader, and nothing else.
    let mut seen = Vec::new();
    loop {
        let change = next(&mut changes, DEADLINE, "the second observation").await;
        let done = change.is_some();
        seen.push(change);
        if done {
            break;
        }
    }
    let last = seen.last().cloned().flatten().expect("a leader");
    assert_eq!(last.term, second.term, "{seen:?}");
    assert_eq!(last.identity, format!("candidate-{}", second.candidate));
    assert!(
        seen.len() <= 2,
        "at most nobody, then the new leader: {seen:?}"
    );
    watching.abort();
    for task in &tasks {
        task.abort();
    }
}
