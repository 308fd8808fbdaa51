//! What the command starts: `redfence run` signals and stops the command's whole process
//! group, so that nothing it started (a shell script's own programs) runs on after the lock
//! is released or lost, and nothing outlives the lease by `--kill-after`.

use std::time::{Duration, Instant};

use super::{Files, LOST, holders, send_signal, spawn_run, wait_exit, wait_for};
use redfence_testkit::Servers;

/// Whether process `pid` (read from `file`) still exists: a zombie still counts, which is
/// why redfence reaps what it adopts.
fn alive(file: &std::path::Path) -> bool {
    let pid = std::fs::read_to_string(file).expect("pid file");
    std::path::Path::new(&format!("/proc/{}", pid.trim())).exists()
}

#[test]
fn what_the_command_left_running_is_stopped_before_the_release() {
    let servers = Servers::start(3);
    let files = Files::new();
    // The command starts a background program and exits at once, leaving it running.
    let script = format!("sleep 30 & echo $! > {pid}", pid = files.p("pid"));
    let mut run = spawn_run(&servers, &["-r", "job"], &script);
    assert_eq!(wait_exit(&mut run).code(), Some(0));
    assert!(
        !alive(&files.path("pid")),
        "the background program outlived the lock"
    );
    assert_eq!(holders(&servers, "job"), 0, "the lock was released");
}

#[test]
fn sigterm_to_redfence_reaches_the_commands_own_programs() {
    let servers = Servers::start(3);
    let files = Files::new();
    let script = format!(
        "sleep 30 & echo $! > {pid}; echo up > {up}; wait",
        pid = files.p("pid"),
        up = files.p("up")
    );
    let mut run = spawn_run(&servers, &["-r", "job"], &script);
    wait_for("the command", || files.path("up").exists());
    assert!(alive(&files.path("pid")));

    send_signal(&run, "-TERM");
    // The shell died of SIGTERM: 128 + 15.
    assert_eq!(wait_exit(&mut run).code(), Some(143));
    assert!(
        !alive(&files.path("pid")),
        "the shell's child kept running after SIGTERM and the release"
    );
    assert_eq!(holders(&servers, "job"), 0, "the lock was released");
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_before_the_lease_ends() {
    let mut servers = Servers::start(3);
    let files = Files::new();
    let ttl = Duration::from_secs(4);
    // TERM ignored by the shell and (inherited) by its sleeps; --kill-after far beyond the TTL.
    let script = format!(
        "trap '' TERM; echo $$ > {pid}; while true; do sleep 0.02; done",
        pid = files.p("pid")
    );
    let mut run = spawn_run(
        &servers,
        &["-r", "job", "--ttl", "4s", "--kill-after", "60s"],
        &script,
    );
    wait_for("the command", || files.path("pid").exists());

    // The lock's validity ends at most one TTL after the last extension.
    let killed = Instant::now();
    servers.kill(0);
    servers.kill(1);
    assert_eq!(wait_exit(&mut run).code(), Some(LOST));
    let stopped_after = killed.elapsed();
    assert!(!alive(&files.path("pid")), "the command outlived redfence");
    assert!(
        stopped_after < ttl + Duration::from_secs(1),
        "the command ran {stopped_after:?} after the majority died, past the {ttl:?} lease"
    );
}

/// The state letter of process `pid` (`R`, `S`, `T` stopped, `Z` zombie), if it exists.
fn state(pid: &str) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name, in parentheses (which may hold spaces).
    stat.rsplit_once(") ")?.1.chars().next()
}

#[test]
fn a_stopped_command_still_gets_a_forwarded_signal() {
    let servers = Servers::start(3);
    let files = Files::new();
    let script = format!(
        "echo $$ > {pid}; kill -STOP $$; echo resumed",
        pid = files.p("pid")
    );
    let mut run = spawn_run(&servers, &["-r", "job"], &script);
    wait_for("the command to stop itself", || {
        std::fs::read_to_string(files.path("pid")).is_ok_and(|pid| state(pid.trim()) == Some('T'))
    });
    send_signal(&run, "-TERM");
    // SIGCONT follows the forwarded SIGTERM: the command dies of it instead of keeping the
    // signal pending (and the lock) for good.
    assert_eq!(wait_exit(&mut run).code(), Some(143));
    assert_eq!(holders(&servers, "job"), 0, "the lock was released");
}

#[test]
fn orphans_the_command_leaves_while_it_runs_are_reaped_at_once() {
    let servers = Servers::start(3);
    let files = Files::new();
    // Twenty programs that the shell disowns at once (they become redfence's: it is their
    // subreaper) and that exit right away; then the command waits for `go`.
    let script = format!(
        "for i in $(seq 20); do (sh -c 'echo $$ >> {pids}' &); done; {hold}",
        pids = files.p("pids"),
        hold = files.hold_until_go("up")
    );
    let mut run = spawn_run(&servers, &["-r", "job"], &script);
    wait_for("twenty orphans", || {
        super::lines(&files.path("pids")).len() == 20
    });
    // While the command still runs, none is left as a zombie.
    wait_for("the orphans reaped", || {
        super::lines(&files.path("pids"))
            .iter()
            .all(|pid| state(pid).is_none())
    });
    assert!(run.try_wait().expect("try_wait").is_none(), "still running");
    files.go();
    assert_eq!(wait_exit(&mut run).code(), Some(0));
}
