//! `redfence run --fencing`: a counter that fails once (the lock is then released: fail
//! closed) is retried within `--wait`, as an unreachable node is.

use std::process::Stdio;

use super::redfence;
use redfence_testkit::Servers;

#[test]
fn a_counter_that_misses_one_batch_is_retried_within_wait() {
    let servers = Servers::start(3);
    let counter = Servers::start(1);
    // Longer than the CLI's 1 s fencing timeout: the first token request fails.
    let () = counter.cmd(0, &["CLIENT", "PAUSE", "1500", "ALL"]);
    let out = redfence(&servers)
        .args(["run", "-r", "job", "--wait", "10s", "--fencing"])
        .arg(counter.url(0))
        .args(["--", "sh", "-c", "echo $REDFENCE_FENCE"])
        .stderr(Stdio::piped())
        .output()
        .expect("run redfence");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let fence = String::from_utf8_lossy(&out.stdout);
    assert!(
        fence.trim().parse::<u64>().is_ok_and(|f| f > 0),
        "the job got a token: {fence:?}"
    );
}
