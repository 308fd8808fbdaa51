//! What the simulated network reads of a request: a short description for the trace, the
//! releases it makes and the keys it names (for the ghost check), and whether a server over
//! its memory limit refuses it.

use redis::Value;

/// A command, shortly: its name, and for a script call its keys and arguments (tokens cut
/// to 8 characters).
pub(super) fn describe(args: &[Vec<u8>]) -> String {
    let word = |arg: &Vec<u8>| {
        let text = String::from_utf8_lossy(arg);
        if text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            text[..8].to_owned()
        } else {
            text.chars().take(24).collect()
        }
    };
    let name = args
        .first()
        .map(word)
        .unwrap_or_default()
        .to_ascii_uppercase();
    match name.as_str() {
        "EVALSHA" | "EVAL" => {
            let keys = args
                .get(2)
                .and_then(|n| String::from_utf8_lossy(n).parse::<usize>().ok())
                .unwrap_or(0);
            let listed = |from: usize, to: usize| {
                args.get(from..to.min(args.len()))
                    .unwrap_or_default()
                    .iter()
                    .map(word)
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let sha = args.get(1).map(word).unwrap_or_default();
            let mut text = format!(
                "{name} {} [{}] {}",
                sha.get(..8).unwrap_or(&sha),
                listed(3, 3 + keys),
                listed(3 + keys, args.len())
            );
            if text.len() > 140 {
                text = text.chars().take(140).collect::<String>() + "…";
            }
            text
        }
        "INFO" | "SCRIPT" => name,
        _ => args.iter().take(4).map(word).collect::<Vec<_>>().join(" "),
    }
}

/// Replies, shortly.
pub(super) fn summarize(replies: &[Value]) -> String {
    let text = format!("{replies:?}");
    if text.len() > 100 {
        let cut: String = text.chars().take(100).collect();
        format!("{cut}…")
    } else {
        text
    }
}

/// The keys a command names and the tokens it releases: a call of the batch script
/// (`r`, `R` and `n` operations; see `scripts/batch.lua`) or a plain compare-and-delete.
pub(super) fn releases(args: &[Vec<u8>]) -> (Vec<&[u8]>, Vec<Vec<u8>>) {
    let name = args
        .first()
        .map(|n| n.to_ascii_uppercase())
        .unwrap_or_default();
    let arg = |i: usize| args.get(i).map(Vec::as_slice).unwrap_or_default();
    match name.as_slice() {
        b"DELIFEQ" => (vec![arg(1)], vec![arg(2).to_vec()]),
        b"DELEX" if arg(2).eq_ignore_ascii_case(b"IFEQ") => (vec![arg(1)], vec![arg(3).to_vec()]),
        b"SET" => (vec![arg(1)], Vec::new()),
        b"EVALSHA" | b"EVAL" => {
            let count = |i: usize| {
                std::str::from_utf8(arg(i))
                    .ok()
                    .and_then(|n| n.parse::<usize>().ok())
                    .unwrap_or(0)
            };
            let keys = count(2);
            let named: Vec<&[u8]> = (3..3 + keys).map(arg).collect();
            let mut released = Vec::new();
            // Only the batch script's operations have this shape; other scripts name keys.
            let mut i = 3 + keys;
            while i + 3 < args.len() {
                let kind = arg(i);
                if matches!(kind, b"r" | b"R" | b"n") {
                    released.push(arg(i + 1).to_vec());
                }
                i += 4 + match kind {
                    b"f" | b"l" | b"R" => 3,
                    k if k.len() == 2 => 2,
                    _ => 0,
                };
            }
            (named, released)
        }
        _ => (Vec::new(), Vec::new()),
    }
}

/// Whether a command may add data (what a server over its memory limit refuses): a `SET`,
/// or a call of redfence's scripts that acquires (batch operations `a`, `f`, `ra`, `wa`), sets
/// missing keys again (`E`) or writes the memory marker (`scripts/memory.lua`, whose first key
/// is the marker).
pub(super) fn adds_data(args: &[Vec<u8>]) -> bool {
    let name = args
        .first()
        .map(|n| n.to_ascii_uppercase())
        .unwrap_or_default();
    match name.as_slice() {
        b"SET" => true,
        b"EVALSHA" | b"EVAL" => {
            let keys = args
                .get(2)
                .and_then(|n| std::str::from_utf8(n).ok()?.parse::<usize>().ok())
                .unwrap_or(0);
            let marker_first = args
                .get(3)
                .is_some_and(|key| key.ends_with(b"redfence:memory"));
            let argv = args.get(3 + keys..).unwrap_or_default();
            marker_first
                || argv
                    .iter()
                    .any(|arg| matches!(arg.as_slice(), b"a" | b"f" | b"E" | b"ra" | b"wa"))
        }
        _ => false,
    }
}

/// The error reply `message` for each of `commands`.
pub(super) fn refuse(commands: &[Vec<Vec<u8>>], message: &str) -> Vec<Value> {
    commands
        .iter()
        .map(|_| super::reply::error(message))
        .collect()
}
