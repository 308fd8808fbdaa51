//! The job's processes as a tree: every descendant of redfence, found by reading the parent of
//! every process in `/proc` (Linux). redfence is the child subreaper of its job, so a process
//! whose parent exits is re-parented to redfence and stays in the tree, whatever process group
//! or session it moved to (GNU `timeout`, `setsid`, a double fork). Elsewhere the tree is
//! empty and the job is its process group (see `child.rs`).

#[cfg(target_os = "linux")]
use std::collections::{HashMap, HashSet};

use nix::unistd::Pid;

/// One process found under redfence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    /// Its id.
    pub pid: Pid,
    /// Its parent's id.
    pub parent: Pid,
    /// Its process group.
    pub group: Pid,
    /// Whether it still runs code: not a zombie (exited, waiting for its parent to reap it)
    /// nor dead.
    pub alive: bool,
}

/// How many times a scan is made again when it was inconsistent (a process whose parent the
/// same scan did not see: the parent exited while `/proc` was being read, and its children
/// may have been re-parented to redfence unseen).
#[cfg(target_os = "linux")]
const RESCANS: usize = 4;

/// Every descendant of redfence, zombies included (Linux; empty elsewhere). A process may
/// fork or exit during the scan: what it returns is a moment's view, to be taken again until
/// it finds none.
pub fn descendants() -> Vec<Process> {
    #[cfg(target_os = "linux")]
    {
        let mut table = scan();
        for _ in 0..RESCANS {
            if consistent(&table) {
                break;
            }
            table = scan();
        }
        let Ok(own) = i32::try_from(std::process::id()) else {
            return Vec::new();
        };
        under(&table, Pid::from_raw(own))
    }
    #[cfg(not(target_os = "linux"))]
    Vec::new()
}

/// Reaps redfence's own children that have exited, except `keep` (the job's first process,
/// which tokio waits for): orphans re-parented to redfence.
#[cfg(target_os = "linux")]
pub fn reap_exited_children(keep: Pid) {
    use nix::sys::wait::{WaitPidFlag, waitpid};
    let own = nix::unistd::getpid();
    for process in descendants() {
        if process.parent == own && !process.alive && process.pid != keep {
            let _ = waitpid(process.pid, Some(WaitPidFlag::WNOHANG));
        }
    }
}

/// Every process whose `/proc/<pid>/stat` could be read.
#[cfg(target_os = "linux")]
fn scan() -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?))
        .collect()
}

/// Whether every process's parent is in the table too (0 is no parent: the first process, the
/// kernel's threads, a parent outside the PID namespace).
#[cfg(target_os = "linux")]
fn consistent(table: &[Process]) -> bool {
    let pids: HashSet<Pid> = table.iter().map(|p| p.pid).collect();
    table
        .iter()
        .all(|p| p.parent.as_raw() == 0 || pids.contains(&p.parent))
}

/// The processes of `table` below `root`, breadth first.
#[cfg(target_os = "linux")]
fn under(table: &[Process], root: Pid) -> Vec<Process> {
    let mut children: HashMap<Pid, Vec<&Process>> = HashMap::new();
    for process in table {
        children.entry(process.parent).or_default().push(process);
    }
    let mut found = Vec::new();
    let mut seen = HashSet::from([root]);
    let mut next = vec![root];
    while let Some(parent) = next.pop() {
        for &child in children.get(&parent).into_iter().flatten() {
            // A table read while pids were reused could hold a cycle.
            if seen.insert(child.pid) {
                found.push(*child);
                next.push(child.pid);
            }
        }
    }
    found
}

/// One `/proc/<pid>/stat` line: `pid (comm) state ppid pgrp ...`. The command name may hold
/// spaces and parentheses: it ends at the last `)`.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn parse_stat(line: &str) -> Option<Process> {
    let (head, tail) = line.rsplit_once(')')?;
    let pid = head.split_once(' ')?.0.trim().parse().ok()?;
    let mut fields = tail.split_ascii_whitespace();
    let state = fields.next()?;
    let parent = fields.next()?.parse().ok()?;
    let group = fields.next()?.parse().ok()?;
    Some(Process {
        pid: Pid::from_raw(pid),
        parent: Pid::from_raw(parent),
        group: Pid::from_raw(group),
        // Z: zombie; X (x in old kernels): dead.
        alive: !matches!(state, "Z" | "X" | "x"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    fn process(pid: i32, parent: i32) -> Process {
        Process {
            pid: Pid::from_raw(pid),
            parent: Pid::from_raw(parent),
            group: Pid::from_raw(pid),
            alive: true,
        }
    }

    #[test]
    fn a_stat_line_is_read_whatever_the_command_name() {
        let line = "4242 (we ird) (name) S 17 4240 17 0 -1 4194560 100 0 0 0";
        assert_eq!(
            parse_stat(line),
            Some(Process {
                pid: Pid::from_raw(4242),
                parent: Pid::from_raw(17),
                group: Pid::from_raw(4240),
                alive: true,
            })
        );
        let zombie = parse_stat("7 (sleep) Z 1 7 7 0").expect("parses");
        assert!(!zombie.alive);
        assert_eq!(parse_stat("7 (sleep"), None);
        assert_eq!(parse_stat(""), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_tree_below_a_process_is_every_descendant_and_nothing_else() {
        let table = [
            process(1, 0),
            process(10, 1),
            process(11, 10),
            process(12, 11),
            process(13, 10),
            process(20, 1),
            process(21, 20),
        ];
        let mut below: Vec<i32> = under(&table, Pid::from_raw(10))
            .iter()
            .map(|p| p.pid.as_raw())
            .collect();
        below.sort_unstable();
        assert_eq!(below, [11, 12, 13]);
        assert!(consistent(&table));
        assert!(!consistent(&[process(5, 4)]));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_child_of_this_process_is_found() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("start sleep");
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
        let found = descendants().iter().any(|p| p.pid == pid && p.alive);
        let _ = child.kill();
        let _ = child.wait();
        assert!(found, "the child was not in the tree");
    }
}
