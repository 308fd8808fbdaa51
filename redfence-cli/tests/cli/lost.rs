//! A lock lost while the job runs: SIGKILL lands before the lock's validity ends, with a
//! margin (issue 38: it went out at the very end, 3 ms after it in one run).

use std::time::{Duration, Instant};

use redfence_testkit::Servers;

use super::{Files, LOST, spawn_run, wait_exit, wait_for};

/// The lock's TTL: its drift bound (1 % + 2 ms) is 102 ms.
const TTL: Duration = Duration::from_secs(10);

/// The drift bound of a lock of [`TTL`]: the validity ends at least this long before the
/// first of its keys expires.
const DRIFT: Duration = Duration::from_millis(102);

/// How far before the validity's latest possible end the test wants the job dead: redfence
/// aims at 20 ms more than the drift (122 ms before the validity ends, so at least 224 ms
/// before the keys expire); checking 10 ms leaves 100 ms for a late kill on a loaded machine.
const CHECKED: Duration = Duration::from_millis(10);

/// Whether process `pid` is gone or a zombie (dead, not reaped yet).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses, which may hold anything.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// Every node hangs (paused) right after the lock is taken, so the keys expire when the
/// acquisition set them to: the first of them ends at `keys_end`, and the lock's validity no
/// later than `keys_end - DRIFT`. The job ignores SIGTERM (its trap only notes it), so it dies
/// of SIGKILL, which must come before the validity ends, with room to spare.
#[test]
fn on_a_lost_lock_sigkill_lands_before_the_validity_ends() {
    let servers = Servers::start(3);
    let files = Files::new();
    let script = format!(
        "trap 'echo term >> {term}' TERM; echo $$ > {pid}.tmp && mv {pid}.tmp {pid}; \
         while true; do sleep 0.02; done",
        term = files.p("term"),
        pid = files.p("pid"),
    );
    let ttl = format!("{}s", TTL.as_secs());
    let mut run = spawn_run(
        &servers,
        &["-r", "job", "--ttl", &ttl, "--kill-after", "60s"],
        &script,
    );
    wait_for("the job", || files.path("pid").exists());
    wait_for("the key on every node", || {
        super::holders(&servers, "job") == 3
    });
    let pid: u32 = std::fs::read_to_string(files.path("pid"))
        .expect("pid file")
        .trim()
        .parse()
        .expect("a pid");
    // When the first key expires: the instant before each PTTL was asked, plus its answer.
    let keys_end = (0..3)
        .map(|i| {
            let asked = Instant::now();
            let pttl = servers.pttl(i, "job");
            assert!(pttl > 0, "node {i}: PTTL {pttl}");
            asked + Duration::from_millis(pttl.unsigned_abs())
        })
        .min()
        .expect("three nodes");
    for i in 0..3 {
        servers.pause(i);
    }

    // The extensions go unanswered; about half a second before the validity ends the job
    // gets SIGTERM, then SIGKILL.
    let deadline = keys_end + Duration::from_secs(5);
    while !files.path("term").exists() {
        assert!(Instant::now() < deadline, "no SIGTERM in the job");
        std::thread::sleep(Duration::from_millis(10));
    }
    let killed = loop {
        if dead(pid) {
            break Instant::now();
        }
        assert!(Instant::now() < deadline, "the job is still there");
        std::thread::sleep(Duration::from_millis(1));
    };
    for i in 0..3 {
        servers.resume(i);
    }
    let validity_end = keys_end - DRIFT;
    assert!(
        killed + CHECKED <= validity_end,
        "the job died {:?} before the keys expired: less than the drift ({DRIFT:?}) and \
         {CHECKED:?}, so not clearly before the lock's validity ended",
        keys_end.saturating_duration_since(killed)
    );
    assert_eq!(wait_exit(&mut run).code(), Some(LOST));
    assert_eq!(
        super::lines(&files.path("term")),
        ["term"],
        "one SIGTERM first"
    );
}
