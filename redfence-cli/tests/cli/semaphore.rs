//! `redfence run -n K`: the job runs holding one of K permits of a counting semaphore.

use std::process::Child;

use super::{Files, spawn_run, wait_exit};
use redfence_testkit::Servers;

/// Twelve runs at once with `-n 3`: every job runs, never more than three at one instant,
/// each with a `REDFENCE_SLOT` from 0 to 2, and no two at once in the same slot.
#[test]
fn twelve_runs_share_three_permits() {
    const RUNS: usize = 12;
    let servers = Servers::start(3);
    let files = Files::new();
    // Each job writes its own file (no shared file, no locking): its slot, then its start
    // and end on the wall clock in nanoseconds, taken while it holds the permit.
    let script = format!(
        "f={dir}/job.$$; s=$(date +%s%N); sleep 0.3; e=$(date +%s%N); \
         echo \"$REDFENCE_SLOT $s $e\" > $f.tmp && mv $f.tmp $f",
        dir = files.dir.path().display()
    );
    let mut runs: Vec<Child> = (0..RUNS)
        .map(|_| {
            spawn_run(
                &servers,
                &["-n", "3", "-r", "jobs", "--wait", "60s"],
                &script,
            )
        })
        .collect();
    for run in &mut runs {
        assert_eq!(wait_exit(run).code(), Some(0), "every run exits 0");
    }

    let mut jobs: Vec<(u32, u128, u128)> = Vec::new();
    for entry in std::fs::read_dir(files.dir.path()).expect("read dir") {
        let path = entry.expect("entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !name.starts_with("job.") || name.ends_with(".tmp") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("job file");
        let fields: Vec<&str> = text.split_whitespace().collect();
        let [slot, start, end] = fields.as_slice() else {
            panic!("job file {name}: {text:?}");
        };
        jobs.push((
            slot.parse().expect("REDFENCE_SLOT is a number"),
            start.parse().expect("start"),
            end.parse().expect("end"),
        ));
    }
    assert_eq!(jobs.len(), RUNS, "all twelve jobs ran");
    assert!(jobs.iter().all(|&(slot, _, _)| slot < 3), "slots: {jobs:?}");

    let mut events: Vec<(u128, i32)> = jobs
        .iter()
        .flat_map(|&(_, start, end)| [(start, 1), (end, -1)])
        .collect();
    events.sort();
    let (mut open, mut most) = (0, 0);
    for (_, delta) in events {
        open += delta;
        most = most.max(open);
    }
    assert!(most <= 3, "{most} jobs ran at once with -n 3");
    assert!(most >= 2, "jobs never ran side by side ({most})");
    for (i, a) in jobs.iter().enumerate() {
        for b in &jobs[i + 1..] {
            if a.0 == b.0 {
                assert!(a.2 <= b.1 || b.2 <= a.1, "slot {} ran twice at once", a.0);
            }
        }
    }
}

/// A run with another number of permits than the one running is refused (usage error, the
/// command does not run), naming both numbers.
#[test]
fn another_number_of_permits_is_refused() {
    let servers = Servers::start(3);
    let files = Files::new();
    let mut first = spawn_run(
        &servers,
        &["-n", "2", "-r", "jobs"],
        &files.hold_until_go("first"),
    );
    super::wait_for("the first job", || files.path("log").exists());
    let output = super::redfence(&servers)
        .args(["run", "-n", "3", "-r", "jobs", "--", "sh", "-c"])
        .arg(format!("echo second >> {}", files.p("log")))
        .output()
        .expect("run redfence");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(super::USAGE), "{stderr}");
    assert!(stderr.contains("permits"), "{stderr}");
    files.go();
    assert_eq!(wait_exit(&mut first).code(), Some(0));
    assert_eq!(super::lines(&files.path("log")), ["first"]);
}

/// `status -n K NAME` shows the semaphore's K slots: the held one with its holder, the
/// others free; `-n` with two names is a usage error.
#[test]
fn status_shows_a_semaphores_slots() {
    let servers = Servers::start(3);
    let token = "fedcba9876543210fedcba9876543210";
    for i in [0, 1] {
        let _: () = servers.cmd(i, &["SET", "pool:semaphore:slot:1", token, "PX", "20000"]);
    }
    let status = |extra: &[&str]| {
        super::redfence(&servers)
            .arg("status")
            .args(extra)
            .output()
            .expect("run redfence status")
    };
    let out = status(&["-n", "3", "pool"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for slot in 0..3 {
        assert!(
            text.contains(&format!("pool:semaphore:slot:{slot}")),
            "slot {slot} listed: {text}"
        );
    }
    assert!(text.contains("held by one owner (fedcba98)"), "{text}");
    assert_eq!(text.matches("free").count(), 2, "two free slots: {text}");

    let json = status(&["--json", "-n", "3", "pool"]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    let free: Vec<bool> = report["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r["free"].as_bool().expect("free"))
        .collect();
    assert_eq!(free, [true, false, true]);

    let usage = status(&["-n", "3", "pool", "other"]);
    assert_eq!(usage.status.code(), Some(super::USAGE), "{usage:?}");
}

/// Issue 38: `status -n 200` shows a semaphore whose 60 KB name `run -n 200` accepted (its
/// 200 slot names, 12 MB, are more than one call's names: it exited 64, "one lock's names");
/// a name too long for its slots is refused by both alike, saying how long it may be.
#[test]
fn status_shows_what_run_accepts() {
    let servers = Servers::start(3);
    let name = "x".repeat(60_000);
    // Calls of 12 MB of names: the tests' 200 ms node timeout is for small calls, and a
    // loaded machine missed it (status exited 69); nothing here is timed.
    let patient = ("REDFENCE_NODE_TIMEOUT", "5s");
    let ran = super::redfence(&servers)
        .envs([patient])
        .args(["run", "-n", "200", "-r", &name, "--", "true"])
        .output()
        .expect("run redfence");
    assert_eq!(ran.status.code(), Some(0), "run -n 200 with a 60 KB name");
    let slot = format!("{name}:semaphore:slot:150");
    for i in [0, 1] {
        let _: () = servers.cmd(i, &["SET", &slot, "fedcba9876543210", "PX", "20000"]);
    }
    let out = super::redfence(&servers)
        .envs([patient])
        .args(["status", "--json", "-n", "200", &name])
        .output()
        .expect("run redfence status");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let free: Vec<bool> = report["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r["free"].as_bool().expect("free"))
        .collect();
    assert_eq!(free.len(), 200);
    let held: Vec<usize> = (0..200).filter(|&i| !free[i]).collect();
    assert_eq!(held, [150], "the one slot held");

    let too_long = "x".repeat(65_530);
    for args in [
        &["run", "-n", "200", "-r", &too_long, "--", "true"][..],
        &["status", "-n", "200", &too_long],
    ] {
        let out = super::redfence(&servers)
            .args(args)
            .output()
            .expect("run redfence");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(super::USAGE),
            "{}",
            &stderr[..200.min(stderr.len())]
        );
        assert!(
            stderr.contains("may have at most 65517"),
            "{}: says how long the name may be",
            args[0]
        );
    }
}
