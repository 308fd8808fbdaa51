//! The simulated server's keys: strings and sorted sets, each with its expiry on the server's
//! clock, and the commands on them (the generic and string ones here, the sorted-set ones in
//! `zset.rs`), as Redis 7.0 answers them.

use std::collections::HashMap;

use redis::Value;

use super::profile::Profile;
use super::reply::{self, bulk, not_integer, parse_int, wrong_type};
use super::sorted_set::ZSet;

/// What a key holds.
#[derive(Clone, Debug)]
pub(super) enum Data {
    /// A string.
    Str(Vec<u8>),
    /// A sorted set (never empty: the last member's removal deletes the key).
    Zset(ZSet),
}

/// A key's value and the server time (ms) it expires at, if any.
#[derive(Clone, Debug)]
pub(super) struct Entry {
    /// The value.
    pub(super) data: Data,
    /// When the key expires (it is gone once the clock is past this instant).
    pub(super) expires: Option<u64>,
}

/// The keys of one server and its clock.
#[derive(Debug, Default)]
pub(super) struct Keyspace {
    keys: HashMap<Vec<u8>, Entry>,
    /// The server's time, in ms.
    pub(super) now: u64,
    /// Which server it answers as (its commands, `SET`'s conditions).
    pub(super) profile: Profile,
}

/// A command this server knows: its name as Redis writes it in errors, and its arity (as
/// Redis: `n` exactly, `-n` at least `n`, the name included).
#[derive(Clone, Copy, Debug)]
pub(super) struct Spec {
    /// The command's lower-case name.
    pub(super) name: &'static str,
    /// The number of arguments, the name included.
    pub(super) arity: i32,
}

/// The data commands and their arities (Redis 7.0's; `DELIFEQ` Valkey 9's, `DELEX` Redis
/// 8.6's).
const SPECS: &[(&str, i32)] = &[
    ("get", 2),
    ("set", -3),
    ("del", -2),
    ("delifeq", 3),
    ("delex", -2),
    ("exists", -2),
    ("pexpire", -3),
    ("pttl", 2),
    ("getrange", 4),
    ("strlen", 2),
    ("incr", 2),
    ("incrby", 3),
    ("mget", -2),
    ("type", 2),
    ("time", 1),
    ("publish", 3),
    ("dbsize", 1),
    ("scan", -2),
    ("zadd", -4),
    ("zrange", -4),
    ("zrangebyscore", -4),
    ("zrem", -3),
    ("zremrangebyscore", 4),
    ("zscore", 3),
    ("zcard", 2),
];

/// The data command called `name` (lower case), if a server of `profile` knows it.
pub(super) fn spec(name: &str, profile: Profile) -> Option<Spec> {
    SPECS
        .iter()
        .find(|(known, _)| *known == name && profile.has(name))
        .map(|&(name, arity)| Spec { name, arity })
}

impl Spec {
    /// Whether `argc` arguments (the name included) fit the arity.
    pub(super) fn fits(&self, argc: usize) -> bool {
        let argc = i64::try_from(argc).unwrap_or(i64::MAX);
        let arity = i64::from(self.arity);
        if arity >= 0 {
            argc == arity
        } else {
            argc >= -arity
        }
    }
}

impl Keyspace {
    /// No keys, the clock at `now` (ms), answering as `profile`.
    pub(super) fn new(now: u64, profile: Profile) -> Keyspace {
        Keyspace {
            keys: HashMap::new(),
            now,
            profile,
        }
    }

    /// The live entry at `key` (not expired by the clock).
    pub(super) fn entry(&self, key: &[u8]) -> Option<&Entry> {
        self.keys
            .get(key)
            .filter(|entry| entry.expires.is_none_or(|at| at >= self.now))
    }

    /// The live entry at `key`, to change; an expired one is removed first.
    pub(super) fn entry_mut(&mut self, key: &[u8]) -> Option<&mut Entry> {
        if self.entry(key).is_none() {
            self.keys.remove(key);
            return None;
        }
        self.keys.get_mut(key)
    }

    /// Every live key and its entry, in no order.
    pub(super) fn live(&self) -> impl Iterator<Item = (&[u8], &Entry)> {
        self.keys
            .iter()
            .filter(|(_, entry)| entry.expires.is_none_or(|at| at >= self.now))
            .map(|(key, entry)| (key.as_slice(), entry))
    }

    /// Puts `entry` at `key`, over whatever was there.
    pub(super) fn insert(&mut self, key: &[u8], entry: Entry) {
        self.keys.insert(key.to_vec(), entry);
    }

    /// Removes `key`: whether it was live.
    pub(super) fn remove(&mut self, key: &[u8]) -> bool {
        let live = self.entry(key).is_some();
        self.keys.remove(key);
        live
    }

    /// Forgets every key.
    pub(super) fn clear(&mut self) {
        self.keys.clear();
    }

    /// The string at `key`: `Ok(None)` for none, `Err` for a key of another type.
    pub(super) fn string(&self, key: &[u8]) -> Result<Option<&Vec<u8>>, Value> {
        match self.entry(key).map(|entry| &entry.data) {
            None => Ok(None),
            Some(Data::Str(value)) => Ok(Some(value)),
            Some(_) => Err(wrong_type()),
        }
    }

    /// Runs the string or generic command `name` (lower case) on `a` (its arguments, the name
    /// left out), whose count was checked; `None` for another kind (a sorted set's, `SCAN`:
    /// see `commands::run`).
    pub(super) fn run(&mut self, name: &str, a: &[Vec<u8>]) -> Option<Value> {
        Some(match name {
            "get" => match self.string(&a[0]) {
                Ok(value) => value.map_or(Value::Nil, |v| bulk(v.clone())),
                Err(e) => e,
            },
            "set" => self.set(a),
            "del" => count(a.iter().filter(|key| self.remove(key)).count()),
            "delifeq" => self.delifeq(a),
            "delex" => self.delex(a),
            "exists" => count(a.iter().filter(|key| self.entry(key).is_some()).count()),
            "pexpire" => self.pexpire(a),
            "pttl" => Value::Int(self.pttl(&a[0])),
            "getrange" => self.getrange(a),
            "strlen" => match self.string(&a[0]) {
                Ok(value) => count(value.map_or(0, Vec::len)),
                Err(e) => e,
            },
            "incr" => self.incr_by(&a[0], 1),
            "incrby" => match parse_int(&a[1]) {
                Some(by) => self.incr_by(&a[0], by),
                None => not_integer(),
            },
            "mget" => Value::Array(
                a.iter()
                    .map(|key| match self.string(key) {
                        Ok(Some(value)) => bulk(value.clone()),
                        _ => Value::Nil,
                    })
                    .collect(),
            ),
            "type" => reply::status(match self.entry(&a[0]).map(|entry| &entry.data) {
                None => "none",
                Some(Data::Str(_)) => "string",
                Some(Data::Zset(_)) => "zset",
            }),
            "time" => Value::Array(vec![
                bulk((self.now / 1000).to_string()),
                bulk((self.now % 1000 * 1000).to_string()),
            ]),
            "publish" => Value::Int(0),
            "dbsize" => count(self.live().count()),
            _ => return None,
        })
    }

    /// `PEXPIRE key ms [NX | XX | GT | LT]`.
    fn pexpire(&mut self, a: &[Vec<u8>]) -> Value {
        let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
        for opt in &a[2..] {
            match opt.to_ascii_lowercase().as_slice() {
                b"nx" => nx = true,
                b"xx" => xx = true,
                b"gt" => gt = true,
                b"lt" => lt = true,
                _ => {
                    let opt = String::from_utf8_lossy(opt);
                    return reply::error(&format!("ERR Unsupported option {opt}"));
                }
            }
        }
        if nx && (xx || gt || lt) {
            return reply::error(
                "ERR NX and XX, GT or LT options at the same time are not compatible",
            );
        }
        if gt && lt {
            return reply::error("ERR GT and LT options at the same time are not compatible");
        }
        let Some(ms) = parse_int(&a[1]) else {
            return not_integer();
        };
        let now = i64::try_from(self.now).unwrap_or(i64::MAX);
        let Some(when) = ms.checked_add(now) else {
            return reply::error("ERR invalid expire time in 'pexpire' command");
        };
        let Some(entry) = self.entry_mut(&a[0]) else {
            return Value::Int(0);
        };
        let current = entry
            .expires
            .map(|at| i64::try_from(at).unwrap_or(i64::MAX));
        let refused = (nx && current.is_some())
            || (xx && current.is_none())
            || (gt && current.is_none_or(|at| when <= at))
            || (lt && current.is_some_and(|at| when >= at));
        if refused {
            return Value::Int(0);
        }
        match u64::try_from(when) {
            Ok(at) if when > now => entry.expires = Some(at),
            _ => {
                self.remove(&a[0]);
            }
        }
        Value::Int(1)
    }

    /// `PTTL key`: -2 for no key, -1 for no expiry, else the ms left.
    pub(super) fn pttl(&self, key: &[u8]) -> i64 {
        match self.entry(key) {
            None => -2,
            Some(Entry { expires: None, .. }) => -1,
            Some(Entry {
                expires: Some(at), ..
            }) => i64::try_from(at.saturating_sub(self.now)).unwrap_or(i64::MAX),
        }
    }

    /// `GETRANGE key start end`.
    fn getrange(&self, a: &[Vec<u8>]) -> Value {
        let (Some(mut start), Some(mut end)) = (parse_int(&a[1]), parse_int(&a[2])) else {
            return not_integer();
        };
        let value = match self.string(&a[0]) {
            Ok(Some(value)) => value,
            Ok(None) => return bulk(Vec::new()),
            Err(e) => return e,
        };
        let len = i64::try_from(value.len()).unwrap_or(i64::MAX);
        if start < 0 && end < 0 && start > end {
            return bulk(Vec::new());
        }
        if start < 0 {
            start += len;
        }
        if end < 0 {
            end += len;
        }
        start = start.max(0);
        end = end.max(0).min(len - 1);
        if start > end || len == 0 {
            return bulk(Vec::new());
        }
        let (Ok(start), Ok(end)) = (usize::try_from(start), usize::try_from(end)) else {
            return bulk(Vec::new());
        };
        bulk(value[start..=end].to_vec())
    }

    /// `INCRBY key by` (and `INCR`): the TTL stays.
    fn incr_by(&mut self, key: &[u8], by: i64) -> Value {
        let current = match self.string(key) {
            Ok(None) => 0,
            Ok(Some(value)) => match parse_int(value) {
                Some(n) => n,
                None => return not_integer(),
            },
            Err(e) => return e,
        };
        let Some(new) = current.checked_add(by) else {
            return reply::error("ERR increment or decrement would overflow");
        };
        let expires = self.entry(key).and_then(|entry| entry.expires);
        let data = Data::Str(new.to_string().into_bytes());
        self.insert(key, Entry { data, expires });
        Value::Int(new)
    }

    /// The sorted set at `key`: `Ok(None)` for none, `Err` for a key of another type.
    pub(super) fn zset(&self, key: &[u8]) -> Result<Option<&ZSet>, Value> {
        match self.entry(key).map(|entry| &entry.data) {
            None => Ok(None),
            Some(Data::Zset(set)) => Ok(Some(set)),
            Some(_) => Err(wrong_type()),
        }
    }

    /// The sorted set at `key`, to change: `Ok(None)` for none, `Err` for another type.
    pub(super) fn zset_mut(&mut self, key: &[u8]) -> Result<Option<&mut ZSet>, Value> {
        match self.entry_mut(key).map(|entry| &mut entry.data) {
            None => Ok(None),
            Some(Data::Zset(set)) => Ok(Some(set)),
            Some(_) => Err(wrong_type()),
        }
    }
}

/// An integer reply of a count.
pub(super) fn count(n: usize) -> Value {
    Value::Int(i64::try_from(n).unwrap_or(i64::MAX))
}
