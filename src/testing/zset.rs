//! The sorted-set commands (`ZADD`, `ZRANGE`, `ZRANGEBYSCORE`, `ZREM`,
//! `ZREMRANGEBYSCORE`, `ZSCORE`, `ZCARD`), as Redis 7.0 answers them over RESP2.

use redis::Value;

use super::keyspace::{Data, Entry, Keyspace, count};
use super::reply::{self, bulk, not_integer, parse_float, parse_int, syntax};
use super::sorted_set::ZSet;

/// A score range of `ZRANGEBYSCORE` and `ZREMRANGEBYSCORE`: bounds, each maybe exclusive.
#[derive(Clone, Copy, Debug)]
struct Range {
    min: f64,
    minex: bool,
    max: f64,
    maxex: bool,
}

impl Range {
    /// The range of `min` and `max` as `zslParseRange` reads them (`(` exclusive, `strtod`).
    fn parse(min: &[u8], max: &[u8]) -> Option<Range> {
        let bound = |text: &[u8]| match text {
            [b'(', rest @ ..] => strtod(rest).map(|x| (x, true)),
            _ => strtod(text).map(|x| (x, false)),
        };
        let ((min, minex), (max, maxex)) = (bound(min)?, bound(max)?);
        Some(Range {
            min,
            minex,
            max,
            maxex,
        })
    }

    /// Whether `x` is within the range.
    fn holds(&self, x: f64) -> bool {
        let above = if self.minex {
            x > self.min
        } else {
            x >= self.min
        };
        let below = if self.maxex {
            x < self.max
        } else {
            x <= self.max
        };
        above && below
    }
}

/// A bound as `strtod` reads it in a range: leading blanks skipped, an empty one is 0.
fn strtod(text: &[u8]) -> Option<f64> {
    let text = text.trim_ascii_start();
    if text.is_empty() {
        return Some(0.0);
    }
    parse_float(text)
}

/// Runs the sorted-set command `name` on `a` (its arguments after the name).
pub(super) fn run(keys: &mut Keyspace, name: &str, a: &[Vec<u8>]) -> Value {
    match name {
        "zadd" => zadd(keys, a),
        "zrange" => zrange(keys, a, false),
        "zrangebyscore" => zrange(keys, a, true),
        "zrem" => zrem(keys, a),
        "zremrangebyscore" => zremrangebyscore(keys, a),
        "zscore" => match keys.zset(&a[0]) {
            Ok(set) => set
                .and_then(|set| set.score(&a[1]))
                .map_or(Value::Nil, |s| bulk(keys.profile.double(s))),
            Err(e) => e,
        },
        "zcard" => match keys.zset(&a[0]) {
            Ok(set) => count(set.map_or(0, ZSet::len)),
            Err(e) => e,
        },
        _ => reply::error("ERR the simulated server has no such command"),
    }
}

/// `ZADD key [NX | XX] [GT | LT] [CH] [INCR] score member [score member ...]`.
fn zadd(keys: &mut Keyspace, a: &[Vec<u8>]) -> Value {
    let (mut nx, mut xx, mut gt, mut lt, mut ch, mut incr) =
        (false, false, false, false, false, false);
    let mut at = 1;
    while at < a.len() {
        match a[at].to_ascii_lowercase().as_slice() {
            b"nx" => nx = true,
            b"xx" => xx = true,
            b"gt" => gt = true,
            b"lt" => lt = true,
            b"ch" => ch = true,
            b"incr" => incr = true,
            _ => break,
        }
        at += 1;
    }
    let pairs = &a[at..];
    if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
        return syntax();
    }
    if nx && xx {
        return reply::error("ERR XX and NX options at the same time are not compatible");
    }
    if (nx && (gt || lt)) || (gt && lt) {
        return reply::error("ERR GT, LT, and/or NX options at the same time are not compatible");
    }
    if incr && pairs.len() > 2 {
        return reply::error("ERR INCR option supports a single increment-element pair");
    }
    let mut scores = Vec::with_capacity(pairs.len() / 2);
    for pair in pairs.chunks(2) {
        match parse_float(&pair[0]) {
            Some(score) => scores.push(score),
            None => return reply::error("ERR value is not a valid float"),
        }
    }
    let set = match keys.zset_mut(&a[0]) {
        Ok(Some(set)) => set,
        Ok(None) if xx => return if incr { Value::Nil } else { Value::Int(0) },
        Ok(None) => {
            let data = Data::Zset(ZSet::default());
            keys.insert(
                &a[0],
                Entry {
                    data,
                    expires: None,
                },
            );
            match keys.zset_mut(&a[0]) {
                Ok(Some(set)) => set,
                _ => return reply::error("ERR the simulated server lost a new key"),
            }
        }
        Err(e) => return e,
    };
    let (mut added, mut updated) = (0, 0);
    let mut last = None;
    for (pair, mut score) in pairs.chunks(2).zip(scores) {
        let member = &pair[1];
        match set.score(member) {
            Some(current) => {
                if nx {
                    continue;
                }
                if incr {
                    score += current;
                    if score.is_nan() {
                        return reply::error("ERR resulting score is not a number (NaN)");
                    }
                }
                if (gt && score <= current) || (lt && score >= current) {
                    continue;
                }
                last = Some(score);
                if score != current {
                    set.insert(member, score);
                    updated += 1;
                }
            }
            None if xx => {}
            None => {
                set.insert(member, score);
                added += 1;
                last = Some(score);
            }
        }
    }
    if incr {
        return last.map_or(Value::Nil, |s| bulk(keys.profile.double(s)));
    }
    count(if ch { added + updated } else { added })
}

/// `ZRANGE key start stop [BYSCORE] [REV] [LIMIT offset count] [WITHSCORES]`, and
/// `ZRANGEBYSCORE key min max [WITHSCORES] [LIMIT offset count]` (`by_score`).
fn zrange(keys: &Keyspace, a: &[Vec<u8>], by_score: bool) -> Value {
    let (mut withscores, mut rev, mut score) = (false, false, by_score);
    let (mut lex, mut offset, mut limit) = (false, 0_i64, -1_i64);
    let mut j = 3;
    while j < a.len() {
        let left = a.len() - j - 1;
        match a[j].to_ascii_lowercase().as_slice() {
            b"withscores" => withscores = true,
            b"limit" if left >= 2 => {
                let (Some(o), Some(l)) = (parse_int(&a[j + 1]), parse_int(&a[j + 2])) else {
                    return not_integer();
                };
                (offset, limit) = (o, l);
                j += 2;
            }
            b"rev" if !by_score && !rev => rev = true,
            b"bylex" if !by_score && !score && !lex => lex = true,
            b"byscore" if !by_score && !score && !lex => score = true,
            _ => return syntax(),
        }
        j += 1;
    }
    if limit != -1 && !score && !lex {
        return reply::error(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
        );
    }
    if lex {
        return reply::error("ERR the simulated server has no BYLEX");
    }
    let rows: Vec<(&[u8], f64)> = if score {
        let (min, max) = if rev { (&a[2], &a[1]) } else { (&a[1], &a[2]) };
        let Some(range) = Range::parse(min, max) else {
            return reply::error("ERR min or max is not a float");
        };
        let set = match keys.zset(&a[0]) {
            Ok(Some(set)) => set,
            Ok(None) => return Value::Array(Vec::new()),
            Err(e) => return e,
        };
        if offset < 0 {
            return Value::Array(Vec::new());
        }
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        set.iter(rev)
            .filter(|&(_, s)| range.holds(s))
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .take(limit)
            .collect()
    } else {
        let (Some(start), Some(end)) = (parse_int(&a[1]), parse_int(&a[2])) else {
            return not_integer();
        };
        let set = match keys.zset(&a[0]) {
            Ok(Some(set)) => set,
            Ok(None) => return Value::Array(Vec::new()),
            Err(e) => return e,
        };
        let len = i64::try_from(set.len()).unwrap_or(i64::MAX);
        let start = if start < 0 { start + len } else { start }.max(0);
        let end = if end < 0 { end + len } else { end };
        if start > end || start >= len {
            return Value::Array(Vec::new());
        }
        let end = end.min(len - 1);
        let (Ok(skip), Ok(take)) = (usize::try_from(start), usize::try_from(end - start + 1))
        else {
            return Value::Array(Vec::new());
        };
        set.iter(rev).skip(skip).take(take).collect()
    };
    let mut out = Vec::with_capacity(rows.len() * if withscores { 2 } else { 1 });
    for (member, s) in rows {
        out.push(bulk(member.to_vec()));
        if withscores {
            out.push(bulk(keys.profile.double(s)));
        }
    }
    Value::Array(out)
}

/// Deletes the sorted set at `key` once it is empty.
fn drop_if_empty(keys: &mut Keyspace, key: &[u8]) {
    if let Ok(Some(set)) = keys.zset(key)
        && set.len() == 0
    {
        keys.remove(key);
    }
}

/// `ZREM key member [member ...]`.
fn zrem(keys: &mut Keyspace, a: &[Vec<u8>]) -> Value {
    let removed = match keys.zset_mut(&a[0]) {
        Ok(Some(set)) => a[1..].iter().filter(|m| set.remove(m)).count(),
        Ok(None) => 0,
        Err(e) => return e,
    };
    drop_if_empty(keys, &a[0]);
    count(removed)
}

/// `ZREMRANGEBYSCORE key min max`.
fn zremrangebyscore(keys: &mut Keyspace, a: &[Vec<u8>]) -> Value {
    let Some(range) = Range::parse(&a[1], &a[2]) else {
        return reply::error("ERR min or max is not a float");
    };
    let removed = match keys.zset_mut(&a[0]) {
        Ok(Some(set)) => {
            let doomed: Vec<Vec<u8>> = set
                .iter(false)
                .filter(|&(_, s)| range.holds(s))
                .map(|(m, _)| m.to_vec())
                .collect();
            for member in &doomed {
                set.remove(member);
            }
            doomed.len()
        }
        Ok(None) => 0,
        Err(e) => return e,
    };
    drop_if_empty(keys, &a[0]);
    count(removed)
}
