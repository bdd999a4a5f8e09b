//! The rustls client configuration a Postgres connection asks for: which roots it
//! trusts and how much of the server's certificate it checks.
//!
//! Owns the crypto provider (ring, TLS 1.2 and 1.3, named explicitly so none is picked
//! from Cargo features) and the three ways of checking the server (see
//! [`Verification`]). It must never weaken a check the caller asked for: "chain only"
//! accepts a certificate for another name and nothing else, and "nothing" is only
//! chosen for `sslmode=prefer`/`require` without a root certificate, as libpq does.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use crate::error::ConnectionStringError;

/// Where the trusted roots come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Roots {
    /// Every certificate in this PEM file (`sslrootcert=PATH`).
    File(PathBuf),
    /// The Mozilla set of `webpki-roots` (`sslrootcert=system`).
    System,
}

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verification {
    /// Nothing: the connection is encrypted, the server unauthenticated (libpq's
    /// `require` and `prefer` without a root certificate).
    Nothing,
    /// The chain up to one of these roots, not the name (`verify-ca`, and `require`
    /// or `prefer` with a root certificate).
    Chain(Roots),
    /// The chain and that the certificate names the host dialled (`verify-full`).
    ChainAndName(Roots),
}

/// The crypto provider of every configuration here.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The trust anchors of `roots`.
fn root_store(roots: &Roots) -> Result<RootCertStore, ConnectionStringError> {
    let path = match roots {
        Roots::System => {
            return Ok(RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            })
        }
        Roots::File(path) => path,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|source| ConnectionStringError::RootCertUnreadable {
            path: path.clone(),
            source,
        })?;
    if certs.is_empty() {
        return Err(ConnectionStringError::RootCertEmpty { path: path.clone() });
    }
    let mut store = RootCertStore::empty();
    for cert in certs {
        store
            .add(cert)
            .map_err(|source| ConnectionStringError::RootCertRefused {
                path: path.clone(),
                source,
            })?;
    }
    Ok(store)
}

/// The client configuration checking the server as `verification` says, sending SNI
/// when `sni`.
pub(crate) fn client_config(
    verification: &Verification,
    sni: bool,
) -> Result<ClientConfig, ConnectionStringError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|source| ConnectionStringError::Tls { source })?;
    let verifier: Arc<dyn ServerCertVerifier> = match verification {
        Verification::Nothing => Arc::new(AnyCertificate(provider)),
        Verification::Chain(roots) => Arc::new(ChainOnly(webpki(roots, provider)?)),
        Verification::ChainAndName(roots) => webpki(roots, provider)?,
    };
    let mut config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.enable_sni = sni;
    Ok(config)
}

/// rustls' own verifier over `roots`.
fn webpki(
    roots: &Roots,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, ConnectionStringError> {
    WebPkiServerVerifier::builder_with_provider(Arc::new(root_store(roots)?), provider)
        .build()
        .map_err(|e| ConnectionStringError::Tls {
            source: rustls::Error::General(e.to_string()),
        })
}

/// Accepts any certificate, still checking that the server holds its key (the
/// handshake signatures): `sslmode=require` without a root certificate.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The webpki check without its last step, the name: `sslmode=verify-ca`. webpki
/// checks the chain (validity, issuer, usage) before the name, so a name error
/// means everything before it passed.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
