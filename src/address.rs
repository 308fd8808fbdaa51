//! Node addresses as people see them: credentials redacted from URLs, and which server a
//! node really is (to catch one server configured twice).

use std::collections::BTreeSet;
use std::net::ToSocketAddrs;

use redis::{ConnectionAddr, ConnectionInfo};

/// `url` with its password replaced by `<redacted>`, in the user information
/// (`redis://app:hunter2@host:6379` becomes `redis://app:<redacted>@host:6379`) and in a
/// `pass=` or `password=` query parameter (`redis+unix:///run/redis.sock?pass=hunter2`). A user
/// name alone (`redis://app@host`) is kept; text that is not a URL is returned unchanged.
/// Malformed URLs are handled too: the user information ends at the last `@` that no `=`
/// precedes (a password may hold `@`, `/` or `?`; a query's `@` follows a `=`).
pub(crate) fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let (scheme, rest) = url.split_at(scheme_end + 3);
    let userinfo_end = rest
        .match_indices('@')
        .map(|(at, _)| at)
        .rev()
        .find(|&at| !rest[..at].contains('='));
    let mut shown = String::from(scheme);
    let after_userinfo = match userinfo_end {
        Some(at) => {
            let userinfo = &rest[..at];
            match userinfo.split_once(':') {
                Some((user, _)) => {
                    shown.push_str(user);
                    shown.push_str(":<redacted>");
                }
                None => shown.push_str(userinfo),
            }
            &rest[at..]
        }
        None => rest,
    };
    let (before_query, query) = match after_userinfo.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (after_userinfo, None),
    };
    shown.push_str(before_query);
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((name @ ("pass" | "password"), _)) => format!("{name}=<redacted>"),
                _ => param.to_owned(),
            })
            .collect();
        shown.push('?');
        shown.push_str(&params.join("&"));
    }
    shown
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
