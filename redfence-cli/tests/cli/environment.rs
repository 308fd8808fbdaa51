//! The job's environment: its lock (`REDFENCE_RESOURCES`, `REDFENCE_TTL_MS`,
//! `REDFENCE_FENCE`), and not redfence's URLs (`REDFENCE_NODES`, `REDFENCE_FENCING`, which may
//! hold passwords) unless `--pass-env` asks for them.

use std::process::Output;

use super::redfence;
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
