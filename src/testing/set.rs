//! `SET key value [NX | XX] [condition value] [GET] [EX s | PX ms | EXAT s | PXAT ms |
//! KEEPTTL]` on the simulated keyspace, as the keyspace's [`Profile`] parses and runs it: no
//! conditions on Redis 7.0, `IFEQ` on Valkey 9, `IFEQ` / `IFNE` / `IFDEQ` / `IFDNE` on Redis 8
//! (see [`SetConditions`]).

use redis::Value;

use super::keyspace::{Data, Entry, Keyspace};
use super::profile::SetConditions;
use super::reply::{self, bulk, not_integer, parse_int, syntax};

/// A `SET` condition on the current value (Valkey 9, Redis 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Condition {
    /// `IFEQ`: the key holds this string (a missing key fails it).
    Ifeq,
    /// `IFNE`: the key does not hold this string (a missing key passes it).
    Ifne,
    /// `IFDEQ`: the value's digest is this one (a missing key fails it).
    Ifdeq,
    /// `IFDNE`: the value's digest is not this one (a missing key passes it).
    Ifdne,
}

impl Condition {
    /// The condition called `name` (lower case), if any.
    pub(super) fn named(name: &[u8]) -> Option<Condition> {
        match name {
            b"ifeq" => Some(Condition::Ifeq),
            b"ifne" => Some(Condition::Ifne),
            b"ifdeq" => Some(Condition::Ifdeq),
            b"ifdne" => Some(Condition::Ifdne),
            _ => None,
        }
    }

    /// Whether it compares digests (16 hex digits of the value's XXH3).
    pub(super) fn digest(self) -> bool {
        matches!(self, Condition::Ifdeq | Condition::Ifdne)
    }

    /// Whether a missing key passes it.
    fn passes_missing(self) -> bool {
        matches!(self, Condition::Ifne | Condition::Ifdne)
    }

    /// Whether the string `current` passes it against `given`; an error reply for a digest
    /// (the simulated server computes no XXH3: redfence sends no digest).
    pub(super) fn passes(self, current: &[u8], given: &[u8]) -> Result<bool, Value> {
        match self {
            Condition::Ifeq => Ok(current == given),
            Condition::Ifne => Ok(current != given),
            Condition::Ifdeq | Condition::Ifdne => Err(reply::error(
                "ERR the simulated server computes no digests (IFDEQ, IFDNE)",
            )),
        }
    }
}

/// Whether a digest argument has the form Redis 8.6 takes (it counts its length only).
pub(super) fn digest_form(digest: &[u8]) -> bool {
    digest.len() == 16
}

/// Redis 8.6's error for a digest argument of another length.
pub(super) fn digest_error() -> Value {
    reply::error("ERR must be exactly 16 hexadecimal characters")
}

impl Keyspace {
    /// `SET` (its arguments `a`, the name left out, at least two).
    pub(super) fn set(&mut self, a: &[Vec<u8>]) -> Value {
        let conditions = self.profile.set_conditions();
        let (mut nx, mut xx, mut get, mut keep) = (false, false, false, false);
        let mut condition: Option<(Condition, &[u8])> = None;
        // The expiry option: its unit in ms, whether absolute, and its argument.
        let mut expiry: Option<(u64, bool, &[u8])> = None;
        let mut j = 2;
        while j < a.len() {
            let opt = a[j].to_ascii_lowercase();
            let next = a.get(j + 1);
            // An NX or XX may follow a condition on Redis 8, never on Valkey 9.
            let free = conditions == SetConditions::Full || condition.is_none();
            match (opt.as_slice(), next) {
                (b"nx", _) if !xx && free => nx = true,
                (b"xx", _) if !nx && free => xx = true,
                (b"get", _) => get = true,
                (b"keepttl", _) if expiry.is_none() => keep = true,
                (b"ex" | b"px" | b"exat" | b"pxat", Some(next)) if !keep => {
                    let unit = if opt[0] == b'e' { 1000 } else { 1 };
                    let absolute = opt.len() == 4;
                    if expiry.is_some_and(|(u, abs, _)| (u, abs) != (unit, absolute)) {
                        return syntax();
                    }
                    expiry = Some((unit, absolute, next));
                    j += 1;
                }
                (name, Some(value)) if !nx && !xx => {
                    let Some(kind) = Condition::named(name) else {
                        return syntax();
                    };
                    let taken = match conditions {
                        SetConditions::None => false,
                        SetConditions::Ifeq => kind == Condition::Ifeq && condition.is_none(),
                        SetConditions::Full => condition.is_none_or(|(c, _)| c == kind),
                    };
                    if !taken {
                        return syntax();
                    }
                    condition = Some((kind, value));
                    j += 1;
                }
                _ => return syntax(),
            }
            j += 1;
        }
        let mut expires = None;
        if let Some((unit, absolute, text)) = expiry {
            let Some(n) = parse_int(text) else {
                return not_integer();
            };
            let base = if absolute { 0 } else { self.now };
            let at = u64::try_from(n)
                .ok()
                .filter(|&n| n > 0)
                .and_then(|n| n.checked_mul(unit))
                .and_then(|ms| ms.checked_add(base))
                .filter(|&at| at <= i64::MAX as u64);
            let Some(at) = at else {
                return reply::error("ERR invalid expire time in 'set' command");
            };
            expires = Some(at);
        }
        let old = if get {
            match self.string(&a[0]) {
                Ok(old) => Some(old.map_or(Value::Nil, |v| bulk(v.clone()))),
                Err(e) => return e,
            }
        } else {
            None
        };
        let found = self.entry(&a[0]).is_some();
        let refused = (nx && found)
            || (xx && !found)
            || condition.is_some_and(|(kind, _)| !found && !kind.passes_missing());
        if refused {
            return old.unwrap_or(Value::Nil);
        }
        if let (Some((kind, value)), true) = (condition, found) {
            let passes = match self.string(&a[0]) {
                // Redis 8.6 reads a digest only to compare it (a missing key is not compared),
                // and with GET the refusal is its old value.
                Ok(_) if kind.digest() && !digest_form(value) && get => Ok(false),
                Ok(_) if kind.digest() && !digest_form(value) => Err(digest_error()),
                Ok(current) => kind.passes(current.map_or(&[][..], Vec::as_slice), value),
                Err(e) => Err(e),
            };
            match passes {
                Ok(true) => {}
                Ok(false) => return old.unwrap_or(Value::Nil),
                Err(e) => return e,
            }
        }
        if keep {
            expires = self.entry(&a[0]).and_then(|entry| entry.expires);
        }
        let entry = Entry {
            data: Data::Str(a[1].clone()),
            expires,
        };
        self.insert(&a[0], entry);
        old.unwrap_or_else(reply::ok)
    }
}
