//! Nothing a run wrote outlives it, and a refusal during the restart quarantine says "busy"
//! (issue 38: each test failed before its fix).

use std::time::Duration;

use redfence_testkit::Servers;
use redfence_testkit::proxy::{Mode, Proxy};

use std::process::Child;

use super::{
    BUSY, Files, UNAVAILABLE, redfence, redfence_at, send_signal, spawn_run, wait_exit, wait_for,
};

/// Far longer than [`redfence_testkit::DEADLINE`]: a key found gone within the deadline was
/// released, not expired.
const TTL: &str = "60s";

/// The issue's setup: a holder (`redfence run -r nc --ttl 60s -- sleep 60`, default settings)
/// holds `nc` on all three servers, which remember each other's memory markers; then servers
/// 1 and 2 restart without persistence. Returns the holder, still running.
fn a_holder_then_nodes_1_and_2_restarted(servers: &mut Servers) -> Child {
    let holder = a_holder(servers);
    servers.restart(1);
    servers.restart(2);
    holder
}

/// A holder as above, the rosters written; nothing lost yet.
fn a_holder(servers: &Servers) -> Child {
    let holder = spawn_run(servers, &["-r", "nc", "--ttl", TTL], "sleep 60");
    wait_for("the holder's key on every node", || {
        (0..3).all(|i| servers.get(i, "nc").is_some())
    });
    let roster = |on: usize, of: usize| {
        let key = format!("redfence:roster:127.0.0.1:{}/0", servers.port(of));
        servers.get(on, &key).is_some()
    };
    wait_for("every roster names the other servers' markers", || {
        (0..3).all(|on| (0..3).filter(|&of| of != on).all(|of| roster(on, of)))
    });
    holder
}

/// The issue's second finding, by the command: `FLUSHALL` on servers 1 and 2 (their `run_id`
/// unchanged) let a fresh run in beside the holder.
#[test]
fn a_fresh_run_is_refused_after_flushall_on_a_majority() {
    let servers = Servers::start(3);
    let holder = a_holder(&servers);
    for i in [1, 2] {
        let _: () = servers.cmd(i, &["FLUSHALL"]);
    }
    let files = Files::new();
    let out = run_nc(&servers, &files);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(BUSY), "{stderr}");
    assert!(stderr.contains("quarantined"), "says why: {stderr}");
    assert!(
        !files.path("ran").exists(),
        "the command ran beside the holder"
    );
    stop(holder);
}

/// Stops the holder (SIGTERM: its job stops and its lock is released where it still is).
fn stop(mut holder: Child) {
    send_signal(&holder, "-TERM");
    wait_exit(&mut holder);
}

/// `redfence run -r nc --ttl 60s -- touch ran`, default settings (a fresh process).
fn run_nc(servers: &Servers, files: &Files) -> std::process::Output {
    redfence(servers)
        .args(["run", "-r", "nc", "--ttl", TTL])
        .args(["--", "touch", &files.p("ran")])
        .output()
        .expect("run redfence")
}

/// The issue's first finding, by the command: after nodes 1 and 2 restarted, a fresh run ran
/// while the holder still held (they forgot its key). Now their grants do not count: the run
/// is refused, and the keys it wrote there are gone once it has exited (they stayed for the
/// whole TTL: the release was left to a task that the process never ran).
#[test]
fn a_run_refused_during_the_quarantine_leaves_no_key_behind() {
    let mut servers = Servers::start(3);
    let holder = a_holder_then_nodes_1_and_2_restarted(&mut servers);
    let files = Files::new();
    let out = run_nc(&servers, &files);
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    assert!(
        !files.path("ran").exists(),
        "the command ran beside the holder"
    );
    wait_for("no key of the refused run on nodes 1 and 2", || {
        servers.get(1, "nc").is_none() && servers.get(2, "nc").is_none()
    });
    // And the next run is refused for the same reason, not by the first one's keys.
    let again = run_nc(&servers, &files);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(stderr.contains("1 refused"), "{stderr}");
    assert!(
        !files.path("ran").exists(),
        "the command ran beside the holder"
    );
    stop(holder);
}

/// The same refusal is "busy" (75): a holder refused, and the other nodes are quarantined,
/// which they are because they may have forgotten that holder's key. (It exited 69,
/// "unreachable".) With nobody holding it, the quarantine alone is "unreachable".
#[test]
fn a_run_refused_by_a_holder_during_the_quarantine_is_busy() {
    let mut servers = Servers::start(3);
    let holder = a_holder_then_nodes_1_and_2_restarted(&mut servers);
    let files = Files::new();
    let out = run_nc(&servers, &files);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(BUSY), "{stderr}");
    assert!(stderr.contains("quarantined"), "says why: {stderr}");
    assert!(!files.path("ran").exists(), "the command ran");

    stop(holder);
    wait_for("the holder's key released", || {
        servers.get(0, "nc").is_none()
    });
    let free = run_nc(&servers, &files);
    assert_eq!(
        free.status.code(),
        Some(UNAVAILABLE),
        "no holder, nodes 1 and 2 quarantined: {free:?}"
    );
    assert!(!files.path("ran").exists(), "the command ran");
}

/// Proxies delaying every byte by `delay` each way in front of some servers, served by a
/// runtime on a thread of its own (they live as long as the test process).
fn slow(urls: &[String], delay: Duration) -> Vec<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let urls = urls.to_vec();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("proxy runtime");
        runtime.block_on(async move {
            let proxies = Proxy::in_front_of_each(&urls, Mode::Delay(delay)).await;
            let _ = tx.send(proxies.iter().map(Proxy::url).collect::<Vec<_>>());
            std::future::pending::<()>().await;
        });
    });
    rx.recv().expect("proxy URLs")
}

/// `-n 4` over three nodes, two of them slower than the node timeout: every slot's try
/// fails (node 0 alone grants), and the acquires that land late on the slow nodes are
/// released before the process exits. (They were queued for the node and never sent: K-1
/// permits stayed taken for their whole TTL.)
#[test]
fn a_refused_semaphore_run_on_slow_nodes_leaves_no_permit_behind() {
    let servers = Servers::start(3);
    let files = Files::new();
    let urls = servers.urls();
    let mut nodes = vec![urls[0].clone()];
    nodes.extend(slow(&urls[1..], Duration::from_millis(150)));
    let out = redfence_at(&nodes.join(","))
        .env("REDFENCE_NODE_TIMEOUT", "100ms")
        .args(["run", "-n", "4", "-r", "pool", "--ttl", TTL])
        .args(["--", "touch", &files.p("ran")])
        .output()
        .expect("run redfence");
    assert_eq!(out.status.code(), Some(UNAVAILABLE), "{out:?}");
    assert!(!files.path("ran").exists(), "the command ran");
    let slots = |i: usize| -> Vec<String> {
        servers
            .keys(i)
            .into_iter()
            .filter(|key| key.contains(":semaphore:slot:"))
            .collect()
    };
    wait_for("no slot taken on any node", || {
        (0..3).all(|i| slots(i).is_empty())
    });
}
