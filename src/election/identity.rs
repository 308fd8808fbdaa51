//! A candidate's default identity: the host name plus a random UUID.

/// A fresh identity for a candidate: `"{host name}-{random UUID v4}"`, e.g.
/// `"worker-3-5f0e9c1a-…"`. The host name is the `HOSTNAME` environment variable, else
/// `/proc/sys/kernel/hostname`, else `/etc/hostname`, else `"unknown"`; the UUID makes two
/// candidates on one host (or two runs of one process) distinct.
pub fn default_identity() -> String {
    format!("{}-{}", host_name(), crate::random::uuid())
}

/// The host name, without any new dependency.
fn host_name() -> String {
    let from_env = std::env::var("HOSTNAME").ok();
    let from_files = || {
        ["/proc/sys/kernel/hostname", "/etc/hostname"]
            .iter()
            .find_map(|path| std::fs::read_to_string(path).ok().and_then(non_empty))
    };
    from_env
        .and_then(non_empty)
        .or_else(from_files)
        .unwrap_or_else(|| "unknown".to_owned())
}

fn non_empty(name: String) -> Option<String> {
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_owned())
}
