//! A self-signed certificate for loopback TLS tests, written to PEM files
//! that live as long as the value.

use std::path::PathBuf;

/// A certificate for `localhost` and `127.0.0.1` with its key, as PEM files
/// in a temporary directory (removed on drop), and the certificate's PEM
/// text for a client to trust.
#[derive(Debug)]
pub struct SelfSigned {
    _dir: tempfile::TempDir,
    /// The certificate chain's file (`--tls-cert`, `PINNED_TLS_CERT`).
    pub cert: PathBuf,
    /// The private key's file (`--tls-key`, `PINNED_TLS_KEY`).
    pub key: PathBuf,
    /// The certificate as PEM text (a CA file's contents, for clients).
    pub pem: String,
}

impl SelfSigned {
    /// Makes a fresh certificate and writes both files.
    ///
    /// # Panics
    ///
    /// When the certificate cannot be made or written.
    #[must_use]
    pub fn new() -> Self {
        let made = rcgen::generate_simple_self_signed(vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
        ])
        .expect("rcgen");
        Self::written(&made.cert, &made.key_pair)
    }

    /// The same names, but marked `CA:TRUE` (what `openssl req -x509`
    /// makes with its default configuration): a server using it as its own
    /// certificate is refused by rustls (webpki's `CaUsedAsEndEntity`),
    /// even by a client that trusts it.
    ///
    /// # Panics
    ///
    /// When the certificate cannot be made or written.
    #[must_use]
    pub fn ca_as_server() -> Self {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).expect("certificate");
        Self::written(&cert, &key)
    }

    fn written(cert_made: &rcgen::Certificate, key_pair: &rcgen::KeyPair) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        let pem = cert_made.pem();
        std::fs::write(&cert, &pem).expect("cert");
        std::fs::write(&key, key_pair.serialize_pem()).expect("key");
        Self {
            _dir: dir,
            cert,
            key,
            pem,
        }
    }
}

impl Default for SelfSigned {
    fn default() -> Self {
        Self::new()
    }
}

/// A private certificate authority, for servers whose clients check the
/// chain (Postgres with `sslmode=verify-full`).
pub struct PrivateCa {
    key: rcgen::KeyPair,
    cert: rcgen::Certificate,
    _dir: tempfile::TempDir,
    /// The CA certificate's file (a client's `sslrootcert`).
    pub cert_file: PathBuf,
}

/// A server certificate a [`PrivateCa`] issued, as PEM text.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

impl PrivateCa {
    /// A fresh CA (its own key and name, self-signed), its certificate
    /// written to a file.
    ///
    /// # Panics
    ///
    /// When the certificate cannot be made or written.
    #[must_use]
    pub fn new() -> Self {
        let key = rcgen::KeyPair::generate().expect("CA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            // Its own name: two CAs of one name would look like one to a
            // client (a bad signature rather than an unknown issuer).
            .push(
                rcgen::DnType::CommonName,
                format!("pinned test CA {}", crate::unique()),
            );
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let cert = params.self_signed(&key).expect("CA certificate");
        let dir = tempfile::tempdir().expect("tempdir");
        let cert_file = dir.path().join("ca.pem");
        std::fs::write(&cert_file, cert.pem()).expect("ca.pem");
        Self {
            key,
            cert,
            _dir: dir,
            cert_file,
        }
    }

    /// A server certificate for `names` (DNS names or IP addresses), signed
    /// by this CA.
    ///
    /// # Panics
    ///
    /// When a name is not usable or signing fails.
    #[must_use]
    pub fn issue(&self, names: &[&str]) -> Issued {
        let key = rcgen::KeyPair::generate().expect("server key");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = rcgen::CertificateParams::new(names).expect("server params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "pinned test server");
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("server certificate");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

impl std::fmt::Debug for PrivateCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateCa")
            .field("cert_file", &self.cert_file)
            .finish_non_exhaustive()
    }
}

impl Default for PrivateCa {
    fn default() -> Self {
        Self::new()
    }
}
