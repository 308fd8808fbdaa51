//! `redfence status`: who holds some resources on each node, and the quorum view.

use std::time::Duration;

use redfence::{Inspection, KeyState, NodeReport, Redlock};
use serde_json::{Value, json};

use crate::args::StatusArgs;
use crate::exit::{self, Failure};

/// Prints the report (a table, or JSON); exits 69 when fewer than a majority answered.
pub async fn status(redlock: &Redlock, args: &StatusArgs) -> Result<u8, Failure> {
    let report = redlock
        .inspect(&args.resources)
        .await
        .map_err(|err| Failure::from_lock_error(&err, exit::BUSY))?;
    if args.json {
        println!("{}", to_json(&report));
    } else {
        print!("{}", table(&report));
    }
    Ok(answered_code(&report))
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
