//! `SCAN` on the simulated server: every matching key in one reply (cursor `0`, which Redis
//! allows), sorted, with Redis's glob patterns (`*`, `?`, `[...]`, `[^...]`, ranges, `\`).

use redis::Value;

use super::keyspace::{Data, Keyspace};
use super::reply::{self, bulk, syntax};

/// `SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]` (`a`: its arguments after the name).
pub(super) fn scan(keys: &Keyspace, a: &[Vec<u8>]) -> Value {
    let cursor = std::str::from_utf8(&a[0])
        .ok()
        .and_then(|c| c.parse::<u64>().ok());
    if cursor.is_none() {
        return reply::error("ERR invalid cursor");
    }
    let (mut pattern, mut kind): (Option<&[u8]>, Option<Vec<u8>>) = (None, None);
    let mut j = 1;
    while j < a.len() {
        let Some(value) = a.get(j + 1) else {
            return syntax();
        };
        match a[j].to_ascii_lowercase().as_slice() {
            b"match" => pattern = Some(value),
            b"type" => kind = Some(value.to_ascii_lowercase()),
            b"count" => match super::reply::parse_int(value) {
                Some(n) if n >= 1 => {}
                Some(_) => return syntax(),
                None => return reply::not_integer(),
            },
            _ => return syntax(),
        }
        j += 2;
    }
    let mut found: Vec<Vec<u8>> = keys
        .live()
        .filter(|(key, _)| pattern.is_none_or(|p| glob(p, key)))
        .filter(|(_, entry)| {
            kind.as_deref().is_none_or(|kind| match entry.data {
                Data::Str(_) => kind == b"string",
                Data::Zset(_) => kind == b"zset",
            })
        })
        .map(|(key, _)| key.to_vec())
        .collect();
    found.sort();
    Value::Array(vec![
        bulk(b"0".to_vec()),
        Value::Array(found.into_iter().map(bulk).collect()),
    ])
}

/// Whether `text` matches the glob `pattern`, as Redis's `stringmatchlen`.
pub(super) fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|i| glob(rest, &text[i..])),
        Some((b'?', rest)) => !text.is_empty() && glob(rest, &text[1..]),
        Some((b'[', rest)) => {
            let Some((&c, tail)) = text.split_first() else {
                return false;
            };
            let (negate, mut p) = match rest.split_first() {
                Some((b'^', after)) => (true, after),
                _ => (false, rest),
            };
            let mut hit = false;
            loop {
                match p {
                    [] => break,
                    [b']', after @ ..] => {
                        p = after;
                        break;
                    }
                    [b'\\', x, after @ ..] => {
                        hit |= *x == c;
                        p = after;
                    }
                    [lo, b'-', hi, after @ ..] if *hi != b']' => {
                        let (lo, hi) = if lo <= hi { (*lo, *hi) } else { (*hi, *lo) };
                        hit |= (lo..=hi).contains(&c);
                        p = after;
                    }
                    [x, after @ ..] => {
                        hit |= *x == c;
                        p = after;
                    }
                }
            }
            hit != negate && glob(p, tail)
        }
        Some((b'\\', [x, rest @ ..])) => text.first() == Some(x) && glob(rest, &text[1..]),
        Some((x, rest)) => text.first() == Some(x) && glob(rest, &text[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn globs_as_redis() {
        for (pattern, text, matches) in [
            ("*", "", true),
            ("fence:*", "fence:{a}", true),
            ("fence:*", "fenc", false),
            ("h?llo", "hello", true),
            ("h[ae]llo", "hallo", true),
            ("h[^e]llo", "hello", false),
            ("h[a-b]llo", "hbllo", true),
            ("a\\*", "a*", true),
            ("a\\*", "ab", false),
            ("*:{*}", "app:fence:{x}", true),
        ] {
            assert_eq!(
                glob(pattern.as_bytes(), text.as_bytes()),
                matches,
                "{pattern} {text}"
            );
        }
    }
}
