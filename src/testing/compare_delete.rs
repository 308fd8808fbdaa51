//! The compare-and-delete commands: Valkey 9's `DELIFEQ key value` and Redis 8.4's `DELEX key
//! [IFEQ | IFNE | IFDEQ | IFDNE value]`, as each real server answers them (only a profile that
//! has the command gets here: see [`Profile::has`](super::profile::Profile::has)).

use redis::Value;

use super::keyspace::{Keyspace, count};
use super::reply;
use super::set::{Condition, digest_error, digest_form};

impl Keyspace {
    /// `DELIFEQ key value` (`a`: its arguments, the name left out, two): 1 when the key held
    /// exactly `value` and is now deleted, 0 when it held another string or none, `WRONGTYPE`
    /// for a key of another type.
    pub(super) fn delifeq(&mut self, a: &[Vec<u8>]) -> Value {
        match self.string(&a[0]) {
            Ok(Some(current)) if *current == a[1] => count(usize::from(self.remove(&a[0]))),
            Ok(_) => Value::Int(0),
            Err(e) => e,
        }
    }

    /// `DELEX key` (any type, as `DEL` of one key) or `DELEX key condition value` (`a`: its
    /// arguments, the name left out, at least one). Redis 8.6 looks the key up first: a missing
    /// key is 0 whatever the condition says, a key of another type an error, and only then is
    /// the condition read.
    pub(super) fn delex(&mut self, a: &[Vec<u8>]) -> Value {
        match a.len() {
            1 => return count(usize::from(self.remove(&a[0]))),
            3 => {}
            _ => return reply::arity("delex"),
        }
        let current = match self.string(&a[0]) {
            Ok(Some(current)) => current,
            Ok(None) => return Value::Int(0),
            Err(_) => {
                return reply::error(
                    "ERR Key should be of string type if conditions are specified",
                );
            }
        };
        let Some(condition) = Condition::named(&a[1].to_ascii_lowercase()) else {
            return reply::error("ERR Invalid condition. Use IFEQ, IFNE, IFDEQ, or IFDNE");
        };
        if condition.digest() && !digest_form(&a[2]) {
            return digest_error();
        }
        match condition.passes(current, &a[2]) {
            Ok(true) => count(usize::from(self.remove(&a[0]))),
            Ok(false) => Value::Int(0),
            Err(e) => e,
        }
    }
}
