//! `redfence run` in the foreground of a terminal (a pseudo-terminal made by `script`), where
//! the job shares redfence's process group: what the terminal sends the group reaches the job
//! once, not once from the terminal and again from redfence.

use std::io::Write;
use std::process::{Command, Stdio};

use super::{Files, lines, wait_exit, wait_for};
use redfence_testkit::Servers;

/// A job that notes every SIGINT and SIGUSR1 it gets, and its parent (redfence), then waits
/// for `go`.
const JOB: &str = r#"
import os, signal, sys, time
log, go = sys.argv[1], sys.argv[2]
def note(line):
    with open(log, "a") as f:
        f.write(line + "\n")
signal.signal(signal.SIGINT, lambda *_: note("int"))
signal.signal(signal.SIGUSR1, lambda *_: note("usr1"))
note("parent %d" % os.getppid())
while not os.path.exists(go):
    time.sleep(0.01)
"#;

#[test]
fn ctrl_c_in_a_terminal_reaches_the_job_once() {
    let servers = Servers::start(3);
    let files = Files::new();
    std::fs::write(files.path("job.py"), JOB).expect("write the job");
    let line = format!(
        "exec {bin} run -r job -- python3 {job} {log} {go}",
        bin = env!("CARGO_BIN_EXE_redfence"),
        job = files.p("job.py"),
        log = files.p("log"),
        go = files.p("go"),
    );
    // `script` runs the line in a session of its own on a pseudo-terminal, in its foreground;
    // what is written to its stdin is typed at that terminal.
    let mut terminal = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("REDFENCE_NODES", servers.urls().join(","))
        .env("REDFENCE_NODE_TIMEOUT", "200ms")
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start script (util-linux)");
    let parent = || {
        lines(&files.path("log"))
            .iter()
            .find_map(|line| line.strip_prefix("parent ").map(str::to_owned))
    };
    wait_for("the job", || parent().is_some());
    let redfence = parent().expect("the job's parent");

    let mut keyboard = terminal.stdin.take().expect("stdin piped");
    keyboard.write_all(b"\x03").expect("type Ctrl-C");
    keyboard.flush().expect("flush");
    wait_for("the job's SIGINT", || {
        lines(&files.path("log")).iter().any(|l| l == "int")
    });
    // A signal sent to redfence alone is forwarded, after anything it forwarded for Ctrl-C.
    let status = Command::new("kill")
        .args(["-USR1", &redfence])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -USR1 {redfence}");
    wait_for("the forwarded SIGUSR1", || {
        lines(&files.path("log")).iter().any(|l| l == "usr1")
    });
    let log = lines(&files.path("log"));
    assert_eq!(
        log.iter().filter(|l| *l == "int").count(),
        1,
        "Ctrl-C reached the job more than once: {log:?}"
    );

    files.go();
    drop(keyboard);
    assert_eq!(wait_exit(&mut terminal).code(), Some(0));
}
