//! TLS servers for the tests: a certificate authority, a server certificate (for `localhost`
//! and 127.0.0.1) and a client certificate, generated afresh by every test; redis-servers that
//! listen with TLS on `--tls-port` besides their plain port (kept for inspection).

use std::path::PathBuf;
use std::sync::Mutex;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

use crate::{Launch, Servers, free_port};

/// A certificate authority and what it signed, as PEM text and as files.
pub struct Pki {
    dir: tempfile::TempDir,
    /// The CA certificate to trust.
    pub ca_pem: String,
    /// A client certificate signed by the CA, for mutual TLS.
    pub client_cert_pem: String,
    /// The client certificate's private key.
    pub client_key_pem: String,
}

fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = KeyPair::generate().expect("CA key");
    let cert = params.self_signed(&key).expect("self-signed CA");
    (cert.pem(), Issuer::new(params, key))
}

fn leaf(names: &[&str], issuer: &Issuer<'static, KeyPair>) -> (String, String) {
    let params = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .expect("leaf params");
    let key = KeyPair::generate().expect("leaf key");
    let cert = params.signed_by(&key, issuer).expect("signed leaf");
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    /// A new CA, a server certificate for `localhost` and `127.0.0.1`, and a client one.
    pub fn generate() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (ca_pem, issuer) = ca("redfence test CA");
        let (server_cert, server_key) = leaf(&["localhost", "127.0.0.1"], &issuer);
        let (client_cert_pem, client_key_pem) = leaf(&["redfence-client"], &issuer);
        for (name, pem) in [
            ("ca.crt", &ca_pem),
            ("server.crt", &server_cert),
            ("server.key", &server_key),
        ] {
            std::fs::write(dir.path().join(name), pem).expect("write PEM");
        }
        Pki {
            dir,
            ca_pem,
            client_cert_pem,
            client_key_pem,
        }
    }

    /// Another CA's certificate, which signed none of these certificates.
    pub fn other_ca_pem() -> String {
        ca("some other CA").0
    }

    fn file(&self, name: &str) -> String {
        let path: PathBuf = self.dir.path().join(name);
        path.display().to_string()
    }
}

/// redis-servers with TLS on a second port, signed by their own [`Pki`].
pub struct TlsServers {
    /// The servers, reachable without TLS on their plain ports for inspection.
    pub servers: Servers,
    /// The certificates.
    pub pki: Pki,
    tls_ports: Vec<u16>,
}

impl TlsServers {
    /// Starts `n` servers; with `require_client_cert`, they refuse clients without a
    /// certificate signed by the CA (`tls-auth-clients yes`).
    pub fn start(n: usize, require_client_cert: bool) -> Self {
        let pki = Pki::generate();
        let ports = Mutex::new(vec![0u16; n]);
        let auth = if require_client_cert { "yes" } else { "no" };
        let servers = Servers::start_each(
            n,
            |i| {
                let port = free_port();
                ports.lock().expect("ports")[i] = port;
                [
                    "--tls-port",
                    &port.to_string(),
                    "--tls-cert-file",
                    &pki.file("server.crt"),
                    "--tls-key-file",
                    &pki.file("server.key"),
                    "--tls-ca-cert-file",
                    &pki.file("ca.crt"),
                    "--tls-auth-clients",
                    auth,
                ]
                .iter()
                .map(|s| s.to_string())
                .collect()
            },
            |_| Launch::default(),
        );
        let tls_ports = ports.into_inner().expect("ports");
        TlsServers {
            servers,
            pki,
            tls_ports,
        }
    }

    /// The `rediss://` URL of server `i`.
    pub fn url(&self, i: usize) -> String {
        format!("rediss://localhost:{}", self.tls_ports[i])
    }

    /// Every server's `rediss://` URL.
    pub fn urls(&self) -> Vec<String> {
        (0..self.tls_ports.len()).map(|i| self.url(i)).collect()
    }
}
