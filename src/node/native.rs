//! Plain acquires as native commands: on a node's own socket, a batch sends each plain
//! single-key acquire (not fair mode) as one `SET key token NX GET PX ttl` in the same write as
//! its script call, instead of as an operation inside the script; the server does about a
//! quarter of the work. Keys and values are those of the script (node-redlock and redsync
//! still interoperate), and so is every lock's answer:
//!
//! - nil: the key was free and is ours; our own token: the repeat of our request that landed
//!   (granted, as the script grants it; every attempt has a token of its own, so the key was
//!   set after the attempt started and outlives the validity computed from that start);
//! - another token: refused, and the key is marked as waited for, as the script marks it (with
//!   a `SET` sent with the node's next write, so a release in between does not publish: the
//!   waiter then polls, one retry delay at most);
//! - `WRONGTYPE` (and any error but the two below): that lock's own error.
//!
//! Only an acquire whose key no other operation of the batch touches goes natively: the
//! natives are written before the script call, and every key keeps the order of its
//! operations. A connection sends natives only once it has passed the [`Probe`]: a script call
//! that succeeded (a user who may not run the scripts must not get locks it cannot release),
//! with the probe's commands written after it, answered as Redis 7 and Valkey answer them. A server that answers otherwise (older than Redis 7, a look-alike that
//! gets `NX` with `GET` wrong, an ACL that does not cover the marks) gets scripts only on that
//! connection, and so does one that refuses a native (`ERR`, `NOPERM`): those acquires run
//! again as script operations after the rest of the batch. A new connection, and one whose
//! script call failed or timed out, is probed again.

use redis::{Cmd, Value};

use super::pipeline::Reply;
use super::socket::Packed;
use super::{Op, Request};
use crate::error::NodeFailure;
use crate::helper_keys::{MIN_WAIT_MARK_MS, PROBE, WAITING};

/// Which of `runs` go as native commands: plain single-key acquires whose key no operation
/// that goes in the script touches (so that every key's operations keep their order).
///
/// This runs on every call: the scripted keys go into a 256-bit filter (no allocation, no
/// string compares), and only an acquire whose key hits it is compared with them.
pub(super) fn natives(runs: &[(Request, Option<Reply>)]) -> Vec<bool> {
    let eligible =
        |req: &Request| req.op == Op::Acquire && req.queue.is_none() && req.keys.len() == 1;
    let scripted = || {
        runs.iter()
            .filter(|(req, _)| !eligible(req))
            .flat_map(|(req, _)| req.keys.iter().map(String::as_str))
    };
    let mut filter = [0_u64; 4];
    for key in scripted() {
        let (word, bit) = filter_bit(key);
        filter[word] |= bit;
    }
    runs.iter()
        .map(|(req, _)| {
            eligible(req) && {
                let key = req.keys[0].as_str();
                let (word, bit) = filter_bit(key);
                filter[word] & bit == 0 || !scripted().any(|other| other == key)
            }
        })
        .collect()
}

/// Where `key` falls in [`natives`]' filter: a word and a bit, from its FNV-1a hash.
fn filter_bit(key: &str) -> (usize, u64) {
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    ((hash >> 6) as usize & 3, 1 << (hash & 63))
}

/// A plain single-key acquire as one native command, appended to `natives`:
/// `SET key token NX GET PX ttl` sets the key when it is free (reply nil) and otherwise
/// returns who holds it.
pub(super) fn push_native_acquire(natives: &mut Packed, req: &Request) {
    let mut ttl = itoa::Buffer::new();
    natives.push(&[
        b"SET",
        req.keys[0].as_bytes(),
        req.token.as_bytes(),
        b"NX",
        b"GET",
        b"PX",
        ttl.format(req.ttl_ms).as_bytes(),
    ]);
}

/// Marks `key` as waited for, as a refused acquire does in the script (its next release
/// publishes).
pub(super) fn wait_mark(key: &str, ttl_ms: u64) -> Cmd {
    let mut command = redis::cmd("SET");
    command
        .arg(format!("{key}{WAITING}"))
        .arg("1")
        .arg("PX")
        .arg(ttl_ms.max(MIN_WAIT_MARK_MS));
    command
}

/// What a native acquire's reply means.
#[derive(Debug)]
pub(super) enum NativeOutcome {
    Granted,
    Refused,
    /// The error of this lock alone (e.g. `WRONGTYPE`: the key holds another type).
    Failed(NodeFailure),
    /// The server does not take the command (too old, or not allowed): run it as a script.
    Unsupported,
}

pub(super) fn native_outcome(reply: Option<Value>, token: &str) -> NativeOutcome {
    match reply {
        Some(Value::Nil) => NativeOutcome::Granted,
        Some(Value::BulkString(holder)) if holder == token.as_bytes() => NativeOutcome::Granted,
        Some(Value::BulkString(_)) => NativeOutcome::Refused,
        Some(Value::ServerError(err)) if matches!(err.code(), "ERR" | "NOPERM") => {
            NativeOutcome::Unsupported
        }
        // Classified as the script call's own error would be (e.g. `READONLY`, `OOM`).
        Some(Value::ServerError(err)) => NativeOutcome::Failed(redis::RedisError::from(err).into()),
        Some(other) => NativeOutcome::Failed(NodeFailure::Reply(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "a native acquire's reply",
            format!("{other:?}"),
        )))),
        None => NativeOutcome::Failed(NodeFailure::Reply(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "no reply to a native acquire",
        )))),
    }
}

/// The probe a connection passes before it sends natives, on a key of its own beside the
/// batch's first key `K`, `K:<token>:redfence:probe` (`token` is a request's, random; the
/// suffix is reserved, so no redfence lock has that key, and no peer holds one with a random
/// part): `SET k 1 NX GET PX 100`, `SET k 2 NX GET PX 100`, `GET k`, then `DEL k`, so that
/// nothing is left behind. Redis 7 and Valkey answer nil, `1`, `1`; a server that answers nil
/// when `NX` blocked the write, echoes the value it was given, or overwrites despite `NX`
/// answers otherwise.
pub(super) struct Probe {
    commands: [Cmd; 4],
}

impl Probe {
    /// A probe beside `key`, on a key named after `token`.
    pub(super) fn new(key: &str, token: &str) -> Self {
        let probe_key = format!("{key}:{token}{PROBE}");
        let set = |value: &str| {
            let mut command = redis::cmd("SET");
            command
                .arg(&probe_key)
                .arg(value)
                .arg("NX")
                .arg("GET")
                .arg("PX")
                .arg(100);
            command
        };
        let (mut get, mut del) = (redis::cmd("GET"), redis::cmd("DEL"));
        get.arg(&probe_key);
        del.arg(&probe_key);
        Probe {
            commands: [set("1"), set("2"), get, del],
        }
    }

    pub(super) fn commands(&self) -> &[Cmd] {
        &self.commands
    }

    /// Whether the replies are Redis 7's: `SET ... NX GET` works as it does there.
    pub(super) fn passed(&self, replies: &[Value]) -> bool {
        matches!(
            replies,
            [Value::Nil, Value::BulkString(old), Value::BulkString(now), _]
                if old == b"1" && now == b"1"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(op: Op, keys: &[&str], fair: bool) -> (Request, Option<Reply>) {
        let queue = fair.then(|| {
            std::sync::Arc::new(super::super::QueueTicket {
                waiter: "w".into(),
                ticket: 1,
                lease_ms: 1_000,
            })
        });
        let req = Request {
            op,
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            token: "token".into(),
            ttl_ms: 1_000,
            queue,
        };
        (req, None)
    }

    #[test]
    fn only_plain_single_key_acquires_whose_key_the_script_does_not_touch_go_natively() {
        let runs = [
            req(Op::Acquire, &["a"], false),
            req(Op::Acquire, &["b", "c"], false), // two keys
            req(Op::Acquire, &["d"], true),       // fair
            req(Op::Extend, &["e"], false),
            req(Op::Acquire, &["f"], false),
            req(Op::Release, &["f"], false), // after f's acquire: f stays in the script
            req(Op::Release, &["g"], false),
            req(Op::Acquire, &["g"], false), // after g's release: g too
            req(Op::Acquire, &["a"], false), // a twice, both native, in order
        ];
        assert_eq!(
            natives(&runs),
            [true, false, false, false, false, false, false, false, true]
        );
    }

    #[test]
    fn a_native_acquire_is_the_command_redis_rs_would_write() {
        let (mut acquire, _) = req(Op::Acquire, &["lock:é"], false);
        let mut packed = Packed::default();
        for ttl_ms in [0, 30_000, u64::MAX] {
            acquire.ttl_ms = ttl_ms;
            packed.clear();
            push_native_acquire(&mut packed, &acquire);
            let expected = redis::cmd("SET")
                .arg("lock:é")
                .arg("token")
                .arg("NX")
                .arg("GET")
                .arg("PX")
                .arg(ttl_ms)
                .get_packed_command();
            assert_eq!(packed.bytes(), expected);
        }
    }

    #[test]
    fn a_crowded_filter_still_tells_keys_apart() {
        // 300 scripted keys set nearly every bit of the filter: acquires take the exact check.
        let names: Vec<String> = (0..300).map(|i| format!("r{i}")).collect();
        let mut runs: Vec<_> = names
            .iter()
            .map(|name| req(Op::Release, &[name], false))
            .collect();
        runs.push(req(Op::Acquire, &["r7"], false));
        runs.push(req(Op::Acquire, &["x7"], false));
        assert_eq!(natives(&runs)[300..], [false, true]);
    }

    #[test]
    fn what_a_native_acquires_reply_means() {
        let granted = |reply| matches!(native_outcome(reply, "t1"), NativeOutcome::Granted);
        assert!(granted(Some(Value::Nil)), "the key was free");
        assert!(
            granted(Some(Value::BulkString(b"t1".to_vec()))),
            "the repeat of our own request that landed"
        );
        assert!(matches!(
            native_outcome(Some(Value::BulkString(b"t2".to_vec())), "t1"),
            NativeOutcome::Refused
        ));
        let error_reply = |line: &str| {
            let bytes = format!("-{line}\r\n");
            match super::super::resp::parse(bytes.as_bytes()) {
                Ok(Some((value, _))) => native_outcome(Some(value), "t1"),
                other => panic!("not an error reply: {other:?}"),
            }
        };
        match error_reply("WRONGTYPE Operation against a key holding the wrong kind of value") {
            NativeOutcome::Failed(failure) => {
                assert!(format!("{failure:?}").contains("WRONGTYPE"), "{failure:?}");
            }
            other => panic!("the lock's own error: {other:?}"),
        }
        // Any other error is classified as the script call's own would be.
        match error_reply("READONLY You can't write against a read only replica.") {
            NativeOutcome::Failed(NodeFailure::Reply(err)) => {
                assert_eq!(err.code(), Some("READONLY"), "{err}");
            }
            other => panic!("the lock's own error: {other:?}"),
        }
        // Redis 6 (no NX with GET), or a user not allowed the command: the script instead.
        for line in ["ERR syntax error", "NOPERM this user has no permissions"] {
            assert!(
                matches!(error_reply(line), NativeOutcome::Unsupported),
                "{line}"
            );
        }
        assert!(matches!(
            native_outcome(Some(Value::Int(1)), "t1"),
            NativeOutcome::Failed(_)
        ));
        assert!(matches!(
            native_outcome(None, "t1"),
            NativeOutcome::Failed(_)
        ));
    }

    #[test]
    fn the_probe_passes_only_on_nil_then_its_first_value_twice() {
        let probe = Probe::new("job", "t1");
        let one = || Value::BulkString(b"1".to_vec());
        let two = || Value::BulkString(b"2".to_vec());
        let passed = |replies: [Value; 3]| {
            let [a, b, c] = replies;
            probe.passed(&[a, b, c, Value::Int(1)])
        };
        assert!(passed([Value::Nil, one(), one()]));
        let error = |line: &str| match super::super::resp::parse(format!("-{line}\r\n").as_bytes())
        {
            Ok(Some((value, _))) => value,
            other => panic!("not an error reply: {other:?}"),
        };
        for replies in [
            // Nil when NX blocked the write (a look-alike server).
            [Value::Nil, Value::Nil, one()],
            // The value it was given, echoed.
            [one(), two(), one()],
            [Value::Nil, two(), one()],
            // NX ignored: the old value, then overwritten.
            [Value::Nil, one(), two()],
            // Our own value three times: the first SET did not answer nil.
            [one(), one(), one()],
            // GET ignored; Redis 6's syntax error; an ACL whose patterns miss the key.
            [Value::Okay, Value::Okay, one()],
            [
                error("ERR syntax error"),
                error("ERR syntax error"),
                Value::Nil,
            ],
            [
                error("NOPERM no permissions"),
                error("NOPERM no permissions"),
                Value::Nil,
            ],
        ] {
            assert!(!passed(replies.clone()), "{replies:?}");
        }
        // Its key is its own: beside the lock key, named after the token, and reserved.
        let keys: Vec<String> = probe
            .commands()
            .iter()
            .map(|command| String::from_utf8_lossy(&command.get_packed_command()).into_owned())
            .collect();
        assert!(
            keys.iter()
                .all(|packed| packed.contains("job:t1:redfence:probe"))
        );
        assert!(keys[3].starts_with("*2\r\n$3\r\nDEL\r\n"), "{}", keys[3]);
    }
}
