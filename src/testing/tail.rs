//! `return redis.call(...)` made `return (redis.call(...))` before a script is compiled: the
//! shim's `redis.call` is a Lua function, and a tail call into it would drop the script's frame,
//! whose line an uncaught error reports (Redis's `redis.call`, a C function, keeps it). The
//! parentheses keep one value, all `redis.call` returns; no line moves.

/// Where Lua source is, for the scan: code, a string, or a comment.
#[derive(Clone, Copy, PartialEq, Eq)]
enum At {
    Code,
    /// A short string, closed by this quote.
    Quoted(u8),
    /// A long string or comment, closed by `]`, this many `=`, `]`.
    Long(usize),
    /// A comment to the end of the line.
    Line,
}

/// The length of a long bracket's opening (`[`, `=`s, `[`) at `at`, and its level.
fn long_open(src: &[u8], at: usize) -> Option<(usize, usize)> {
    if src.get(at) != Some(&b'[') {
        return None;
    }
    let level = src[at + 1..].iter().take_while(|&&b| b == b'=').count();
    (src.get(at + 1 + level) == Some(&b'[')).then_some((level + 2, level))
}

/// Whether `word` starts at `at` as a whole word.
fn word_at(src: &[u8], at: usize, word: &[u8]) -> bool {
    let ident = |b: &u8| b.is_ascii_alphanumeric() || *b == b'_';
    src[at..].starts_with(word)
        && (at == 0 || !ident(&src[at - 1]))
        && !src.get(at + word.len()).is_some_and(ident)
}

/// After `return` ending at `from`: where `redis` starts and where the call's `(` is, when
/// `return redis.call(` / `return redis.pcall(` follows (blanks between).
fn tail_call(src: &[u8], from: usize) -> Option<(usize, usize)> {
    let skip = |at: usize| {
        at + src[at..]
            .iter()
            .take_while(|b| b.is_ascii_whitespace())
            .count()
    };
    let redis = skip(from);
    if redis == from || !word_at(src, redis, b"redis") {
        return None;
    }
    let dot = skip(redis + 5);
    if src.get(dot) != Some(&b'.') {
        return None;
    }
    let name = skip(dot + 1);
    let end = [&b"call"[..], b"pcall"]
        .iter()
        .find(|w| word_at(src, name, w))
        .map(|w| name + w.len())?;
    let open = skip(end);
    (src.get(open) == Some(&b'(')).then_some((redis, open))
}

/// `src` with every `return redis.call(...)` and `return redis.pcall(...)` parenthesized.
pub(super) fn guard(src: &[u8]) -> Vec<u8> {
    let mut opens = Vec::new();
    let mut closes = Vec::new();
    let mut waiting: Vec<(usize, usize)> = Vec::new();
    let mut depth = 0_usize;
    let mut at = At::Code;
    let mut i = 0;
    while i < src.len() {
        let b = src[i];
        match at {
            At::Quoted(quote) => {
                if b == b'\\' {
                    i += 1;
                } else if b == quote || b == b'\n' {
                    at = At::Code;
                }
            }
            At::Long(level) => {
                let close = src[i..].starts_with(b"]")
                    && src[i + 1..].iter().take_while(|&&c| c == b'=').count() == level
                    && src.get(i + 1 + level) == Some(&b']');
                if close {
                    i += level + 1;
                    at = At::Code;
                }
            }
            At::Line => {
                if b == b'\n' {
                    at = At::Code;
                }
            }
            At::Code => {
                if b == b'"' || b == b'\'' {
                    at = At::Quoted(b);
                } else if src[i..].starts_with(b"--") {
                    match long_open(src, i + 2) {
                        Some((len, level)) => {
                            at = At::Long(level);
                            i += 1 + len;
                        }
                        None => at = At::Line,
                    }
                } else if let Some((len, level)) = long_open(src, i) {
                    at = At::Long(level);
                    i += len - 1;
                } else if b == b'(' {
                    depth += 1;
                    if let Some(last) = waiting.last_mut()
                        && last.0 == i
                    {
                        last.1 = depth;
                    }
                } else if b == b')' {
                    if waiting.last().is_some_and(|&(_, d)| d == depth) {
                        closes.push(i + 1);
                        waiting.pop();
                    }
                    depth = depth.saturating_sub(1);
                } else if word_at(src, i, b"return")
                    && let Some((redis, open)) = tail_call(src, i + 6)
                {
                    opens.push(redis);
                    waiting.push((open, usize::MAX));
                    i += 5;
                }
            }
        }
        i += 1;
    }
    // An unbalanced call (a syntax error anyway): the source as it is.
    if !waiting.is_empty() || opens.len() != closes.len() {
        return src.to_vec();
    }
    let mut out = Vec::with_capacity(src.len() + 2 * opens.len());
    let (mut o, mut c) = (0, 0);
    for (i, &b) in src.iter().enumerate() {
        while o < opens.len() && opens[o] == i {
            out.push(b'(');
            o += 1;
        }
        while c < closes.len() && closes[c] == i {
            out.push(b')');
            c += 1;
        }
        out.push(b);
    }
    out.extend(std::iter::repeat_n(b')', closes.len() - c));
    out
}

#[cfg(test)]
mod tests {
    use super::guard;

    /// `src` guarded, as text.
    fn guarded(src: &str) -> String {
        String::from_utf8(guard(src.as_bytes())).unwrap()
    }

    #[test]
    fn tail_calls_of_redis_call_are_parenthesized() {
        assert_eq!(
            guarded("return redis.call('GET', KEYS[1])"),
            "return (redis.call('GET', KEYS[1]))"
        );
        assert_eq!(
            guarded("if x then return redis.pcall ( 'X', f(1, ')'), [[)]] ) end"),
            "if x then return (redis.pcall ( 'X', f(1, ')'), [[)]] )) end"
        );
        let nested = "return redis.call('A', (function() return redis.call('B') end)())";
        assert_eq!(
            guarded(nested),
            "return (redis.call('A', (function() return (redis.call('B')) end)()))"
        );
        for same in [
            "local x = redis.call('GET', 'k') return x",
            "-- return redis.call('GET')\nreturn 1",
            "return redis.call",
            "returned = 1 return myredis.call('x')",
            "return 'return redis.call('",
            "--[==[ return redis.call( ]==] return 1",
        ] {
            assert_eq!(guarded(same), same);
        }
    }
}
