//! `redfence release --force`: the operator's break-glass.

use std::io::{BufRead, IsTerminal, Write};

use redfence::{KeyState, Redlock};

use crate::args::ReleaseArgs;
use crate::exit::{self, Failure};
use crate::status;

/// Printed before every forced release.
const WARNING: &str = "\
WARNING: a forced release does not stop the current holder. If it is still running, the next
owner runs at the same time. Only fencing tokens (--fencing), checked by the storage it
writes to, keep that safe.";

/// Confirms (unless `--yes`), deletes the keys on every node and prints what each deleted;
/// exits 69 when fewer than a majority answered (the lock may still be held).
pub async fn release(redlock: &Redlock, args: &ReleaseArgs) -> Result<u8, Failure> {
    eprintln!("{WARNING}");
    if !args.yes {
        confirm(&args.resources, redlock.node_count())?;
    }
    let report = redlock
        .force_release(&args.resources)
        .await
        .map_err(|err| Failure::from_lock_error(&err, exit::BUSY))?;
    for node in &report.nodes {
        for (i, key) in report.keys.iter().enumerate() {
            let line = match node.keys.as_ref().map(|keys| keys.get(i)) {
                Ok(Some(KeyState::Absent)) => "nothing to delete".to_string(),
                Ok(Some(_)) => {
                    let (state, holder, ttl) = status::describe(node, i);
                    format!("deleted ({state} by {holder}, {ttl} left)")
                }
                _ => {
                    let (_, _, error) = status::describe(node, i);
                    format!("FAILED: {error}")
                }
            };
            println!("node {} ({}): {key}: {line}", node.index, node.addr);
        }
    }
    let code = status::answered_code(&report);
    if code == 0 {
        println!(
            "released on {}/{} nodes ({} key(s) deleted)",
            report.answered(),
            report.nodes.len(),
            report.present()
        );
    } else {
        println!(
            "only {}/{} nodes answered: the lock may still be held",
            report.answered(),
            report.nodes.len()
        );
    }
    Ok(code)
}

/// Asks on the terminal; without one, `--yes` is required.
fn confirm(resources: &[String], nodes: usize) -> Result<(), Failure> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::usage(
            "release --force needs --yes when stdin is not a terminal",
        ));
    }
    eprint!("Delete {resources:?} on all {nodes} nodes, whoever holds them? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    if stdin.lock().read_line(&mut answer).is_err() {
        return Err(Failure::new(1, "no answer: nothing deleted"));
    }
    match answer.trim() {
        "y" | "Y" | "yes" | "YES" => Ok(()),
        _ => Err(Failure::new(1, "not confirmed: nothing deleted")),
    }
}
