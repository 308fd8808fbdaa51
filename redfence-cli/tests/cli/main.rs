//! The `redfence` binary against real redis-server processes: `run` (exclusion, waiting,
//! exit codes, signals, loss); `status`, `release --force` and usage errors
//! (`commands.rs`); `--min-hold` (`hold.rs`); the command's own processes (`processes.rs`),
//! and those that left its group or session (`descendants.rs`); the job's environment
//! (`environment.rs`); a fencing counter that fails once (`fencing.rs`); a terminal's
//! foreground (`terminal.rs`); `-n K`, a semaphore's permits (`semaphore.rs`); `--shared` /
//! `--exclusive`, a read-write lock (`rwlock.rs`); nothing a refused run wrote outlives it,
//! and a refusal during the restart quarantine is busy (`left_behind.rs`); SIGKILL before
//! a lost lock's validity ends (`lost.rs`).
//!
//! The servers come from the workspace's harness, `redfence-testkit` (`testkit/`).

mod commands;
mod descendants;
mod environment;
mod exit_codes;
mod fencing;
mod hold;
mod left_behind;
mod lost;
mod processes;
mod rwlock;
mod semaphore;
mod terminal;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redfence_testkit::{DEADLINE, Servers};

const BUSY: i32 = 75;
const LOST: i32 = 79;
const USAGE: i32 = 64;
const UNAVAILABLE: i32 = 69;

/// The binary, pointed at every server, with a node timeout that suits a loaded machine. In
/// a process group of its own: run from a terminal's foreground (a developer's shell), it
/// would keep the job in its own group, and the tests are of the cron case.
fn redfence(servers: &Servers) -> Command {
    redfence_at(&servers.urls().join(","))
}

/// The binary pointed at `nodes` (`host:port,...`), as [`redfence`] does.
fn redfence_at(nodes: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_redfence"));
    as_the_tests_run_it(&mut command, nodes);
    command
}

/// `command` (the binary, or a program that runs it) in a process group of its own, pointed
/// at `nodes` with the tests' node timeout, and none of the caller's redfence settings.
fn as_the_tests_run_it(command: &mut Command, nodes: &str) {
    std::os::unix::process::CommandExt::process_group(command, 0);
    command
        .env("REDFENCE_NODES", nodes)
        .env("REDFENCE_NODE_TIMEOUT", "200ms")
        .env_remove("RUST_LOG")
        .env_remove("REDFENCE_FENCING")
        .env_remove("REDFENCE_NODES_FILE")
        .env_remove("REDFENCE_KEY_PREFIX")
        .stdin(Stdio::null());
}

/// `redfence run ARGS -- sh -c SCRIPT`, started in the background.
fn spawn_run(servers: &Servers, args: &[&str], script: &str) -> Child {
    redfence(servers)
        .arg("run")
        .args(args)
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start redfence")
}

/// Polls `cond` every 10 ms until it holds; panics after [`DEADLINE`].
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for a child to exit within [`DEADLINE`] (killing it otherwise) and returns its
/// status.
fn wait_exit(child: &mut Child) -> ExitStatus {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("redfence did not exit within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Collects a child's stderr lines in the background.
fn collect_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    let stderr = child.stderr.take().expect("stderr piped");
    let text = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&text);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut text = sink.lock().expect("stderr buffer");
            text.push_str(&line);
            text.push('\n');
        }
    });
    text
}

fn send_signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .arg(signal)
        .arg(child.id().to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} failed");
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A temp dir with helper paths for the child scripts.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Self {
        Files {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn p(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }
    /// A script that appends `tag` to `log`, then blocks until `go` exists.
    fn hold_until_go(&self, tag: &str) -> String {
        format!(
            "echo {tag} >> {log}; while [ ! -e {go} ]; do sleep 0.02; done",
            log = self.p("log"),
            go = self.p("go")
        )
    }
    fn go(&self) {
        std::fs::write(self.path("go"), "").expect("write go");
    }
}

fn holders(servers: &Servers, key: &str) -> usize {
    (0..servers.len())
        .filter(|&i| servers.get(i, key).is_some())
        .count()
}

#[test]
fn two_racing_runs_run_the_command_once() {
    let servers = Servers::start(3);
    let files = Files::new();
    let script = files.hold_until_go("ran");
    let mut a = spawn_run(&servers, &["-r", "job"], &script);
    let mut b = spawn_run(&servers, &["-r", "job"], &script);
    // The loser exits with the busy code while the winner's command is still blocked.
    let deadline = Instant::now() + DEADLINE;
    let (loser, mut winner) = loop {
        if let Some(status) = a.try_wait().expect("try_wait") {
            break (status, b);
        }
        if let Some(status) = b.try_wait().expect("try_wait") {
            break (status, a);
        }
        assert!(Instant::now() < deadline, "neither run gave up");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(loser.code(), Some(BUSY));
    wait_for("the winner's command", || {
        lines(&files.path("log")).len() == 1
    });
    files.go();
    assert_eq!(wait_exit(&mut winner).code(), Some(0));
    assert_eq!(
        lines(&files.path("log")),
        ["ran"],
        "exactly one command ran"
    );
    assert_eq!(holders(&servers, "job"), 0, "released after the run");
}

#[test]
fn no_wait_exits_at_once_with_the_busy_code() {
    let servers = Servers::start(3);
    let files = Files::new();
    let mut holder = spawn_run(&servers, &["-r", "job"], &files.hold_until_go("first"));
    wait_for("the first command", || {
        !lines(&files.path("log")).is_empty()
    });

    let started = Instant::now();
    let ran = files.p("ran");
    let busy = redfence(&servers)
        .args(["run", "--no-wait", "-r", "job", "--", "touch", &ran])
        .output()
        .expect("run redfence");
    assert_eq!(busy.status.code(), Some(BUSY), "{busy:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "--no-wait took {:?}",
        started.elapsed()
    );
    let custom = redfence(&servers)
        .args([
            "run",
            "--busy-exit-code",
            "3",
            "-r",
            "job",
            "--",
            "touch",
            &ran,
        ])
        .output()
        .expect("run redfence");
    assert_eq!(custom.status.code(), Some(3), "{custom:?}");
    assert!(
        !files.path("ran").exists(),
        "a busy run never starts the command"
    );

    files.go();
    assert_eq!(wait_exit(&mut holder).code(), Some(0));
}

#[test]
fn wait_gets_the_lock_when_the_first_run_finishes() {
    let servers = Servers::start(3);
    let files = Files::new();
    let mut first = spawn_run(&servers, &["-r", "job"], &files.hold_until_go("first"));
    wait_for("the first command", || {
        !lines(&files.path("log")).is_empty()
    });

    let second_script = format!("echo second >> {}", files.p("log"));
    let mut second = spawn_run(&servers, &["-r", "job", "--wait", "10s"], &second_script);
    let stderr = collect_stderr(&mut second);
    wait_for("the waiting line", || {
        stderr
            .lock()
            .expect("stderr buffer")
            .contains("waiting for lock on job")
    });
    assert!(
        second.try_wait().expect("try_wait").is_none(),
        "still waiting"
    );

    files.go();
    assert_eq!(wait_exit(&mut first).code(), Some(0));
    assert_eq!(wait_exit(&mut second).code(), Some(0));
    assert_eq!(lines(&files.path("log")), ["first", "second"]);
}

#[test]
fn the_commands_exit_code_and_death_by_signal_come_back() {
    let servers = Servers::start(3);
    let run = |args: &[&str]| -> Output {
        redfence(&servers)
            .arg("run")
            .args(args)
            .output()
            .expect("run redfence")
    };
    assert_eq!(run(&["--", "sh", "-c", "exit 7"]).status.code(), Some(7));
    assert_eq!(run(&["--", "true"]).status.code(), Some(0));
    assert_eq!(
        run(&["--", "sh", "-c", "kill -TERM $$"]).status.code(),
        Some(128 + 15)
    );
    assert_eq!(
        run(&["--", "sh", "-c", "kill -KILL $$"]).status.code(),
        Some(128 + 9)
    );
    assert_eq!(
        run(&["--shell", "--", "exit", "5"]).status.code(),
        Some(5),
        "--shell runs the words through sh -c"
    );
    assert_eq!(
        run(&["--", "/nonexistent/command"]).status.code(),
        Some(127)
    );
    // The child learns about its lock through its environment.
    let env = run(&[
        "-r",
        "a",
        "-r",
        "b",
        "--ttl",
        "7s",
        "--",
        "sh",
        "-c",
        "echo \"$REDFENCE_RESOURCES $REDFENCE_TTL_MS ${REDFENCE_FENCE-none}\"",
    ]);
    assert_eq!(String::from_utf8_lossy(&env.stdout).trim(), "a,b 7000 none");
    let fenced = run(&[
        "-r",
        "a",
        "--fencing",
        &servers.url(0),
        "--",
        "sh",
        "-c",
        "echo $REDFENCE_FENCE",
    ]);
    assert_eq!(String::from_utf8_lossy(&fenced.stdout).trim(), "1");
}

#[test]
fn sigterm_to_redfence_reaches_the_child_and_the_lock_is_released() {
    let servers = Servers::start(3);
    let files = Files::new();
    let script = format!(
        "trap 'echo term > {term}; exit 3' TERM; echo up > {up}; while true; do sleep 0.02; done",
        term = files.p("term"),
        up = files.p("up")
    );
    let mut run = spawn_run(&servers, &["-r", "job"], &script);
    wait_for("the command", || files.path("up").exists());
    wait_for("the key on every node", || holders(&servers, "job") == 3);

    send_signal(&run, "-TERM");
    let status = wait_exit(&mut run);
    assert_eq!(
        status.code(),
        Some(3),
        "the command's own code after its TERM trap"
    );
    assert_eq!(lines(&files.path("term")), ["term"]);
    assert_eq!(holders(&servers, "job"), 0, "the lock was released");
}

#[test]
fn a_lock_the_nodes_no_longer_hold_for_us_stops_the_child_without_grace() {
    let servers = Servers::start(3);
    let files = Files::new();
    // A command whose TERM trap takes 200 ms to finish: SIGKILL right after SIGTERM cuts
    // it short; a grace of what is left of the lease (about the extension threshold, 500
    // ms, when the round that finds the lock gone runs) would let it finish.
    let script = format!(
        "trap 'sleep 0.2; echo late > {late}; exit 0' TERM; echo up > {up}; \
         while true; do sleep 0.02; done",
        late = files.p("late"),
        up = files.p("up")
    );
    let mut run = spawn_run(
        &servers,
        &["-r", "job", "--ttl", "3s", "--kill-after", "30s"],
        &script,
    );
    wait_for("the command", || files.path("up").exists());
    // Another owner's token on every node (a forced release and a new holder): the next
    // extension round hears that the lock is not ours any more.
    for node in 0..3 {
        let _: () = servers.cmd(node, &["SET", "job", "another-owner", "PX", "60000"]);
    }
    assert_eq!(wait_exit(&mut run).code(), Some(LOST));
    assert!(
        !files.path("late").exists(),
        "the command went on after the nodes said another owner holds the lock"
    );
}

#[test]
fn a_lost_majority_stops_the_child_before_the_ttl_runs_out() {
    let mut servers = Servers::start(3);
    let files = Files::new();
    let ttl = Duration::from_secs(4);
    let script = format!(
        "trap 'echo term > {term}; exit 0' TERM; echo up > {up}; while true; do sleep 0.02; done",
        term = files.p("term"),
        up = files.p("up")
    );
    let mut run = spawn_run(
        &servers,
        &["-r", "job", "--ttl", "4s", "--kill-after", "10s"],
        &script,
    );
    wait_for("the command", || files.path("up").exists());

    // The lock's validity ends at most one TTL after the last extension, before this.
    let killed = Instant::now();
    servers.kill(0);
    servers.kill(1);
    wait_for("SIGTERM in the command", || files.path("term").exists());
    let stopped_after = killed.elapsed();
    assert!(
        stopped_after < ttl,
        "the command got SIGTERM {stopped_after:?} after the majority died, past the {ttl:?} TTL"
    );
    assert_eq!(wait_exit(&mut run).code(), Some(LOST));
}
