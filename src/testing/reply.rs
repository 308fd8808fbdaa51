//! Replies as a Redis 7.0 server writes them, parsed by redis-rs (so every value is one a real
//! connection could give), and the server's own ways of reading numbers.

use redis::Value;

/// A reply of `bytes` in RESP, parsed by redis-rs; an error reply of its own if redis-rs
/// refuses it (never expected: every caller writes well-formed RESP).
fn parsed(bytes: &[u8]) -> Value {
    redis::parse_redis_value(bytes).unwrap_or_else(|_| {
        redis::parse_redis_value(b"-ERR the simulated server wrote a reply redis-rs refuses\r\n")
            .unwrap_or(Value::Nil)
    })
}

/// An error reply of `message`, its code first (`ERR ...`, `WRONGTYPE ...`), with line breaks
/// made spaces as the server does.
pub(super) fn error(message: &str) -> Value {
    one_line(b'-', message.as_bytes())
}

/// An error reply of `message` exactly as given (a script's `{err=...}`: no `ERR` added).
pub(super) fn error_exact(message: &[u8]) -> Value {
    one_line(b'-', message)
}

/// A status reply (`+OK`, `+PONG`, `+string`), as redis-rs reads it.
pub(super) fn status(text: &str) -> Value {
    one_line(b'+', text.as_bytes())
}

/// The one-line reply of type `kind` (`-` an error, `+` a status) of `text`, its line breaks
/// made spaces as the server does.
fn one_line(kind: u8, text: &[u8]) -> Value {
    let mut bytes = Vec::with_capacity(text.len() + 3);
    bytes.push(kind);
    bytes.extend(
        text.iter()
            .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    bytes.extend_from_slice(b"\r\n");
    parsed(&bytes)
}

/// `+OK`.
pub(super) fn ok() -> Value {
    status("OK")
}

/// A bulk string of `bytes`.
pub(super) fn bulk(bytes: impl Into<Vec<u8>>) -> Value {
    Value::BulkString(bytes.into())
}

/// `WRONGTYPE`, for a key of another type.
pub(super) fn wrong_type() -> Value {
    error("WRONGTYPE Operation against a key holding the wrong kind of value")
}

/// A syntax error.
pub(super) fn syntax() -> Value {
    error("ERR syntax error")
}

/// An argument that is no integer.
pub(super) fn not_integer() -> Value {
    error("ERR value is not an integer or out of range")
}

/// The wrong number of arguments for `name` (its lower-case full name, `script|load`).
pub(super) fn arity(name: &str) -> Value {
    error(&format!(
        "ERR wrong number of arguments for '{name}' command"
    ))
}

/// An integer as Redis reads one (`string2ll`): an optional `-`, no `+`, no leading zeros, no
/// spaces, within `i64`.
pub(super) fn parse_int(bytes: &[u8]) -> Option<i64> {
    match bytes {
        [] => return None,
        [b'0'] => return Some(0),
        _ => {}
    }
    let (negative, digits) = match bytes {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, bytes),
    };
    match digits.first() {
        Some(b'1'..=b'9') => {}
        _ => return None,
    }
    let mut value: i64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        let digit = i64::from(b - b'0');
        value = value.checked_mul(10)?;
        value = if negative {
            value.checked_sub(digit)?
        } else {
            value.checked_add(digit)?
        };
    }
    Some(value)
}

/// A double as Redis reads one (`strtod` over the whole argument; `inf`, `+inf`, `-inf`;
/// never NaN).
pub(super) fn parse_float(bytes: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(bytes).ok()?;
    if text.is_empty() || text.starts_with(|c: char| c.is_ascii_whitespace()) {
        return None;
    }
    let value: f64 = text.parse().ok()?;
    if value.is_nan() {
        return None;
    }
    if value.is_infinite() && !text.to_ascii_lowercase().contains("inf") {
        // strtod's ERANGE on an overflow: refused.
        return None;
    }
    Some(value)
}

/// A double as C's `printf("%.17g")` writes it: how Redis 7.0 replies a score and passes a Lua
/// number to a command.
pub(super) fn g17(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.to_owned();
    }
    let sci = format!("{x:.16e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if !(-4..17).contains(&exponent) {
        let mantissa = trim_zeros(mantissa);
        let sign = if exponent < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs());
    }
    let decimals = usize::try_from(16 - exponent).unwrap_or(0);
    trim_zeros(&format!("{x:.decimals$}")).to_owned()
}

/// A double as Redis 7.2 and later (Redis 8, Valkey) write one in a reply and pass a Lua
/// number to a command: an integer within ±2^62 as an integer (`double2ll`, so `-0` is `0`),
/// else fpconv's `emit_digits` over the shortest digits that read back the same (Rust's;
/// fpconv's Grisu2 gives one digit more on rare values, such as 1e23).
pub(super) fn shortest(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    let limit = (i64::MAX / 2) as f64;
    if (-limit..=limit).contains(&x) && x.fract() == 0.0 {
        return format!("{}", x as i64);
    }
    let sci = format!("{:e}", x.abs());
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exponent: i64 = exponent.parse().unwrap_or(0);
    let n = i64::try_from(digits.len()).unwrap_or(1);
    let k = exponent - (n - 1);
    let sign = if x < 0.0 { "-" } else { "" };
    let zeros = |count: i64| "0".repeat(usize::try_from(count).unwrap_or(0));
    if k >= 0 && exponent < n + 7 {
        return format!("{sign}{digits}{}", zeros(k));
    }
    if k < 0 && (k > -7 || exponent.abs() < 4) {
        let point = n + k;
        if point <= 0 {
            return format!("{sign}0.{}{digits}", zeros(-point));
        }
        let (whole, fraction) = digits.split_at(usize::try_from(point).unwrap_or(0));
        return format!("{sign}{whole}.{fraction}");
    }
    let (first, rest) = digits.split_at(1);
    let point = if rest.is_empty() { "" } else { "." };
    let exp_sign = if exponent < 0 { '-' } else { '+' };
    format!("{sign}{first}{point}{rest}e{exp_sign}{}", exponent.abs())
}

/// `text` without the trailing zeros of its fraction (and without a bare `.`).
fn trim_zeros(text: &str) -> &str {
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_as_redis_reads_them() {
        assert_eq!(parse_int(b"0"), Some(0));
        assert_eq!(parse_int(b"-12"), Some(-12));
        assert_eq!(parse_int(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_int(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"-0",
            b"01",
            b"+1",
            b" 1",
            b"1 ",
            b"1.0",
            b"9223372036854775808",
        ] {
            assert_eq!(parse_int(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn floats_as_redis_reads_them() {
        assert_eq!(parse_float(b"1.5"), Some(1.5));
        assert_eq!(parse_float(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_float(b"+inf"), Some(f64::INFINITY));
        assert_eq!(parse_float(b"1e3"), Some(1000.0));
        for bad in [&b""[..], b"x", b" 1", b"nan", b"1e999"] {
            assert_eq!(parse_float(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn doubles_as_printf_g17() {
        assert_eq!(g17(0.0), "0");
        assert_eq!(g17(1.0), "1");
        assert_eq!(g17(-2.5), "-2.5");
        assert_eq!(g17(1.1), "1.1000000000000001");
        assert_eq!(g17(1_700_000_000_123.0), "1700000000123");
        assert_eq!(g17(-1e15 - 5.0), "-1000000000000005");
        assert_eq!(g17(1e17), "1e+17");
        assert_eq!(g17(123_456_789_012_345_680_000.0), "1.2345678901234568e+20");
        assert_eq!(g17(0.0001), "0.0001");
        assert_eq!(g17(0.00001), "1.0000000000000001e-05");
        assert_eq!(g17(f64::INFINITY), "inf");
    }

    #[test]
    fn doubles_as_redis_8_and_valkey_write_them() {
        // Each as Redis 8.6 and Valkey 9.1 answered it (a score, or a Lua number SET).
        for (x, text) in [
            (0.1, "0.1"),
            (1e20, "1e+20"),
            (1e17, "100000000000000000"),
            (-1e17, "-100000000000000000"),
            (1e19, "1e+19"),
            (1.2e20, "1.2e+20"),
            (1.0 / 3.0, "0.3333333333333333"),
            (123_456_789_012_345_678.0, "123456789012345680"),
            (-0.0, "0"),
            (1e-5, "0.00001"),
            (1e-6, "0.000001"),
            (1.5e-6, "1.5e-6"),
            (1e-7, "1e-7"),
            (1.5e300, "1.5e+300"),
            (5e-324, "5e-324"),
            (12_345_678_901_234_567_890.0, "12345678901234567000"),
            (1.234_567_890_123_456_7e20, "123456789012345670000"),
            (0.000123, "0.000123"),
            (0.001234567, "0.001234567"),
            (9_223_372_036_854_775_808.0, "9223372036854776000"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1234567.125, "1234567.125"),
            (-1.5, "-1.5"),
            (f64::NEG_INFINITY, "-inf"),
        ] {
            assert_eq!(shortest(x), text, "{x:e}");
        }
    }
}
