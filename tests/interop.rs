//! node-redlock (5.0.0-beta.2 on ioredis, the Node.js reference implementation, from
//! `../shared/peers/node`) and redfence on the same servers exclude each other, both ways: what
//! one holds the other is refused, what one releases the other takes. Run against each server
//! the suite runs on, so on Valkey 9 also through redfence's plain commands. Needs `node` and the
//! peers' packed modules; without them the test says so and passes (CI has both).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use redfence::Error;
use support::{Servers, TestRedlock, eventually};

const TTL: Duration = Duration::from_secs(10);

/// The node-redlock side: `node interop.mjs NODES ACTION RESOURCE`, where ACTION is `hold`
/// (acquire and leave it held; prints `held`), `take` (acquire and release; prints `taken`)
/// or `refused` (one attempt, expected to fail; prints `refused`). Exits 1 otherwise.
const SCRIPT: &str = r#"
import Redis from "ioredis";
import Redlock from "redlock";
const [nodes, action, resource] = process.argv.slice(2);
const clients = nodes.split(",").map(n => { const [h, p] = n.split(":"); return new Redis({ host: h, port: +p }); });
const redlock = new Redlock(clients, { retryCount: 0, driftFactor: 0.01 });
redlock.on("error", () => {});
let out = "";
try {
  const lock = await redlock.acquire([resource], 10000);
  if (action === "take") { await lock.release(); out = "taken"; }
  else if (action === "hold") { out = "held"; }
  else { out = "granted (expected a refusal)"; }
} catch (e) {
  out = action === "refused" ? "refused" : "failed: " + e;
}
console.log(out);
// quit(), not disconnect(): node-redlock resolves a release once a majority answered, and
// quit() lets the other nodes' deletes through before the connection closes.
await Promise.all(clients.map(c => c.quit()));
process.exit(out === "taken" || out === "held" || out === "refused" ? 0 : 1);
"#;

/// A folder with the script and node-redlock's modules, or `None` (with the reason printed)
/// when `node` or the peers are not on this machine.
fn node_side() -> Option<tempfile::TempDir> {
    let peers = std::env::var("PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/peers"));
    let modules = peers.join("node/node_modules.tgz");
    let node = Command::new("node").arg("--version").output();
    if !modules.exists() || !node.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "SKIPPED: node-redlock interop needs `node` and {} (the peers)",
            modules.display()
        );
        return None;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let unpacked = Command::new("tar")
        .arg("xzf")
        .arg(&modules)
        .arg("-C")
        .arg(dir.path())
        .status()
        .expect("tar");
    assert!(unpacked.success(), "unpack {}", modules.display());
    std::fs::write(dir.path().join("interop.mjs"), SCRIPT).expect("write the script");
    Some(dir)
}

/// Runs the node-redlock side with `action` on `resource`; its one line of output.
fn node_redlock(dir: &Path, servers: &Servers, action: &str, resource: &str) -> String {
    let nodes: Vec<String> = (0..servers.len())
        .map(|i| format!("127.0.0.1:{}", servers.port(i)))
        .collect();
    let out = Command::new("node")
        .current_dir(dir)
        .arg("interop.mjs")
        .arg(nodes.join(","))
        .arg(action)
        .arg(resource)
        .output()
        .expect("run node");
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        out.status.success(),
        "node-redlock {action} {resource}: {line} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    line
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_redlock_and_redfence_exclude_each_other_both_ways() {
    let Some(dir) = node_side() else { return };
    let dir = dir.path();
    let servers = Servers::start(3);
    let redlock = servers.builder().retry_count(0).build().expect("config");
    // Twice round, so that on Valkey 9 the second round is all plain commands.
    for round in 0..2 {
        let ours = format!("interop:ours:{round}");
        let theirs = format!("interop:theirs:{round}");
        let lock = redlock.acquire(&[ours.as_str()], TTL).await.expect("ours");
        assert_eq!(node_redlock(dir, &servers, "refused", &ours), "refused");
        assert_eq!(node_redlock(dir, &servers, "hold", &theirs), "held");
        let err = redlock
            .try_acquire(&[theirs.as_str()], TTL)
            .await
            .expect_err("held by node-redlock");
        assert!(matches!(err, Error::Contended { .. }), "{err}");
        lock.release().await.expect("release");
        assert_eq!(node_redlock(dir, &servers, "take", &ours), "taken");
        let again = redlock.acquire(&[ours.as_str()], TTL).await.expect("again");
        again.release().await.expect("release");
        // Both releases return once a majority answered; the last node follows.
        for i in 0..3 {
            assert!(
                eventually(|| servers.get(i, &ours).is_none()).await,
                "round {round}, node {i} still holds {:?}",
                servers.get(i, &ours)
            );
        }
    }
}
