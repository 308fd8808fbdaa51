//! `--min-hold`: the lock stays after a quick command, so that a twin whose clock is late
//! cannot run the same slot; when it cannot stay, the log says so loudly.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::{Files, holders, redfence, spawn_run, wait_exit, wait_for};
use redfence_testkit::Servers;

#[test]
fn min_hold_keeps_the_key_after_a_fast_child() {
    let servers = Servers::start(3);
    let files = Files::new();
    let started = Instant::now();
    let script = format!("echo done > {}", files.p("done"));
    let mut run = spawn_run(&servers, &["-r", "job", "--min-hold", "3s"], &script);
    wait_for("the command", || files.path("done").exists());
    assert!(
        holders(&servers, "job") >= 2,
        "held after the command ended"
    );

    assert_eq!(wait_exit(&mut run).code(), Some(0));
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "released after {:?}, before --min-hold",
        started.elapsed()
    );
    assert_eq!(holders(&servers, "job"), 0, "released after --min-hold");
}

#[test]
fn a_min_hold_cut_short_is_an_error_even_with_quiet() {
    let mut servers = Servers::start(3);
    let files = Files::new();
    let mut run = redfence(&servers)
        .args([
            "-q",
            "run",
            "-r",
            "job",
            "--ttl",
            "2s",
            "--min-hold",
            "1h",
            "--",
        ])
        .args(["sh", "-c", &format!("echo done > {}", files.p("done"))])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start redfence");
    wait_for("the command", || files.path("done").exists());

    // The majority goes: the lock cannot be kept for the hour.
    let killed = Instant::now();
    servers.kill(0);
    servers.kill(1);
    assert_eq!(
        wait_exit(&mut run).code(),
        Some(0),
        "the command's own code"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(30),
        "redfence stayed {:?} after its lock was lost",
        killed.elapsed()
    );
    // With -q, what it wrote is a line or two: it fits the pipe, read once it exited.
    let mut stderr = String::new();
    run.stderr
        .take()
        .expect("stderr piped")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    assert!(
        stderr.contains("during --min-hold") && stderr.contains("before --min-hold does"),
        "no error about the cut-short hold under -q: {stderr:?}"
    );
}
