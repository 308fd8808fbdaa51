//! `redfence run --shared` / `--exclusive`: the two sides of a read-write lock, and
//! `status --rwlock`.

use std::process::{Child, Output};

use super::{BUSY, Files, USAGE, lines, redfence, spawn_run, wait_exit, wait_for};
use redfence_testkit::Servers;

/// Each job writes its own file (no shared file): its side, then its start and end on the
/// wall clock in nanoseconds, taken while it holds the lock.
fn job_script(files: &Files, side: &str, seconds: &str) -> String {
    format!(
        "f={dir}/job.$$; s=$(date +%s%N); sleep {seconds}; e=$(date +%s%N); \
         echo \"{side} $s $e\" > $f.tmp && mv $f.tmp $f",
        dir = files.dir.path().display()
    )
}

/// The (side, start, end) of every job that wrote its file.
fn jobs(files: &Files) -> Vec<(String, u128, u128)> {
    let mut jobs = Vec::new();
    for entry in std::fs::read_dir(files.dir.path()).expect("read dir") {
        let path = entry.expect("entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !name.starts_with("job.") || name.ends_with(".tmp") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("job file");
        let fields: Vec<&str> = text.split_whitespace().collect();
        let [side, start, end] = fields.as_slice() else {
            panic!("job file {name}: {text:?}");
        };
        jobs.push((
            (*side).to_owned(),
            start.parse().expect("start"),
            end.parse().expect("end"),
        ));
    }
    jobs
}

/// Six `--shared` and three `--exclusive` runs at once: all run; the shared ones side by
/// side, each exclusive one alone.
#[test]
fn shared_runs_overlap_and_exclusive_runs_run_alone() {
    let servers = Servers::start(3);
    let files = Files::new();
    let mut runs: Vec<Child> = Vec::new();
    for i in 0..9 {
        let (flag, side, secs) = if i % 3 == 2 {
            ("--exclusive", "w", "0.2")
        } else {
            ("--shared", "r", "0.5")
        };
        runs.push(spawn_run(
            &servers,
            &[flag, "-r", "config", "--wait", "60s"],
            &job_script(&files, side, secs),
        ));
    }
    for run in &mut runs {
        assert_eq!(wait_exit(run).code(), Some(0), "every run exits 0");
    }
    let jobs = jobs(&files);
    assert_eq!(jobs.len(), 9, "all nine jobs ran: {jobs:?}");
    let overlap = |a: &(String, u128, u128), b: &(String, u128, u128)| a.1 < b.2 && b.1 < a.2;
    for (i, a) in jobs.iter().enumerate() {
        for b in &jobs[i + 1..] {
            if a.0 == "w" || b.0 == "w" {
                assert!(
                    !overlap(a, b),
                    "a writer ran beside another job: {a:?} {b:?}"
                );
            }
        }
    }
    let readers: Vec<_> = jobs.iter().filter(|j| j.0 == "r").collect();
    let side_by_side = readers
        .iter()
        .enumerate()
        .any(|(i, a)| readers[i + 1..].iter().any(|b| overlap(a, b)));
    assert!(side_by_side, "shared runs never ran side by side: {jobs:?}");
}

fn status_json(servers: &Servers) -> serde_json::Value {
    let out: Output = redfence(servers)
        .args(["status", "--rwlock", "--json", "config"])
        .output()
        .expect("run redfence status");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("status --json is JSON")
}

/// A waiting `--exclusive` run holds new `--shared` runs back (they are busy) until the
/// reader it waits for leaves, then runs; `status --rwlock` shows the reader, then the
/// waiting writer.
#[test]
fn a_waiting_exclusive_run_holds_new_shared_runs_back() {
    let servers = Servers::start(3);
    let files = Files::new();
    let mut reader = spawn_run(
        &servers,
        &["--shared", "-r", "config"],
        &files.hold_until_go("reader"),
    );
    wait_for("the reader's command", || {
        lines(&files.path("log")) == ["reader"]
    });
    let report = status_json(&servers);
    assert_eq!(
        report["readers"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
    assert!(report["writer"].is_null(), "{report}");

    let wrote = files.p("wrote");
    let mut writer = redfence(&servers)
        .args(["run", "--exclusive", "-r", "config", "--wait", "60s"])
        .args(["--", "touch", &wrote])
        .spawn()
        .expect("start the writer");
    wait_for("the writer's waiting mark", || {
        status_json(&servers)["writer_waiting"] == true
    });
    let late = files.p("late");
    let busy = redfence(&servers)
        .args([
            "run",
            "--shared",
            "--no-wait",
            "-r",
            "config",
            "--",
            "touch",
            &late,
        ])
        .output()
        .expect("run a late reader");
    assert_eq!(busy.status.code(), Some(BUSY), "{busy:?}");
    assert!(
        !files.path("late").exists(),
        "the late reader's command ran"
    );
    assert!(
        !files.path("wrote").exists(),
        "the writer ran beside the reader"
    );

    files.go();
    assert_eq!(wait_exit(&mut reader).code(), Some(0));
    assert_eq!(wait_exit(&mut writer).code(), Some(0));
    assert!(
        files.path("wrote").exists(),
        "the writer ran once the reader left"
    );

    let usage = redfence(&servers)
        .args(["run", "--shared", "-r", "a", "-r", "b", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(usage.status.code(), Some(USAGE), "{usage:?}");
}
