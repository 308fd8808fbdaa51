//! `redfence status` (a table, and JSON), `release --force`, and usage errors (exit 64, one
//! line).

use std::process::Output;

use redfence_testkit::Servers;

use super::{Files, USAGE, holders, lines, redfence, spawn_run, wait_exit, wait_for};

#[test]
fn status_shows_the_holder_and_its_json_parses() {
    let servers = Servers::start(3);
    let token = "0123456789abcdef0123456789abcdef";
    for i in [0, 1] {
        let _: () = servers.cmd(i, &["SET", "locks:job", token, "PX", "20000"]);
    }
    let status = |extra: &[&str]| -> Output {
        redfence(&servers)
            .args(["--key-prefix", "locks:", "status"])
            .args(extra)
            .output()
            .expect("run redfence status")
    };

    let table = status(&["job"]);
    assert_eq!(table.status.code(), Some(0), "{table:?}");
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("held by one owner (01234567) on 2/3 nodes"),
        "{text}"
    );
    assert!(text.contains("advisory"), "{text}");
    assert!(
        !text.contains(token),
        "only a prefix of the token is shown: {text}"
    );

    let json = status(&["--json", "job", "other"]);
    assert_eq!(json.status.code(), Some(0), "{json:?}");
    let report: serde_json::Value =
        serde_json::from_slice(&json.stdout).expect("status --json is JSON");
    assert_eq!(report["advisory"], true);
    assert_eq!(report["quorum"], 2);
    let job = &report["resources"][0];
    assert_eq!(job["key"], "locks:job");
    assert_eq!(job["owner"]["token_prefix"], "01234567");
    assert_eq!(job["owner"]["nodes"], serde_json::json!([0, 1]));
    let left = job["owner"]["majority_ttl_ms"].as_u64().expect("a TTL");
    assert!((5_000..=20_000).contains(&left), "{left} ms left");
    assert_eq!(job["nodes"][2]["state"], "absent");
    assert_eq!(job["nodes"][0]["state"], "held");
    let other = &report["resources"][1];
    assert_eq!(other["free"], true);
    assert!(other["owner"].is_null());
}

#[test]
fn release_force_frees_the_lock() {
    let servers = Servers::start(3);
    let files = Files::new();
    let mut holder = spawn_run(
        &servers,
        &["-r", "job", "--ttl", "60s"],
        &files.hold_until_go("first"),
    );
    wait_for("the first command", || {
        !lines(&files.path("log")).is_empty()
    });
    wait_for("the key on every node", || holders(&servers, "job") == 3);

    // Without --yes and without a terminal, nothing is deleted.
    let refused = redfence(&servers)
        .args(["release", "--force", "job"])
        .output()
        .expect("run redfence release");
    assert_eq!(refused.status.code(), Some(USAGE), "{refused:?}");
    wait_for("the key on every node", || holders(&servers, "job") == 3);

    let released = redfence(&servers)
        .args(["release", "--force", "--yes", "job"])
        .output()
        .expect("run redfence release");
    assert_eq!(released.status.code(), Some(0), "{released:?}");
    let out = String::from_utf8_lossy(&released.stdout);
    assert_eq!(out.matches("job: deleted (held by ").count(), 3, "{out}");
    assert!(
        String::from_utf8_lossy(&released.stderr).contains("fencing"),
        "the warning names fencing"
    );
    assert_eq!(holders(&servers, "job"), 0);

    // Free: another run takes it at once.
    let next = redfence(&servers)
        .args(["run", "--no-wait", "-r", "job", "--", "true"])
        .output()
        .expect("run redfence");
    assert_eq!(next.status.code(), Some(0), "{next:?}");

    files.go();
    wait_exit(&mut holder);
}

#[test]
fn bad_flags_and_urls_exit_64_with_one_line() {
    let servers = Servers::start(1);
    let files = Files::new();
    let ran = files.p("ran");
    let cases: Vec<Vec<&str>> = vec![
        vec!["run", "--bogus", "--", "touch", &ran],
        vec!["run", "--ttl", "5 parsecs", "--", "touch", &ran],
        vec!["run", "--ttl", "100ms", "--", "touch", &ran],
        vec!["run", "--wait", "1s", "--no-wait", "--", "touch", &ran],
        vec![
            "run",
            "--min-hold",
            "5s",
            "--max-hold",
            "1s",
            "--",
            "touch",
            &ran,
        ],
        // --max-hold gives the lock up as much as one TTL (30 s) early.
        vec![
            "run",
            "--min-hold",
            "5s",
            "--max-hold",
            "20s",
            "--",
            "touch",
            &ran,
        ],
        vec!["run", "--wait", "300000000000y", "--", "touch", &ran],
        vec!["run", "--busy-exit-code", "300", "--", "touch", &ran],
        vec!["run", "touch", &ran],
        vec!["run"],
        vec!["--nodes", "not a url", "run", "--", "touch", &ran],
        vec![
            "--nodes",
            "redis://127.0.0.1:1,redis://127.0.0.1:1",
            "run",
            "--",
            "touch",
            &ran,
        ],
        vec!["run", "--fencing", "http://127.0.0.1/", "--", "touch", &ran],
        vec![
            "run",
            "--fencing",
            "postgres://u@h:notaport/db",
            "--",
            "touch",
            &ran,
        ],
        vec!["run", "-r", "", "--", "touch", &ran],
        vec!["run", "-r", "a,b", "--", "touch", &ran],
        vec!["status"],
        vec!["status", "a", "a"],
        vec!["release", "job"],
        vec!["frobnicate"],
    ];
    for args in cases {
        let out = redfence(&servers)
            .args(&args)
            .output()
            .expect("run redfence");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(USAGE), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("redfence: "), "{args:?}: {stderr}");
    }
    assert!(
        !files.path("ran").exists(),
        "no bad command line ran anything"
    );
    assert!(servers.keys(0).is_empty(), "nothing was sent");
}
