//! The checkers, on true simulated time: what must hold whatever the faults.

use crate::history::{Claim, Mode, Record};

/// The violations of one run (empty: it passed). `weakened` runs broke the algorithm's
/// assumptions: only the promises that still hold are checked.
pub fn violations(
    record: &Record,
    weakened: bool,
    permits: u32,
    leftovers: &[String],
) -> Vec<String> {
    let mut found = Vec::new();
    if !weakened {
        exclusion(record, &mut found);
        at_most(record, permits, &mut found);
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

/// Whether `a` and `b` may not hold at once: a mutex's, a writer beside anyone on its lock
/// (permits are counted apart, readers share).
fn exclusive(a: &Claim, b: &Claim) -> bool {
    matches!(
        (a.mode, b.mode),
        (Mode::Exclusive, Mode::Exclusive)
            | (Mode::Write, Mode::Read | Mode::Write)
            | (Mode::Read, Mode::Write)
    )
}

/// No two holders of one resource count on their locks at the same moment (a mutex's, or a
/// writer and anyone else on a read-write lock).
fn exclusion(record: &Record, found: &mut Vec<String>) {
    let claims = &record.claims;
    for (i, a) in claims.iter().enumerate() {
        for b in &claims[i + 1..] {
            if a.token == b.token
                || !exclusive(a, b)
                || !a.resources.iter().any(|r| b.resources.contains(r))
            {
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

/// At no instant do more than `permits` permits count on their validity.
fn at_most(record: &Record, permits: u32, found: &mut Vec<String>) {
    let mut edges: Vec<(f64, i32)> = Vec::new();
    for claim in record.claims.iter().filter(|c| c.mode == Mode::Permit) {
        if claim.from < claim.until {
            edges.push((claim.from, 1));
            edges.push((claim.until, -1));
        }
    }
    // Ends before starts at one instant: a claim that ends there does not overlap.
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut held = 0;
    for (at, step) in edges {
        held += step;
        if held > permits as i32 {
            found.push(format!(
                "{held} permits held at {at:.3} ms, of a semaphore of {permits}"
            ));
            return;
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
            // Permits and readers share; their fences need not grow between them.
            let shared = a.resources.iter().any(|r| b.resources.contains(r)) && exclusive(a, b);
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
