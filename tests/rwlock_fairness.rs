//! The read-write lock is phase-fair: readers that waited through a write phase get in
//! before the next writer, readers that come while a writer waits queue behind it, so
//! neither side starves the other. Two writer loops and six reader loops share a lock over
//! real servers; and the rule on one node, through `scripts/batch.lua` run straight.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redfence::{Error, Redlock, RwLock};
use support::{PATIENT, Servers, TestRedlock, warm_up};
use tokio::sync::Mutex;

const SCRIPT: &str = include_str!("../src/scripts/batch.lua");
const KEYS: [&str; 3] = [
    "cfg:rwlock:writer",
    "cfg:rwlock:readers",
    "cfg:rwlock:writer_waiting",
];

/// How long the loops run.
const RUN: Duration = Duration::from_secs(8);
/// How long each hold lasts.
const HOLD: Duration = Duration::from_millis(50);
/// The longest a reader may wait for a grant. Phase-fair, a reader waits for about one write
/// phase: a few hundred milliseconds here. Before, readers waited behind the two writers'
/// waiting marks for most of the run. (Writers race each other as before: the first to try
/// after the readers leave gets in, so a writer's longest wait is left unbounded here.)
const LONGEST_WAIT: Duration = Duration::from_secs(3);

/// One loop's grants and its longest wait for one.
#[derive(Default)]
struct Tally {
    grants: usize,
    longest: Duration,
}

/// A side's loop: acquire (retrying as long as the Redlock lets it), hold [`HOLD`], release,
/// again until `stop`. A wait that fails (e.g. the acquire timeout) counts as a wait of its
/// length, and ends the loop.
async fn run(lock: RwLock, write: bool, stop: Arc<AtomicBool>, tally: Arc<Mutex<Tally>>) {
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let held = if write {
            lock.acquire_write(Duration::from_secs(5))
                .await
                .map(|guard| Box::pin(async move { guard.release().await }) as Pending)
        } else {
            lock.acquire_read(Duration::from_secs(5))
                .await
                .map(|guard| Box::pin(async move { guard.release().await }) as Pending)
        };
        let waited = started.elapsed();
        let mut t = tally.lock().await;
        t.longest = t.longest.max(waited);
        let release = match held {
            Ok(release) => release,
            Err(err) => {
                eprintln!("{} gave up after {waited:?}: {err}", side(write));
                return;
            }
        };
        t.grants += 1;
        drop(t);
        tokio::time::sleep(HOLD).await;
        release.await.expect("release");
    }
}

type Pending = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Error>> + Send>>;

fn side(write: bool) -> &'static str {
    if write { "writer" } else { "reader" }
}

/// A Redlock as each loop's own process would have: fast retries, patient nodes, an acquire
/// timeout well past [`LONGEST_WAIT`] (a starved loop then ends the run instead of hanging).
fn redlock(servers: &Servers) -> Redlock {
    servers
        .builder()
        .node_timeout(PATIENT)
        .retry_count(u32::MAX)
        .acquire_timeout(Duration::from_secs(6))
        .build()
        .expect("config")
}

/// Two writer loops and six reader loops, each with its own Redlock (as separate processes
/// would): readers get at least a quarter of the grants, writers at least a tenth, and no
/// one waits [`LONGEST_WAIT`] for a grant. Before phase fairness, the writers' waiting marks
/// kept readers out for nearly the whole run (about 3 % of the grants).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_and_six_readers_share_the_lock_and_nobody_starves() {
    let servers = Servers::start(3);
    let stop = Arc::new(AtomicBool::new(false));
    let mut loops = Vec::new();
    let mut tallies = Vec::new();
    for i in 0..8 {
        let write = i < 2;
        let redlock = redlock(&servers);
        warm_up(&redlock).await;
        let lock = redlock.rwlock("cfg").expect("rwlock");
        let tally = Arc::new(Mutex::new(Tally::default()));
        tallies.push((write, Arc::clone(&tally)));
        loops.push(tokio::spawn(run(lock, write, Arc::clone(&stop), tally)));
    }
    tokio::time::sleep(RUN).await;
    stop.store(true, Ordering::Relaxed);
    for handle in loops {
        tokio::time::timeout(Duration::from_secs(20), handle)
            .await
            .expect("every loop ends within its acquire timeout")
            .expect("loop");
    }
    let (mut reads, mut writes) = (0, 0);
    let (mut read_wait, mut write_wait) = (Duration::ZERO, Duration::ZERO);
    for (write, tally) in &tallies {
        let t = tally.lock().await;
        if *write {
            writes += t.grants;
            write_wait = write_wait.max(t.longest);
        } else {
            reads += t.grants;
            read_wait = read_wait.max(t.longest);
        }
    }
    let total = (reads + writes).max(1);
    let summary = format!(
        "{reads} reads, {writes} writes; longest wait: reader {read_wait:?}, writer {write_wait:?}"
    );
    eprintln!("{summary}");
    assert!(reads * 4 >= total, "readers starved: {summary}");
    assert!(writes * 10 >= total, "writers starved: {summary}");
    assert!(
        read_wait < LONGEST_WAIT,
        "a reader waited too long: {summary}"
    );
}

/// One read-write operation of `scripts/batch.lua` on server 0's lock `cfg`: kind, token,
/// waiter id and how long a refused waiter stays registered (ms); its integer reply.
fn op(servers: &Servers, kind: &str, token: &str, waiter: &str, wait: u64) -> i64 {
    let mut conn = servers.conn(0);
    let wait = wait.to_string();
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(SCRIPT).arg(KEYS.len()).arg(&KEYS[..]);
    cmd.arg(&[kind, token, "10000", "3", waiter, &wait][..]);
    let replies: Vec<redis::Value> = cmd.query(&mut conn).expect("batch script");
    match replies.as_slice() {
        [redis::Value::Int(n)] => *n,
        other => panic!("{kind} {token}: {other:?}"),
    }
}

/// On one node: a reader refused while a writer holds is admitted by that writer's release
/// and gets in before the writer that waited meanwhile, which waits for it; a reader that
/// comes after the release queues behind the waiting writer, and is admitted by its release.
#[test]
fn readers_waiting_at_a_writers_release_go_before_the_next_writer() {
    let servers = Servers::start(1);
    assert_eq!(op(&servers, "wa", "w1", "x1", 5_000), 1, "the first writer");
    assert_eq!(op(&servers, "ra", "r1", "y1", 5_000), 0, "beside a writer");
    assert_eq!(op(&servers, "wa", "w2", "x2", 5_000), 0, "behind a writer");
    assert_eq!(op(&servers, "wr", "w1", "x1", 5_000), 1, "released");
    // The second writer waited, but the reader waited through the whole write phase.
    assert_eq!(
        op(&servers, "wa", "w2", "x2", 5_000),
        0,
        "the next writer waits for the reader in line before it"
    );
    assert_eq!(
        op(&servers, "ra", "r2", "y2", 5_000),
        0,
        "a reader that came after the release queues behind the waiting writer"
    );
    assert_eq!(
        op(&servers, "ra", "r1", "y1", 5_000),
        1,
        "the admitted reader gets in despite the waiting writer's mark"
    );
    // A resent grant is granted again; the registration is gone with the grant.
    assert_eq!(op(&servers, "ra", "r1", "y1", 5_000), 1, "a repeat");
    assert_eq!(op(&servers, "wa", "w2", "x2", 5_000), 0, "a reader holds");
    assert_eq!(
        op(&servers, "rr", "r1", "y1", 5_000),
        1,
        "the reader leaves"
    );
    assert_eq!(op(&servers, "wa", "w2", "x2", 5_000), 1, "now the writer");
    let mark: Option<String> = servers.cmd(0, &["GET", KEYS[2]]);
    assert_eq!(mark, None, "the granted writer takes its mark away");
    assert_eq!(op(&servers, "ra", "r2", "y2", 5_000), 0, "beside a writer");
    assert_eq!(op(&servers, "wa", "w3", "x3", 5_000), 0, "behind a writer");
    assert_eq!(op(&servers, "wr", "w2", "x2", 5_000), 1, "released");
    // A resent release finds nothing of its own and admits nobody again.
    assert_eq!(op(&servers, "wr", "w2", "x2", 5_000), 0, "a repeat");
    assert_eq!(
        op(&servers, "ra", "r2", "y2", 5_000),
        1,
        "admitted by that release"
    );
    let readers: Vec<String> = servers.cmd(0, &["ZRANGEBYSCORE", KEYS[1], "0", "+inf"]);
    assert_eq!(
        readers,
        vec!["r2".to_owned()],
        "only live readers score above 0"
    );
}

/// On one node: an admitted reader that gives up (its leave) or vanishes (its place ends)
/// stops holding up the writer behind it; a single attempt (no wait) takes no place.
#[test]
fn an_admitted_reader_that_leaves_or_vanishes_stops_holding_up_writers() {
    let servers = Servers::start(1);
    assert_eq!(op(&servers, "wa", "w1", "x1", 5_000), 1);
    assert_eq!(
        op(&servers, "ra", "r0", "", 0),
        0,
        "a single attempt, beside a writer"
    );
    assert_eq!(op(&servers, "ra", "r1", "y1", 5_000), 0);
    assert_eq!(op(&servers, "ra", "r2", "y2", 300), 0);
    assert_eq!(op(&servers, "wr", "w1", "x1", 5_000), 1, "admits r1 and r2");
    assert_eq!(
        op(&servers, "wa", "w2", "x2", 5_000),
        0,
        "r1 and r2 are in line"
    );
    // r1 gives up: its leave is a release of its waiter id.
    assert_eq!(op(&servers, "rr", "y1", "y1", 5_000), 0, "a leave");
    assert_eq!(
        op(&servers, "wa", "w2", "x2", 5_000),
        0,
        "r2 is still in line"
    );
    // r2 vanishes: its place ends 300 ms after its refusal.
    let deadline = Instant::now() + Duration::from_secs(5);
    while op(&servers, "wa", "w2", "x2", 5_000) == 0 {
        assert!(
            Instant::now() < deadline,
            "the vanished reader's place never ended"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
