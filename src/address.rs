//! Node addresses as people see them: credentials redacted from URLs, and which server a
//! node really is (to catch one server configured twice).

use std::collections::BTreeSet;
use std::net::ToSocketAddrs;

use redis::{ConnectionAddr, ConnectionInfo};

/// `url` with its password replaced by `<redacted>`, in the user information
/// (`redis://app:hunter2@host:6379` becomes `redis://app:<redacted>@host:6379`) and in a
/// `pass=` or `password=` query parameter (`redis+unix:///run/redis.sock?pass=hunter2`). A user
/// name alone (`redis://app@host`) is kept; text that is not a URL is returned unchanged.
///
/// A URL that parses (as redis-rs parses it) is shown as parsed. One that does not (a
/// password with an unescaped `@`, `/` or `?`) is redacted conservatively: everything from
/// the first `:` after the scheme to the last `@`.
pub(crate) fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let shown = match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            // A marker the URL serializer keeps as it is, swapped for the readable one.
            match parsed.set_password(Some("REDFENCE-REDACTED")) {
                Ok(()) => parsed
                    .as_str()
                    .replacen("REDFENCE-REDACTED", "<redacted>", 1),
                Err(()) => conservative(url, scheme_end),
            }
        }
        Ok(_) => url.to_owned(),
        Err(_) => conservative(url, scheme_end),
    };
    redact_query(&shown)
}

/// `url` (which did not parse) with everything from the first `:` after the scheme to the
/// last `@` hidden, when such a `:` precedes that `@`: a password can hide nowhere else.
fn conservative(url: &str, scheme_end: usize) -> String {
    let (scheme, rest) = url.split_at(scheme_end + 3);
    match (rest.find(':'), rest.rfind('@')) {
        (Some(colon), Some(at)) if colon < at => {
            format!("{scheme}{}:<redacted>{}", &rest[..colon], &rest[at..])
        }
        _ => url.to_owned(),
    }
}

/// `url` with the values of its `pass` and `password` query parameters hidden.
fn redact_query(url: &str) -> String {
    let Some((before, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((name @ ("pass" | "password"), _)) => format!("{name}=<redacted>"),
            _ => param.to_owned(),
        })
        .collect();
    format!("{before}?{}", params.join("&"))
}

/// The addresses a node's server answers at, for duplicate detection: every socket address
/// its host name resolves to (resolved once, now), or the host name itself when it does not
/// resolve; the canonical path of a Unix socket. Two nodes that share one are one server.
pub(crate) fn identities(info: &ConnectionInfo) -> BTreeSet<String> {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            let resolved: BTreeSet<String> = (host.as_str(), *port)
                .to_socket_addrs()
                .map(|addrs| addrs.map(|a| a.to_string()).collect())
                .unwrap_or_default();
            if resolved.is_empty() {
                BTreeSet::from([format!("{}:{port}", host.to_ascii_lowercase())])
            } else {
                resolved
            }
        }
        ConnectionAddr::Unix(path) => BTreeSet::from([std::fs::canonicalize(path)
            .unwrap_or_else(|_| path.clone())
            .display()
            .to_string()]),
        // A kind of address this version does not know: compare it as displayed.
        other => BTreeSet::from([other.to_string()]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted_and_nothing_else() {
        for (given, shown) in [
            (
                "redis://:hunter2@10.0.0.1:6379/0",
                "redis://:<redacted>@10.0.0.1:6379/0",
            ),
            (
                "redis://app:hunter2@host:6379",
                "redis://app:<redacted>@host:6379",
            ),
            // A malformed password with an `@` in it is still hidden whole.
            ("redis://app:hun@ter2@host", "redis://app:<redacted>@host"),
            (
                "redis://app:hun?ter2@host/0?db=1",
                "redis://app:<redacted>@host/0?db=1",
            ),
            ("redis://app:pa/ss@host", "redis://app:<redacted>@host"),
            (
                "redis://app:pw@host?db=1&pass=p@ss",
                "redis://app:<redacted>@host?db=1&pass=<redacted>",
            ),
            (
                "redis+unix:///x.sock?user=me@corp&pass=secret",
                "redis+unix:///x.sock?user=me@corp&pass=<redacted>",
            ),
            ("redis@host?x://y", "redis@host?x://y"),
            // Base64 passwords end in '='.
            (
                "redis://:c2VjcmV0==@host:6379",
                "redis://:<redacted>@host:6379",
            ),
            (
                "rediss://user:pa=ss@h:6380/0?protocol=resp3",
                "rediss://user:<redacted>@h:6380/0?protocol=resp3",
            ),
            ("redis://[::1]:6379", "redis://[::1]:6379"),
            ("redis://u:pw@[::1]:6379", "redis://u:<redacted>@[::1]:6379"),
            ("redis://app@host:6379", "redis://app@host:6379"),
            ("redis://host:6379/2", "redis://host:6379/2"),
            ("not a url", "not a url"),
            (
                "redis+unix:///run/redis.sock?db=1&pass=hunter2&user=app",
                "redis+unix:///run/redis.sock?db=1&pass=<redacted>&user=app",
            ),
            (
                "redis+unix:///run/redis.sock?password=hunter2",
                "redis+unix:///run/redis.sock?password=<redacted>",
            ),
        ] {
            assert_eq!(redact_url(given), shown);
        }
    }

    #[test]
    fn a_host_name_and_its_address_are_one_server() {
        let info = |url: &str| {
            redis::Client::open(url)
                .expect("valid url")
                .get_connection_info()
                .clone()
        };
        let a = identities(&info("redis://127.0.0.1:7001"));
        let b = identities(&info("redis://localhost:7001"));
        assert!(!a.is_disjoint(&b), "{a:?} {b:?}");
        let c = identities(&info("redis://127.0.0.1:7002"));
        assert!(a.is_disjoint(&c));
    }
}
