//! The checkers, on true simulated time: what must hold whatever the faults.

use crate::history::Record;

/// The violations of one run (empty: it passed). `weakened` runs broke the algorithm's
/// assumptions: only the promises that still hold are checked.
pub fn violations(record: &Record, weakened: bool, leftovers: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    if !weakened {
        exclusion(record, &mut found);
        for (who, at, until) in &record.late_aborts {
            found.push(format!(
                "{who}: the signal aborted at {at:.3} ms, after the validity it gave ({until:.3} ms)"
            ));
        }
        found.extend(leftovers.iter().cloned());
    }
    fences_grow(record, weakened, &mut found);
    stale_writes(record, &mut found);
    for (who, took, bound) in &record.late {
        found.push(format!(
            "{who}: acquire took {took:.3} ms, past its bound of {bound:.3} ms"
        ));
    }
    found
}

/// No two holders of one resource count on their locks at the same moment.
fn exclusion(record: &Record, found: &mut Vec<String>) {
    let claims = &record.claims;
    for (i, a) in claims.iter().enumerate() {
        for b in &claims[i + 1..] {
            if a.token == b.token || !a.resources.iter().any(|r| b.resources.contains(r)) {
                continue;
            }
            let from = a.from.max(b.from);
            let until = a.until.min(b.until);
            if from < until {
                found.push(format!(
                    "two holders: {} ({:.3}–{:.3} ms) and {} ({:.3}–{:.3} ms) overlap for {:.3} ms",
                    a.who,
                    a.from,
                    a.until,
                    b.who,
                    b.from,
                    b.until,
                    until - from
                ));
            }
        }
    }
}

/// A holder that came after another (its claim starts after the other's ended) has a greater
/// fence: the counter was asked within the validity.
fn fences_grow(record: &Record, weakened: bool, found: &mut Vec<String>) {
    if weakened {
        return;
    }
    let claims = &record.claims;
    for a in claims {
        for b in claims {
            let shared = a.resources.iter().any(|r| b.resources.contains(r));
            if let (Some(fa), Some(fb)) = (a.fence, b.fence)
                && shared
                && a.until <= b.from
                && a.from < b.from
                && fa >= fb
            {
                found.push(format!(
                    "fences out of order: {} (fence {fa}) held before {} (fence {fb})",
                    a.who, b.who
                ));
            }
        }
    }
}

/// The store never accepted a write whose fence is below one it accepted before.
fn stale_writes(record: &Record, found: &mut Vec<String>) {
    let mut highest: std::collections::BTreeMap<&str, (u64, &str)> = Default::default();
    let mut writes: Vec<_> = record.writes.iter().filter(|w| w.accepted).collect();
    writes.sort_by(|a, b| a.at.total_cmp(&b.at));
    for write in writes {
        if let Some((fence, who)) = highest.get(write.resource.as_str())
            && write.fence < *fence
        {
            found.push(format!(
                "stale write accepted: {} wrote {} with fence {} after {who} wrote fence {fence}",
                write.who, write.resource, write.fence
            ));
        }
        let entry = highest
            .entry(write.resource.as_str())
            .or_insert((write.fence, write.who.as_str()));
        if write.fence >= entry.0 {
            *entry = (write.fence, write.who.as_str());
        }
    }
}
