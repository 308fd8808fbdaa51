//! No job outlives its lock: `redfence run` follows every descendant of the job (it is their
//! subreaper), not only the job's process group. A program that moves itself into a group of
//! its own (GNU `timeout`) or a session of its own (`setsid`) is still stopped, and redfence
//! exits only once none of them is left (Linux).

use std::process::Command;

use super::{Files, LOST, holders, spawn_run, wait_exit, wait_for};
use redfence_testkit::Servers;

/// The processes that have `marker` as one of their arguments (a zombie has none: it counts
/// as gone).
fn processes_with(marker: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            cmdline
                .split(|&byte| byte == 0)
                .any(|arg| arg == marker.as_bytes())
                .then(|| pid.to_string())
        })
        .collect()
}

/// A `sleep` argument that only this test of this test process uses (`1004.<test><pid>`), so
/// that two runs of the suite at once (two checkouts on one machine) never see, or kill, each
/// other's processes.
fn unique_marker(test: u8) -> String {
    format!("1004.{test}{:07}", std::process::id())
}

/// Kills what a failed test left behind (whatever carries the marker), so that a failure does
/// not leave programs running for minutes.
struct Leftovers(String);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for pid in processes_with(&self.0) {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
    }
}

#[test]
fn the_timeout_case_leaves_no_process_behind() {
    // The issue's case: GNU timeout moves itself into a process group of its own, out of the
    // job's; when the hold ends, its sleep must end too.
    let marker = &unique_marker(5);
    let _leftovers = Leftovers(marker.clone());
    let servers = Servers::start(3);
    let mut run = spawn_run(
        &servers,
        &[
            "--max-hold",
            "3s",
            "--ttl",
            "1s",
            "--kill-after",
            "1s",
            "-r",
            "x",
        ],
        &format!("timeout 100 sleep {marker}"),
    );
    wait_for("the sleep", || !processes_with(marker).is_empty());
    let status = wait_exit(&mut run);
    // At once: redfence exits only once no process of the job is left.
    let left = processes_with(marker);
    assert_eq!(status.code(), Some(LOST), "--max-hold ends the run");
    assert!(
        left.is_empty(),
        "still running after redfence exited: {left:?}"
    );
    assert_eq!(holders(&servers, "x"), 0, "the lock was released");
}

#[test]
fn a_process_outside_the_group_that_ignores_sigterm_is_killed_before_the_exit() {
    // Under timeout, a shell that ignores SIGTERM (and so do its sleeps): only SIGKILL, after
    // the grace, ends it.
    let marker = &unique_marker(6);
    let _leftovers = Leftovers(marker.clone());
    let servers = Servers::start(3);
    let files = Files::new();
    let script = format!(
        "timeout 100 sh -c \"trap '' TERM; echo up > {up}; sleep {marker}\"",
        up = files.p("up")
    );
    let mut run = spawn_run(
        &servers,
        &[
            "--max-hold",
            "3s",
            "--ttl",
            "1s",
            "--kill-after",
            "1s",
            "-r",
            "x",
        ],
        &script,
    );
    wait_for("the sleep", || !processes_with(marker).is_empty());
    let status = wait_exit(&mut run);
    let left = processes_with(marker);
    assert_eq!(status.code(), Some(LOST), "--max-hold ends the run");
    assert!(
        left.is_empty(),
        "still running after redfence exited: {left:?}"
    );
}

#[test]
fn redfence_exits_only_after_a_slow_cleanup_outside_the_group_is_done() {
    // The job leaves a shell under timeout (a group of its own) and exits; that shell traps
    // SIGTERM and takes a second to clean up, then notes it is done. The note must exist
    // when redfence exits: it waited for the last process, within --kill-after.
    let marker = &unique_marker(7);
    let _leftovers = Leftovers(marker.clone());
    let servers = Servers::start(3);
    let files = Files::new();
    let script = format!(
        "timeout 100 sh -c 'trap \"sleep 1; echo done > {done}; exit 0\" TERM; echo up > {up}; \
         while :; do sleep 0.05; done' {marker} & \
         while [ ! -e {up} ]; do sleep 0.02; done",
        done = files.p("done"),
        up = files.p("up")
    );
    let mut run = spawn_run(&servers, &["-r", "job", "--kill-after", "8s"], &script);
    wait_for("the shell under timeout", || files.path("up").exists());
    let status = wait_exit(&mut run);
    let done = files.path("done").exists();
    let left = processes_with(marker);
    assert_eq!(status.code(), Some(0), "the job's own code");
    assert!(done, "redfence exited before the cleanup was done");
    assert!(
        left.is_empty(),
        "still running after redfence exited: {left:?}"
    );
    assert_eq!(holders(&servers, "job"), 0, "the lock was released");
}

#[test]
fn what_the_job_leaves_in_a_session_of_its_own_is_stopped_before_the_release() {
    let marker = &unique_marker(8);
    let _leftovers = Leftovers(marker.clone());
    let servers = Servers::start(3);
    let files = Files::new();
    // setsid: a session (and group) of its own; the job exits once its program is in it (at
    // once, the program could still be in the job's group, and stopped as such).
    let script = format!(
        "setsid sh -c 'echo up > {up}; exec sleep {marker}' {marker} & \
         while [ ! -e {up} ]; do sleep 0.02; done",
        up = files.p("up")
    );
    let mut run = spawn_run(&servers, &["-r", "job"], &script);
    let status = wait_exit(&mut run);
    let left = processes_with(marker);
    assert_eq!(status.code(), Some(0), "the job's own code");
    assert!(
        files.path("up").exists(),
        "the job did not start its program"
    );
    assert!(
        left.is_empty(),
        "still running after redfence exited: {left:?}"
    );
    assert_eq!(holders(&servers, "job"), 0, "the lock was released");
}
