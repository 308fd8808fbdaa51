//! `redfence status`: who holds some resources (or a semaphore's slots) on each node, and
//! the quorum view.

use std::time::Duration;

use redfence::{
    Inspection, KeyState, MAX_RESOURCE_BYTES, MAX_RESOURCES, NodeReport, Redlock, RwHolder,
    RwInspection,
};
use serde_json::{Value, json};

use crate::args::StatusArgs;
use crate::exit::{self, Failure};
use crate::setup;

/// Prints the report (a table, or JSON); exits 69 when fewer than a majority answered.
pub async fn status(redlock: &Redlock, args: &StatusArgs) -> Result<u8, Failure> {
    let lock_error = |err: redfence::Error| Failure::from_lock_error(&err, exit::BUSY);
    if args.rwlock {
        let [name] = args.resources.as_slice() else {
            return Err(Failure::usage(
                "--rwlock needs exactly one RESOURCE, the read-write lock's name",
            ));
        };
        let report = redlock
            .rwlock(name)
            .map_err(lock_error)?
            .inspect()
            .await
            .map_err(lock_error)?;
        if args.json {
            println!("{}", rw_json(&report, redlock.quorum()));
        } else {
            print!("{}", rw_table(&report));
        }
        let answered = report.nodes().iter().filter(|n| n.is_ok()).count();
        return Ok(if answered >= redlock.quorum() {
            0
        } else {
            exit::UNAVAILABLE
        });
    }
    let report = match (args.permits, args.resources.as_slice()) {
        (None, resources) => inspect(redlock, resources).await.map_err(lock_error)?,
        (Some(permits), [name]) => {
            // Checked as `run -n` checks it, then each slot read: what `run` accepts, this
            // shows (a semaphore's slots together may be more than one lock's names).
            let semaphore = setup::semaphore(redlock, name, permits)?;
            inspect(redlock, semaphore.slots())
                .await
                .map_err(lock_error)?
        }
        (Some(_), _) => {
            return Err(Failure::usage(
                "--permits needs exactly one RESOURCE, the semaphore's name",
            ));
        }
    };
    if args.json {
        println!("{}", to_json(&report));
    } else {
        print!("{}", table(&report));
    }
    Ok(answered_code(&report))
}

/// [`Redlock::inspect`] over `resources`, in as many calls as the limits of one call take
/// ([`MAX_RESOURCES`] names, [`MAX_RESOURCE_BYTES`] bytes of names: a lock's), one report.
/// A node that failed any of the calls is reported failed.
async fn inspect(redlock: &Redlock, resources: &[String]) -> Result<Inspection, redfence::Error> {
    let mut parts = parts(resources).into_iter();
    let first = parts.next().unwrap_or(resources);
    let mut report = redlock.inspect(first).await?;
    for part in parts {
        let more = redlock.inspect(part).await?;
        report.resources.extend(more.resources);
        report.keys.extend(more.keys);
        for (node, theirs) in report.nodes.iter_mut().zip(more.nodes) {
            match (&mut node.keys, theirs.keys) {
                (Ok(keys), Ok(more)) => keys.extend(more),
                (Ok(_), Err(failure)) => node.keys = Err(failure),
                (Err(_), _) => {}
            }
        }
    }
    Ok(report)
}

/// `resources` cut, in order, into runs that one [`Redlock::inspect`] call takes: at most
/// [`MAX_RESOURCES`] names and [`MAX_RESOURCE_BYTES`] bytes of names each (a name over
/// [`MAX_RESOURCE_LEN`] gets a run of its own, for `inspect` to refuse).
fn parts(resources: &[String]) -> Vec<&[String]> {
    let mut parts = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, name) in resources.iter().enumerate() {
        let full = i - start == MAX_RESOURCES || bytes + name.len() > MAX_RESOURCE_BYTES;
        if full && i > start {
            parts.push(&resources[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += name.len();
    }
    if start < resources.len() || resources.is_empty() {
        parts.push(&resources[start..]);
    }
    parts
}

/// 0 when a majority answered, else 69 (the report may be missing the holder).
pub fn answered_code(report: &Inspection) -> u8 {
    if report.answered() >= report.quorum {
        0
    } else {
        exit::UNAVAILABLE
    }
}

/// The human table: per resource, the quorum view, then one line per node.
pub fn table(report: &Inspection) -> String {
    let mut out = String::new();
    for (i, view) in report.views().into_iter().enumerate() {
        out.push_str(&format!(
            "{} (key {}): {view} [advisory]\n",
            report.resources[i], report.keys[i]
        ));
        out.push_str(&format!(
            "  {:<4} {:<24} {:<8} {:<10} {}\n",
            "NODE", "ADDRESS", "STATE", "HOLDER", "TTL"
        ));
        for node in &report.nodes {
            let (state, holder, ttl) = describe(node, i);
            out.push_str(&format!(
                "  {:<4} {:<24} {:<8} {:<10} {}\n",
                node.index, node.addr, state, holder, ttl
            ));
        }
    }
    out
}

/// A node's state for resource `i`: (state, holder, TTL or error) as table cells.
pub fn describe(node: &NodeReport, i: usize) -> (&'static str, String, String) {
    match node.keys.as_ref().map(|keys| keys.get(i)) {
        Err(err) => ("error", "-".into(), err.to_string()),
        Ok(None) => ("error", "-".into(), "no answer for this key".into()),
        Ok(Some(KeyState::Absent)) => ("absent", "-".into(), "-".into()),
        Ok(Some(KeyState::Held { token_prefix, ttl })) => {
            ("held", token_prefix.clone(), seconds(*ttl))
        }
        Ok(Some(KeyState::Foreign { kind, ttl })) => ("foreign", kind.clone(), seconds(*ttl)),
        Ok(Some(_)) => ("unknown", "-".into(), "-".into()),
    }
}

fn seconds(ttl: Option<Duration>) -> String {
    match ttl {
        Some(ttl) => format!("{:.1} s", ttl.as_secs_f64()),
        None => "no expiry".into(),
    }
}

fn millis(ttl: Option<Duration>) -> Value {
    match ttl {
        Some(ttl) if ttl != Duration::MAX => {
            json!(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
        }
        _ => Value::Null,
    }
}

/// The report as JSON: `{"advisory": true, "quorum", "node_count", "answered", "resources":
/// [{"resource", "key", "summary", "free", "owner", "nodes": [...]}]}`.
pub fn to_json(report: &Inspection) -> Value {
    let resources: Vec<Value> = report
        .views()
        .into_iter()
        .enumerate()
        .map(|(i, view)| {
            let owner = view.owner().map(|owner| {
                json!({
                    "token_prefix": owner.token_prefix,
                    "nodes": owner.nodes,
                    "majority_ttl_ms": millis(owner.majority_ttl),
                })
            });
            let nodes: Vec<Value> = report.nodes.iter().map(|node| node_json(node, i)).collect();
            json!({
                "resource": view.resource,
                "key": report.keys[i],
                "summary": view.to_string(),
                "free": view.is_free(),
                "owner": owner,
                "nodes": nodes,
            })
        })
        .collect();
    json!({
        "advisory": true,
        "quorum": report.quorum,
        "node_count": report.nodes.len(),
        "answered": report.answered(),
        "resources": resources,
    })
}

fn node_json(node: &NodeReport, i: usize) -> Value {
    let mut value = json!({ "index": node.index, "addr": node.addr });
    let fields = match node.keys.as_ref().map(|keys| keys.get(i)) {
        Err(err) => json!({ "state": "error", "error": err.to_string() }),
        Ok(None) => json!({ "state": "error", "error": "no answer for this key" }),
        Ok(Some(KeyState::Absent)) => json!({ "state": "absent" }),
        Ok(Some(KeyState::Held { token_prefix, ttl })) => {
            json!({ "state": "held", "token_prefix": token_prefix, "ttl_ms": millis(*ttl) })
        }
        Ok(Some(KeyState::Foreign { kind, ttl })) => {
            json!({ "state": "foreign", "type": kind, "ttl_ms": millis(*ttl) })
        }
        Ok(Some(_)) => json!({ "state": "unknown" }),
    };
    if let (Value::Object(map), Value::Object(extra)) = (&mut value, fields) {
        map.extend(extra);
    }
    value
}

/// A read-write lock's table: the majority view, then one line per node.
pub fn rw_table(report: &RwInspection) -> String {
    let writer = report.writer().unwrap_or("-");
    let readers = report.readers();
    let mut out = format!(
        "{} (read-write lock): writer {writer}, {} reader(s){}{} [advisory]\n",
        report.name(),
        readers.len(),
        if readers.is_empty() { "" } else { ": " },
        readers.join(" "),
    );
    if report.writer_waiting() {
        out.push_str("  a writer waits: new readers queue behind it\n");
    }
    out.push_str(&format!(
        "  {:<4} {:<20} {:<8} {}\n",
        "NODE", "WRITER", "WAITING", "READERS"
    ));
    for (index, node) in report.nodes().iter().enumerate() {
        let line = match node {
            Err(err) => format!("  {index:<4} error: {err}\n"),
            Ok(state) => {
                let writer = state.writer.as_ref().map_or("-".into(), holder);
                let waiting = if state.writer_waiting.is_some() {
                    "yes"
                } else {
                    "no"
                };
                let readers: Vec<String> = state.readers.iter().map(holder).collect();
                format!(
                    "  {index:<4} {writer:<20} {waiting:<8} {}\n",
                    if readers.is_empty() {
                        "-".into()
                    } else {
                        readers.join(" ")
                    }
                )
            }
        };
        out.push_str(&line);
    }
    out
}

/// `prefix (TTL)` of one holder.
fn holder(holder: &RwHolder) -> String {
    format!("{} ({})", holder.token_prefix, seconds(Some(holder.ttl)))
}

/// A read-write lock's report as JSON: `{"advisory": true, "name", "quorum", "writer",
/// "readers", "writer_waiting", "nodes": [{"index", "writer", "readers", "writer_waiting"} or
/// {"index", "error"}]}`; holders as `{"token_prefix", "ttl_ms"}`.
pub fn rw_json(report: &RwInspection, quorum: usize) -> Value {
    let holder =
        |h: &RwHolder| json!({ "token_prefix": h.token_prefix, "ttl_ms": millis(Some(h.ttl)) });
    let nodes: Vec<Value> = report
        .nodes()
        .iter()
        .enumerate()
        .map(|(index, node)| match node {
            Err(err) => json!({ "index": index, "error": err.to_string() }),
            Ok(state) => json!({
                "index": index,
                "writer": state.writer.as_ref().map(holder),
                "readers": state.readers.iter().map(holder).collect::<Vec<_>>(),
                "writer_waiting": state.writer_waiting.is_some(),
            }),
        })
        .collect();
    json!({
        "advisory": true,
        "name": report.name(),
        "quorum": quorum,
        "writer": report.writer(),
        "readers": report.readers(),
        "writer_waiting": report.writer_waiting(),
        "nodes": nodes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use redfence::MAX_RESOURCE_LEN;

    fn lens(parts: &[&[String]]) -> Vec<usize> {
        parts.iter().map(|part| part.len()).collect()
    }

    #[test]
    fn names_are_cut_into_calls_that_inspect_takes() {
        let few: Vec<String> = vec!["a".into(), "b".into()];
        assert_eq!(lens(&parts(&few)), [2]);
        assert_eq!(lens(&parts(&[])), [0], "one (refused) call for no name");
        // 200 slots of a 60 KB semaphore: 17 to a call (17 x 60 KB < 1 MiB < 18 x 60 KB).
        let slots: Vec<String> = (0..200)
            .map(|i| format!("{}:semaphore:slot:{i}", "x".repeat(60_000)))
            .collect();
        let cut = parts(&slots);
        assert!(
            cut.iter()
                .all(|part| { part.iter().map(String::len).sum::<usize>() <= MAX_RESOURCE_BYTES })
        );
        assert_eq!(cut.iter().map(|part| part.len()).sum::<usize>(), 200);
        assert_eq!(cut[0].len(), 17);
        // Many short names: MAX_RESOURCES to a call.
        let many: Vec<String> = (0..2_500).map(|i| i.to_string()).collect();
        assert_eq!(lens(&parts(&many)), [MAX_RESOURCES, MAX_RESOURCES, 500]);
        // A name too long for any call goes alone (inspect refuses it and says why).
        let long = vec![
            "a".to_string(),
            "y".repeat(MAX_RESOURCE_BYTES + 1),
            "b".into(),
        ];
        assert_eq!(lens(&parts(&long)), [1, 1, 1]);
        assert!(long[1].len() > MAX_RESOURCE_LEN);
    }
}
