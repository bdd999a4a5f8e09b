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
        let dir = tempfile::tempdir().expect("tempdir");
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        let pem = made.cert.pem();
        std::fs::write(&cert, &pem).expect("cert");
        std::fs::write(&key, made.key_pair.serialize_pem()).expect("key");
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
