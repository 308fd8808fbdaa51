//! One data command on the simulated keyspace, whoever sends it (a client, or a script's
//! `redis.call`): its argument count checked, then run by its kind.

use redis::Value;

use super::keyspace::{Keyspace, spec};
use super::{reply, scan, zset};

/// Runs the data command `name` (lower case) on `args` (the name first); an error reply for
/// a command the simulated server does not know or the wrong number of arguments.
pub(super) fn run(keys: &mut Keyspace, name: &str, args: &[Vec<u8>]) -> Value {
    match spec(name, keys.profile) {
        Some(spec) if spec.fits(args.len()) => {}
        Some(spec) => return reply::arity(spec.name),
        None => return reply::error("ERR the simulated server has no such command"),
    }
    let a = &args[1..];
    if let Some(value) = keys.run(name, a) {
        return value;
    }
    match name {
        "scan" => scan::scan(keys, a),
        _ => zset::run(keys, name, a),
    }
}
