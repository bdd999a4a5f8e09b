//! TLS for both binaries: rustls configurations read from PEM files, and
//! the server handshake under a deadline.
//!
//! Owns which crypto provider and protocol versions are used (ring, TLS 1.2
//! and 1.3: every configuration names its provider, so none is picked
//! implicitly from cargo features), which roots a client trusts (the Mozilla
//! set of `webpki-roots`, plus an optional extra CA file for private
//! deployments) and the server's advertised ALPN (`http/1.1`: both servers
//! speak HTTP/1.1 only). Never opens a socket or decides whether to use TLS:
//! the binaries do, from their flags.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

pub use rustls;
pub use tokio_rustls;

/// Why a TLS configuration could not be built from its files.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("{what} {path}: {source}")]
    Pem {
        /// What the file was meant to hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The reader's or parser's error.
        source: rustls_pki_types::pem::Error,
    },
    /// A PEM file holds no certificate.
    #[error("{what} {path}: no CERTIFICATE block in the file")]
    NoCertificate {
        /// What the file was meant to hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// A CA certificate was refused as a trust anchor.
    #[error("CA file {path}: {source}")]
    BadCa {
        /// The file.
        path: PathBuf,
        /// Why rustls refused it.
        source: rustls::Error,
    },
    /// rustls refused the certificate and key (they do not match, the key
    /// type is unsupported, ...).
    #[error("certificate and key refused: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Why a server handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The client did not finish the handshake within the deadline.
    #[error("TLS handshake not done within {0:?}")]
    TimedOut(Duration),
    /// The handshake failed (not TLS, no shared cipher, client gone, ...).
    #[error("TLS handshake failed: {0}")]
    Failed(std::io::Error),
}

/// The crypto provider every configuration here uses (ring).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in the PEM file at `path` (at least one).
fn certificates(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsError::Pem {
            what,
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            what,
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// A server configuration from a PEM certificate chain (leaf first) and a
/// PEM private key (PKCS#8, PKCS#1 or SEC1), advertising ALPN `http/1.1`.
///
/// # Errors
///
/// [`TlsError`]: a file unreadable or without its block, or a key that does
/// not fit the certificate.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = certificates(cert, "certificate file")?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::Pem {
        what: "key file",
        path: key.to_owned(),
        source,
    })?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The roots a client trusts: the Mozilla set of `webpki-roots`, plus every
/// certificate in the PEM file `extra_ca` when given.
///
/// # Errors
///
/// [`TlsError`]: the CA file is unreadable, holds no certificate, or one
/// is not a usable trust anchor.
pub fn roots(extra_ca: Option<&Path>) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = extra_ca {
        for cert in certificates(path, "CA file")? {
            roots.add(cert).map_err(|source| TlsError::BadCa {
                path: path.to_owned(),
                source,
            })?;
        }
    }
    Ok(roots)
}

/// A client configuration trusting [`roots`]`(extra_ca)`, without ALPN (the
/// caller sets it when its transport wants one).
///
/// # Errors
///
/// As [`roots`].
pub fn client_config(extra_ca: Option<&Path>) -> Result<ClientConfig, TlsError> {
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(extra_ca)?)
        .with_no_client_auth())
}

/// Completes the server side of a handshake on `io` within `deadline`.
///
/// # Errors
///
/// [`HandshakeError`]: too slow, or failed.
///
/// # Cancel safety
///
/// Dropping the future drops `io`.
pub async fn accept<IO>(
    acceptor: &TlsAcceptor,
    io: IO,
    deadline: Duration,
) -> Result<TlsStream<IO>, HandshakeError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(deadline, acceptor.accept(io)).await {
        Err(_) => Err(HandshakeError::TimedOut(deadline)),
        Ok(Err(error)) => Err(HandshakeError::Failed(error)),
        Ok(Ok(stream)) => Ok(stream),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path
    }

    #[test]
    fn pem_files_become_configurations_or_precise_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let generated =
            rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("rcgen");
        let cert = write(dir.path(), "cert.pem", &generated.cert.pem());
        let key = write(dir.path(), "key.pem", &generated.key_pair.serialize_pem());
        let config = server_config(&cert, &key).expect("server config");
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);

        let with_ca = roots(Some(&cert)).expect("roots");
        assert_eq!(with_ca.len(), webpki_roots::TLS_SERVER_ROOTS.len() + 1);
        client_config(Some(&cert)).expect("client config");

        // The key file given as certificate: no CERTIFICATE block.
        let error = server_config(&key, &key).expect_err("key as cert");
        assert!(matches!(error, TlsError::NoCertificate { .. }), "{error}");
        assert!(error.to_string().contains("key.pem"), "{error}");
        // The certificate given as key: no key block.
        let error = server_config(&cert, &cert).expect_err("cert as key");
        assert!(
            matches!(
                error,
                TlsError::Pem {
                    what: "key file",
                    ..
                }
            ),
            "{error}"
        );
        // A missing file names itself.
        let missing = dir.path().join("missing.pem");
        let error = roots(Some(&missing)).expect_err("missing CA");
        assert!(error.to_string().contains("missing.pem"), "{error}");
        // A key that is not the certificate's.
        let other = rcgen::KeyPair::generate().expect("key");
        let other = write(dir.path(), "other.pem", &other.serialize_pem());
        let error = server_config(&cert, &other).expect_err("mismatched key");
        assert!(matches!(error, TlsError::Rustls(_)), "{error}");
    }
}
