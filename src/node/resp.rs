//! Reading RESP2 replies from a byte buffer, for the connection a node's queue owns
//! (`socket.rs`): [`parse`] takes one whole reply off the front of what has arrived so far, or
//! says that more bytes are needed, without consuming anything until the reply is whole (so a
//! read cut short by a timeout loses nothing).
//!
//! Replies come back as redis-rs [`Value`]s, and an error reply as the [`RedisError`] redis-rs
//! itself makes of it (its kind and code: `NOSCRIPT`, `NOPERM`, `WRONGPASS`, ...), so that the
//! rest of the crate sees the same errors over either connection.

use redis::{ErrorKind, RedisError, RedisResult, Value};

/// How deep arrays may nest in a reply (the batch script's reply is one flat array).
const MAX_DEPTH: usize = 8;

/// Takes one whole reply off the front of `buf`: `Ok(Some((reply, bytes used)))`, or
/// `Ok(None)` when `buf` holds only part of one. `Err` when the bytes are not RESP2 (the
/// connection is then out of step and must be dropped). An error reply is `Ok` with a
/// `Value::ServerError` inside: it answers its command and leaves the connection usable.
pub(crate) fn parse(buf: &[u8]) -> RedisResult<Option<(Value, usize)>> {
    reply(buf, 0, 0)
}

/// The reply that starts at `at`, and where it ends.
fn reply(buf: &[u8], at: usize, depth: usize) -> RedisResult<Option<(Value, usize)>> {
    let Some((kind, line, next)) = header(buf, at)? else {
        return Ok(None);
    };
    let value = match kind {
        b'+' if line == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(text(line)?.to_owned()),
        b'-' => server_error(&buf[at..next])?,
        b':' => Value::Int(integer(line)?),
        b'$' => {
            let len = integer(line)?;
            if len < 0 {
                return Ok(Some((Value::Nil, next)));
            }
            let len = usize::try_from(len).map_err(|_| malformed("bulk length"))?;
            let end = next
                .checked_add(len)
                .ok_or_else(|| malformed("bulk length"))?;
            let after = end.checked_add(2).ok_or_else(|| malformed("bulk length"))?;
            if buf.len() < after {
                return Ok(None);
            }
            if &buf[end..after] != b"\r\n" {
                return Err(malformed("bulk string not ended by CRLF"));
            }
            return Ok(Some((Value::BulkString(buf[next..end].to_vec()), after)));
        }
        b'*' => {
            let count = integer(line)?;
            if count < 0 {
                return Ok(Some((Value::Nil, next)));
            }
            if depth >= MAX_DEPTH {
                return Err(malformed("arrays nested too deep"));
            }
            let count = usize::try_from(count).map_err(|_| malformed("array length"))?;
            // Every element takes at least 3 bytes: no allocation beyond what has arrived.
            let mut items = Vec::with_capacity(count.min(buf.len().saturating_sub(next) / 3));
            let mut end = next;
            for _ in 0..count {
                let Some((item, after)) = reply(buf, end, depth + 1)? else {
                    return Ok(None);
                };
                items.push(item);
                end = after;
            }
            return Ok(Some((Value::Array(items), end)));
        }
        other => {
            return Err(malformed_owned(format!(
                "unexpected reply type byte {:?}",
                char::from(other)
            )));
        }
    };
    Ok(Some((value, next)))
}

/// The type byte and the rest of the line that starts at `at` (without CRLF), and where the
/// next line starts; `None` while the line is incomplete.
fn header(buf: &[u8], at: usize) -> RedisResult<Option<(u8, &[u8], usize)>> {
    let Some(rest) = buf.get(at..) else {
        return Ok(None);
    };
    let Some(newline) = rest.iter().position(|&b| b == b'\n') else {
        return Ok(None);
    };
    if newline < 2 || rest[newline - 1] != b'\r' {
        return Err(malformed("line not ended by CRLF"));
    }
    Ok(Some((rest[0], &rest[1..newline - 1], at + newline + 1)))
}

fn integer(line: &[u8]) -> RedisResult<i64> {
    text(line)?.parse().map_err(|_| malformed("not an integer"))
}

fn text(line: &[u8]) -> RedisResult<&str> {
    std::str::from_utf8(line).map_err(|_| malformed("not UTF-8"))
}

/// An error reply (`-CODE detail\r\n`), classified by redis-rs's own parser.
fn server_error(line: &[u8]) -> RedisResult<Value> {
    match redis::parse_redis_value(line)? {
        error @ Value::ServerError(_) => Ok(error),
        _ => Err(malformed("error reply")),
    }
}

fn malformed(what: &'static str) -> RedisError {
    RedisError::from((
        ErrorKind::Parse,
        "malformed reply from the server",
        what.to_owned(),
    ))
}

fn malformed_owned(what: String) -> RedisError {
    RedisError::from((ErrorKind::Parse, "malformed reply from the server", what))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(bytes: &[u8]) -> Value {
        let (value, used) = parse(bytes).expect("valid").expect("whole");
        assert_eq!(used, bytes.len(), "used every byte of {bytes:?}");
        value
    }

    #[test]
    fn each_reply_type_parses() {
        assert_eq!(whole(b"+OK\r\n"), Value::Okay);
        assert_eq!(whole(b"+PONG\r\n"), Value::SimpleString("PONG".into()));
        assert_eq!(whole(b":-42\r\n"), Value::Int(-42));
        assert_eq!(whole(b"$3\r\nE:x\r\n"), Value::BulkString(b"E:x".to_vec()));
        assert_eq!(whole(b"$0\r\n\r\n"), Value::BulkString(Vec::new()));
        assert_eq!(whole(b"$-1\r\n"), Value::Nil);
        assert_eq!(whole(b"*-1\r\n"), Value::Nil);
        assert_eq!(whole(b"*0\r\n"), Value::Array(Vec::new()));
        assert_eq!(
            whole(b"*3\r\n:1\r\n$2\r\nab\r\n*1\r\n:0\r\n"),
            Value::Array(vec![
                Value::Int(1),
                Value::BulkString(b"ab".to_vec()),
                Value::Array(vec![Value::Int(0)]),
            ])
        );
    }

    #[test]
    fn error_replies_keep_redis_rs_classification() {
        let Value::ServerError(noscript) = whole(b"-NOSCRIPT No matching script.\r\n") else {
            panic!("a server error");
        };
        let err = RedisError::from(noscript);
        assert_eq!(
            err.kind(),
            ErrorKind::Server(redis::ServerErrorKind::NoScript)
        );
        let Value::ServerError(noperm) = whole(b"-NOPERM this user has no permissions\r\n") else {
            panic!("a server error");
        };
        assert_eq!(RedisError::from(noperm).code(), Some("NOPERM"));
        let Value::ServerError(wrongpass) = whole(b"-WRONGPASS invalid password\r\n") else {
            panic!("a server error");
        };
        assert_eq!(RedisError::from(wrongpass).code(), Some("WRONGPASS"));
    }

    #[test]
    fn a_reply_cut_anywhere_asks_for_more_and_never_for_less() {
        let reply = b"*4\r\n:1\r\n$5\r\nE:bad\r\n-ERR x\r\n$-1\r\n+OK\r\n";
        let first_len = reply.len() - b"+OK\r\n".len();
        for cut in 0..first_len {
            assert!(
                parse(&reply[..cut]).expect("valid so far").is_none(),
                "cut at {cut}"
            );
        }
        let (value, used) = parse(reply).expect("valid").expect("whole");
        assert_eq!(used, first_len, "stops at the end of the first reply");
        let Value::Array(items) = value else {
            panic!("an array");
        };
        assert_eq!(items.len(), 4);
        assert!(matches!(items[2], Value::ServerError(_)));
        assert_eq!(whole(&reply[used..]), Value::Okay);
    }

    #[test]
    fn bytes_that_are_not_resp_are_an_error() {
        for bad in [
            &b"?what\r\n"[..],
            b":12x\r\n",
            b"+OK\n",
            b"$3\r\nabcd\r\n",
            b"$-7x\r\n",
            b"*1\r\n!\r\n",
        ] {
            let err = parse(bad).expect_err("malformed");
            assert_eq!(err.kind(), ErrorKind::Parse, "{bad:?}");
        }
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        assert!(parse(deep.as_bytes()).is_err(), "nesting is bounded");
    }

    #[test]
    fn a_huge_declared_length_allocates_nothing_up_front() {
        assert!(parse(b"*9223372036854775807\r\n").expect("valid").is_none());
        assert!(parse(b"$9223372036854775807\r\n").expect("valid").is_none());
    }
}
