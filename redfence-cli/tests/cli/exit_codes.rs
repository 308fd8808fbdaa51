//! Exit codes and usage checks of the `redfence` command at their edges (from an adversarial
//! review: each test failed before its fix).

use std::process::Output;

use redfence_testkit::Servers;

use super::{UNAVAILABLE, USAGE, redfence_at};

fn run(nodes: &str, args: &[&str]) -> Output {
    redfence_at(nodes)
        .args(args)
        .output()
        .expect("run redfence")
}

/// README: "69 quorum unreachable ... (at least 3 attempts, retried within `--wait`)". With no
/// server up, `run -w 1s`, `run --shared -w 1s` and `run --exclusive -w 1s` exit 69 and say
/// why (the last once exited 75, "busy", silently under `-q`: its wait runs inside the library,
/// whose `AcquireTimeout` wraps the `QuorumUnreachable`).
#[test]
fn an_exclusive_wait_on_unreachable_nodes_is_unavailable_not_busy() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ran = dir.path().join("ran").display().to_string();
    let nodes = "redis://127.0.0.1:1";
    for side in ["--shared", "--exclusive"] {
        let out = run(
            nodes,
            &[
                "-q", "run", side, "-w", "1s", "-r", "cfg", "--", "touch", &ran,
            ],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(UNAVAILABLE),
            "{side} -w 1s with no server up: {stderr:?}"
        );
        assert!(
            stderr.contains("unreachable"),
            "{side}: the message names the problem: {stderr:?}"
        );
    }
    assert!(!dir.path().join("ran").exists(), "nothing ran");
}

/// `-n N` and `--shared`/`--exclusive` "need exactly one -r": without one they are a usage
/// error (they once ran the command on a semaphore or rwlock named after the default
/// `redfence:run:<hash>` resource).
#[test]
fn permits_or_a_side_without_a_resource_is_a_usage_error() {
    let servers = Servers::start(1);
    let nodes = servers.urls().join(",");
    let dir = tempfile::tempdir().expect("temp dir");
    let ran = dir.path().join("ran").display().to_string();
    for flags in [&["-n", "2"][..], &["--shared"], &["--exclusive"]] {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.extend(["--", "touch", ran.as_str()]);
        let out = run(&nodes, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(USAGE),
            "{flags:?} without -r: {stderr:?}"
        );
        assert!(stderr.contains("-r"), "{flags:?}: {stderr:?}");
        assert!(
            !dir.path().join("ran").exists(),
            "{flags:?}: the command ran"
        );
        assert!(
            servers.keys(0).is_empty(),
            "{flags:?}: keys were written: {:?}",
            servers.keys(0)
        );
    }
}
