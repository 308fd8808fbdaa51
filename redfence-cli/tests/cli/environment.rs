//! The job's environment: its lock (`REDFENCE_RESOURCES`, `REDFENCE_TTL_MS`,
//! `REDFENCE_FENCE`), and not redfence's URLs (`REDFENCE_NODES`, `REDFENCE_FENCING`, which may
//! hold passwords, nor `REDFENCE_NODES_FILE`) unless `--pass-env` asks for them; nor can it
//! read them from redfence's own environment in /proc. `--nodes-file`.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

use super::{USAGE, redfence, redfence_at};
use redfence_testkit::Servers;

/// `env` run under the lock, with the counter's URL in `REDFENCE_FENCING`.
fn env_of_the_job(servers: &Servers, extra: &[&str]) -> Output {
    redfence(servers)
        .env("REDFENCE_FENCING", servers.url(0))
        .args(["run", "-r", "job"])
        .args(extra)
        .args(["--", "env"])
        .output()
        .expect("run redfence")
}

/// The value of `name` in `env`'s output.
fn variable<'a>(env: &'a str, name: &str) -> Option<&'a str> {
    env.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix('='))
}

#[test]
fn the_job_does_not_get_the_nodes_or_the_counter_url() {
    let servers = Servers::start(3);
    let out = env_of_the_job(&servers, &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let env = String::from_utf8_lossy(&out.stdout);
    assert_eq!(variable(&env, "REDFENCE_NODES"), None, "{env}");
    assert_eq!(variable(&env, "REDFENCE_FENCING"), None, "{env}");
    // What it learns about its lock, it still gets.
    assert_eq!(variable(&env, "REDFENCE_RESOURCES"), Some("job"), "{env}");
    assert_eq!(variable(&env, "REDFENCE_TTL_MS"), Some("30000"), "{env}");
    assert_eq!(variable(&env, "REDFENCE_FENCE"), Some("1"), "{env}");
}

#[test]
fn pass_env_lets_the_job_have_them() {
    let servers = Servers::start(3);
    let out = env_of_the_job(&servers, &["--pass-env"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let env = String::from_utf8_lossy(&out.stdout);
    let nodes = servers.urls().join(",");
    let counter = servers.url(0);
    assert_eq!(
        variable(&env, "REDFENCE_NODES"),
        Some(nodes.as_str()),
        "{env}"
    );
    assert_eq!(
        variable(&env, "REDFENCE_FENCING"),
        Some(counter.as_str()),
        "{env}"
    );
    assert_eq!(variable(&env, "REDFENCE_RESOURCES"), Some("job"), "{env}");
}

/// The password of the servers' `locker` user, in the node URLs.
const PASSWORD: &str = "s3cret-d0nt-l3ak";

/// Three servers with an ACL user `locker` whose password is [`PASSWORD`]; their URLs with it.
fn servers_with_a_password() -> (Servers, Vec<String>) {
    let servers = Servers::start(3);
    for i in 0..3 {
        let pass = format!(">{PASSWORD}");
        let _: () = servers.cmd(
            i,
            &["ACL", "SETUSER", "locker", "on", &pass, "~*", "&*", "+@all"],
        );
    }
    let urls = (0..3)
        .map(|i| format!("redis://locker:{PASSWORD}@127.0.0.1:{}", servers.port(i)))
        .collect();
    (servers, urls)
}

/// `setpriv`'s arguments for user and group 65534 (nobody), with no other group.
const NOBODY: [&str; 3] = ["--reuid=65534", "--regid=65534", "--clear-groups"];

/// The binary run as nobody by `setpriv` (util-linux), with the environment [`redfence_at`]
/// sets; `None` (the reason printed) when that user cannot run it here.
fn redfence_as_nobody(nodes: &str) -> Option<Command> {
    let binary = env!("CARGO_BIN_EXE_redfence");
    let probe = Command::new("setpriv")
        .args(NOBODY)
        .args([binary, "--version"])
        .current_dir("/")
        .output();
    match probe {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            eprintln!(
                "skipped: user 65534 cannot run {binary} through setpriv: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return None;
        }
        Err(err) => {
            eprintln!("skipped: no setpriv (util-linux) to run {binary} as user 65534: {err}");
            return None;
        }
    }
    let mut command = Command::new("setpriv");
    command.args(NOBODY).arg(binary).current_dir("/");
    super::as_the_tests_run_it(&mut command, nodes);
    Some(command)
}

/// Issue 38: run by an unprivileged user (root reads every /proc file, whatever the process
/// allows), the job cannot read the node password from its parent's environment in
/// `/proc/$PPID/environ` (redfence is not dumpable: the file is root's), nor from its own.
/// (It could: `cat /proc/$PPID/environ` printed `REDFENCE_NODES=redis://locker:…@…`.)
#[test]
fn a_job_cannot_read_the_node_password_from_its_parent_or_its_own_environment() {
    let (_servers, urls) = servers_with_a_password();
    let Some(mut command) = redfence_as_nobody(&urls.join(",")) else {
        return;
    };
    let script = "echo ran as $(id -u); \
                  if tr '\\0' '\\n' < /proc/$PPID/environ; then echo parent-environ-read; fi; \
                  env";
    let out = command
        .args(["run", "-r", "job", "--", "sh", "-c", script])
        .output()
        .expect("run redfence as nobody");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("ran as 65534"), "the job ran: {stdout}");
    assert!(
        !stdout.contains(PASSWORD),
        "the job read the password:\n{stdout}"
    );
    assert!(
        !stdout.contains("parent-environ-read"),
        "the job read redfence's environment:\n{stdout}"
    );
    assert_eq!(variable(&stdout, "REDFENCE_NODES"), None, "{stdout}");
}

/// A nodes file with the mode given, holding `text`, in a temp dir.
fn nodes_file(text: &str, mode: u32) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("nodes");
    std::fs::write(&path, text).expect("write the nodes file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    let path = path.display().to_string();
    (dir, path)
}

/// `--nodes-file`: one URL per line, comments and blank lines skipped; the job gets neither
/// the file's path nor the URLs.
#[test]
fn nodes_come_from_a_file_only_its_owner_can_read() {
    let (_servers, urls) = servers_with_a_password();
    let text = format!(
        "# the lock servers\n{}\n\n   {}   # the second\n{}\n",
        urls[0], urls[1], urls[2]
    );
    let (_dir, path) = nodes_file(&text, 0o600);
    let out = redfence_at("")
        .env_remove("REDFENCE_NODES")
        .env("REDFENCE_NODES_FILE", &path)
        .args(["run", "-r", "job", "--", "env"])
        .output()
        .expect("run redfence");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(variable(&stdout, "REDFENCE_NODES_FILE"), None, "{stdout}");
    assert!(!stdout.contains(PASSWORD), "{stdout}");
    assert_eq!(
        variable(&stdout, "REDFENCE_RESOURCES"),
        Some("job"),
        "{stdout}"
    );
}

/// A nodes file that group or others may read is refused (64) and says how to fix it, as
/// is a file with two words on a line, and nodes given both ways. Nothing runs.
#[test]
fn a_nodes_file_others_may_read_is_refused() {
    let (_servers, urls) = servers_with_a_password();
    let dir = tempfile::tempdir().expect("temp dir");
    let ran = dir.path().join("ran").display().to_string();
    let run = |command: &mut Command| {
        command
            .args(["run", "-r", "job", "--", "touch", &ran])
            .output()
            .expect("run redfence")
    };
    for mode in [0o644, 0o640, 0o604] {
        let (_dir, path) = nodes_file(&urls.join("\n"), mode);
        let out = run(redfence_at("")
            .env_remove("REDFENCE_NODES")
            .args(["--nodes-file", &path]));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(USAGE), "mode {mode:o}: {stderr}");
        assert!(stderr.contains("chmod 600"), "mode {mode:o}: {stderr}");
        assert!(!stderr.contains(PASSWORD), "{stderr}");
    }
    let (_dir, path) = nodes_file(&format!("{} {}\n", urls[0], urls[1]), 0o600);
    let out = run(redfence_at("")
        .env_remove("REDFENCE_NODES")
        .args(["--nodes-file", &path]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(USAGE), "{stderr}");
    assert!(stderr.contains("line 1"), "{stderr}");

    let (_dir, path) = nodes_file(&urls.join("\n"), 0o600);
    let out = run(redfence_at(&urls.join(",")).args(["--nodes-file", &path]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(USAGE), "{stderr}");
    assert!(stderr.contains("one way"), "{stderr}");
    assert!(!dir.path().join("ran").exists(), "the command ran");
}
