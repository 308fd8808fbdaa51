//! How to reach one server: a URL or a `redis::Client`, plus the [`Tls`] settings of a
//! `rediss://` node, turned into the `redis::Client` that a connection is made from.

use std::fmt;

use redis::{Client, ConnectionAddr, RedisError};

/// The TLS feature this build has, for messages: `None` when redfence was built without one.
const TLS_FEATURE: Option<&str> = if cfg!(feature = "tls-rustls") {
    Some("tls-rustls")
} else if cfg!(feature = "tls-native-tls") {
    Some("tls-native-tls")
} else {
    None
};

/// Why a URL with its TLS settings makes no client; found before any traffic.
#[derive(Debug)]
pub(crate) enum Unusable {
    /// redis-rs refused the URL or the certificates.
    Refused(RedisError),
    /// A check of redfence's own: TLS settings on a plain URL, no TLS feature, an empty PEM.
    Settings(&'static str),
}

impl fmt::Display for Unusable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unusable::Refused(err) => err.fmt(f),
            Unusable::Settings(reason) => f.write_str(reason),
        }
    }
}

impl From<RedisError> for Unusable {
    fn from(err: RedisError) -> Self {
        Unusable::Refused(err)
    }
}

/// What to say when TLS is asked for in a build without it.
pub(crate) const TLS_DISABLED: &str = "TLS (`rediss://`) needs a TLS feature of redfence: enable \
     `tls-rustls` (recommended) or `tls-native-tls`";

/// TLS settings for one `rediss://` node (or a [`RedisCounter`](crate::RedisCounter)):
/// which certificate authority to trust, and the client certificate for mutual TLS.
///
/// Defaults ([`Tls::new`]): the server's certificate must chain to a root of the system's
/// trust store (`/etc/ssl/certs` on Debian) and name the host of the URL; no client
/// certificate is sent. A `rediss://` URL without `Tls` settings uses these defaults.
///
/// Needs the feature `tls-rustls` (recommended) or `tls-native-tls`; without one,
/// [`build`](crate::RedlockBuilder::build) rejects TLS nodes with a
/// [`ConfigError`](crate::ConfigError) naming the feature.
///
/// ```no_run
/// use redfence::{NodeAddr, Redlock, Tls};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ca = std::fs::read("/etc/redis/tls/ca.crt")?;
/// let tls = Tls::new()
///     .ca_pem(ca)
///     .client_identity_pem(std::fs::read("client.crt")?, std::fs::read("client.key")?);
/// let redlock = Redlock::builder()
///     .node(NodeAddr::url("rediss://10.0.0.1:6380").tls(tls.clone()))
///     .node(NodeAddr::url("rediss://10.0.0.2:6380").tls(tls.clone()))
///     .node(NodeAddr::url("rediss://10.0.0.3:6380").tls(tls))
///     .build()?;
/// # drop(redlock);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct Tls {
    ca_pem: Option<Vec<u8>>,
    client_identity: Option<(Vec<u8>, Vec<u8>)>,
    insecure: bool,
}

impl Tls {
    /// The defaults: the system's trust store, host name checked, no client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether these settings carry a CA or a client certificate of their own.
    #[cfg(feature = "cluster")]
    pub(crate) fn has_certificates(&self) -> bool {
        self.ca_pem.is_some() || self.client_identity.is_some()
    }

    /// Trusts only the certificate authority (or authorities) in this PEM text, instead of
    /// the system's trust store: for a private CA, as most self-hosted Redis TLS setups use.
    /// Defaults to the system's trust store.
    #[must_use]
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Sends this client certificate and its private key (both PEM) for mutual TLS, when the
    /// server requires one (`tls-auth-clients yes`). Defaults to none.
    #[must_use]
    pub fn client_identity_pem(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.client_identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// **For development only: this turns off server authentication.** Accepts any
    /// certificate the server shows, self-signed, expired or for another host, so anyone on
    /// the network path can impersonate the node, read the traffic (and the password), and
    /// grant or forget locks. Never use it in production; give the CA with
    /// [`ca_pem`](Self::ca_pem) instead. Same as the `#insecure` fragment of a `rediss://`
    /// URL. Defaults to off.
    #[must_use]
    pub fn danger_accept_invalid_certificates(mut self) -> Self {
        self.insecure = true;
        self
    }
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Certificates are public, but the client key is not: show only what is set.
        f.debug_struct("Tls")
            .field("ca_pem", &self.ca_pem.as_ref().map(|_| "<set>"))
            .field(
                "client_identity",
                &self.client_identity.as_ref().map(|_| "<redacted>"),
            )
            .field("insecure", &self.insecure)
            .finish()
    }
}

/// The client for `client`'s server, with `tls` applied. Fails, before any traffic, when the
/// URL asks for TLS in a build without a TLS feature, when TLS settings are given for a
/// non-TLS URL, or when a certificate or key does not parse.
pub(crate) fn tls_client(client: Client, tls: Option<&Tls>) -> Result<Client, Unusable> {
    let info = client.get_connection_info().clone();
    let ConnectionAddr::TcpTls { host, port, .. } = info.addr().clone() else {
        return match tls {
            None => Ok(client),
            Some(_) => Err(Unusable::Settings(
                "TLS settings were given for a URL without TLS: use `rediss://`",
            )),
        };
    };
    if TLS_FEATURE.is_none() {
        return Err(Unusable::Settings(TLS_DISABLED));
    }
    install_crypto_provider();
    let Some(tls) = tls else {
        return Ok(client);
    };
    let info = info.set_addr(ConnectionAddr::TcpTls {
        host,
        port,
        insecure: tls.insecure,
        tls_params: None,
    });
    with_certificates(info, tls)
}

/// The client for `url` (`redis://`, `rediss://`, `redis+unix://`), with `tls` applied.
pub(crate) fn open(url: &str, tls: Option<&Tls>) -> Result<Client, Unusable> {
    if TLS_FEATURE.is_none() && url.trim_start().starts_with("rediss://") {
        return Err(Unusable::Settings(TLS_DISABLED));
    }
    tls_client(Client::open(url)?, tls)
}

#[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
fn with_certificates(info: redis::ConnectionInfo, tls: &Tls) -> Result<Client, Unusable> {
    if tls.ca_pem.is_none() && tls.client_identity.is_none() {
        return Ok(Client::open(info)?);
    }
    // The parsers skip text that is not PEM: an empty trust store would only fail at the
    // handshake, so say it now.
    if let Some(ca) = &tls.ca_pem {
        require_pem(
            ca,
            b"-----BEGIN CERTIFICATE-----",
            "the CA PEM holds no certificate",
        )?;
    }
    if let Some((cert, key)) = &tls.client_identity {
        require_pem(
            cert,
            b"-----BEGIN CERTIFICATE-----",
            "the client certificate PEM holds no certificate",
        )?;
        require_pem(
            key,
            b"PRIVATE KEY-----",
            "the client key PEM holds no private key",
        )?;
    }
    let certificates = redis::TlsCertificates {
        client_tls: tls
            .client_identity
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca_pem.clone(),
    };
    Ok(Client::build_with_tls(info, certificates)?)
}

#[cfg(not(any(feature = "tls-rustls", feature = "tls-native-tls")))]
fn with_certificates(_: redis::ConnectionInfo, _: &Tls) -> Result<Client, Unusable> {
    Err(Unusable::Settings(TLS_DISABLED))
}

/// rustls needs a process-wide crypto provider; install its `ring` one unless the
/// application installed another (then that one is used).
#[cfg(feature = "tls-rustls")]
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: a provider is then installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(not(feature = "tls-rustls"))]
fn install_crypto_provider() {}

#[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
fn require_pem(pem: &[u8], marker: &[u8], missing: &'static str) -> Result<(), Unusable> {
    if pem.windows(marker.len()).any(|w| w == marker) {
        Ok(())
    } else {
        Err(Unusable::Settings(missing))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_settings_need_a_tls_url() {
        let err = open("redis://127.0.0.1:7001", Some(&Tls::new())).err();
        assert!(
            err.is_some_and(|e| e.to_string().contains("rediss://")),
            "a plain URL with TLS settings must be rejected"
        );
    }

    #[test]
    fn debug_hides_the_client_key() {
        let tls = Tls::new().client_identity_pem("CERT", "SECRET KEY");
        let shown = format!("{tls:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[cfg(not(any(feature = "tls-rustls", feature = "tls-native-tls")))]
    #[test]
    fn without_a_tls_feature_the_message_names_it() {
        let err = open("rediss://127.0.0.1:7001", None).err();
        assert!(
            err.is_some_and(|e| e.to_string().contains("tls-rustls")),
            "rediss:// must be rejected, naming the feature"
        );
    }

    #[cfg(feature = "tls-rustls")]
    #[test]
    fn a_bad_certificate_is_rejected_before_any_traffic() {
        let tls = Tls::new().ca_pem("not a certificate");
        assert!(open("rediss://127.0.0.1:7001", Some(&tls)).is_err());
    }
}
