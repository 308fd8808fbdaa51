//! `RedisCounter`'s striped mode ([`RedisCounter::striped`](crate::RedisCounter::striped)):
//! S stripe keys instead of one key per resource, a range of tokens per stripe and batch
//! (`next_ranges.lua`), and the one-time move from per-resource keys (`init_stripes.lua`).
//!
//! Keys, under the counter's prefix `p`: the marker `p#stripes` holds the stripe count, and
//! stripe `i` is `p#stripe:i`. Neither starts with `p{`, so no per-resource key
//! (`p{resource}`) can be one of them.

use std::sync::LazyLock;

use redis::Script;
use redis::aio::ConnectionLike;

use super::Stripes;
use crate::error::BoxError;

/// One batch's tokens from the stripes it involves, in one atomic script call.
static NEXT_RANGES: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("next_ranges.lua")));

/// Makes or checks the marker and the stripes, at least at a floor.
static INIT_STRIPES: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("init_stripes.lua")));

/// How many keys one `SCAN` call returns, about, and one `MGET` reads, at most.
const SCAN_COUNT: usize = 1_000;

/// The striped layout of a counter under one prefix.
pub(crate) struct StripedKeys {
    pub(crate) stripes: Stripes,
    prefix: String,
}

impl StripedKeys {
    pub(crate) fn new(prefix: &str, stripes: Stripes) -> Self {
        StripedKeys {
            stripes,
            prefix: prefix.to_owned(),
        }
    }

    /// The key that holds the stripe count.
    pub(crate) fn marker(&self) -> String {
        format!("{}#stripes", self.prefix)
    }

    /// The key of stripe `i`.
    pub(crate) fn stripe(&self, i: u32) -> String {
        format!("{}#stripe:{i}", self.prefix)
    }

    /// One token per request: a script call, and if the stripes are not made yet (a new
    /// counter, or a server that lost its data), the move first and the call once more.
    pub(crate) async fn issue<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        requests: &[&[String]],
    ) -> Result<Vec<i64>, BoxError> {
        match self.next_ranges(conn, requests).await {
            Err(err) if err.to_string().contains("NOSTRIPES") => {
                self.init(conn).await?;
                Ok(self.next_ranges(conn, requests).await?)
            }
            other => Ok(other?),
        }
    }

    async fn next_ranges<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        requests: &[&[String]],
    ) -> Result<Vec<i64>, redis::RedisError> {
        let per_request: Vec<Vec<u32>> = requests
            .iter()
            .map(|names| self.stripes.of_all(names))
            .collect();
        let mut involved: Vec<u32> = per_request.iter().flatten().copied().collect();
        involved.sort_unstable();
        involved.dedup();
        let mut invocation = NEXT_RANGES.prepare_invoke();
        invocation.key(self.marker());
        for &i in &involved {
            invocation.key(self.stripe(i));
        }
        invocation.arg(self.stripes.count());
        for stripes in &per_request {
            invocation.arg(stripes.len());
            for stripe in stripes {
                // KEYS[1] is the marker: stripe keys start at KEYS[2], in `involved`'s order.
                let at = involved.binary_search(stripe).unwrap_or(0);
                invocation.arg(at + 2);
            }
        }
        invocation.invoke_async(conn).await
    }

    /// Makes the stripes: each starts at the largest per-resource token found under the
    /// prefix (keys `prefix{…}`), so that no resource fenced before goes back; then the
    /// marker. Stop every client of the per-resource mode first: they do not read the
    /// stripes, and one that writes during the scan may be missed.
    async fn init<C: ConnectionLike + Send>(&self, conn: &mut C) -> Result<(), BoxError> {
        let floor = self.per_resource_floor(conn).await?;
        let mut invocation = INIT_STRIPES.prepare_invoke();
        invocation.key(self.marker());
        for i in 0..self.stripes.count() {
            invocation.key(self.stripe(i));
        }
        invocation.arg(self.stripes.count()).arg(floor);
        let _: i64 = invocation.invoke_async(conn).await?;
        tracing::info!(
            prefix = %self.prefix,
            stripes = self.stripes.count(),
            floor,
            "Redis fencing counter: stripes made"
        );
        Ok(())
    }

    /// The largest value among the per-resource counter keys under the prefix.
    async fn per_resource_floor<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
    ) -> Result<u64, BoxError> {
        let pattern = format!("{}{{*}}", glob_escape(&self.prefix));
        let mut cursor: u64 = 0;
        let mut floor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .query_async(conn)
                .await?;
            for chunk in keys.chunks(SCAN_COUNT) {
                let values: Vec<Option<String>> =
                    redis::cmd("MGET").arg(chunk).query_async(conn).await?;
                for (key, value) in chunk.iter().zip(values) {
                    let Some(value) = value else { continue };
                    let value: u64 = value.parse().map_err(|_| {
                        format!("the per-resource counter {key} does not hold a token: {value:?}")
                    })?;
                    floor = floor.max(value);
                }
            }
            if next == 0 {
                return Ok(floor);
            }
            cursor = next;
        }
    }
}

/// `text` as a literal in a `SCAN MATCH` pattern.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_patterns() {
        let keys = StripedKeys::new("fence:", Stripes::DEFAULT);
        assert_eq!(keys.marker(), "fence:#stripes");
        assert_eq!(keys.stripe(3), "fence:#stripe:3");
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
