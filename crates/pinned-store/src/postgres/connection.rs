//! Postgres connection strings as libpq reads them, and the TLS they ask for.
//!
//! Owns [`ConnectionString`]: a URL (`postgresql://user@host/db?sslmode=verify-full`)
//! or a `key=value` string (`host=db sslmode=require`) split into what tokio-postgres
//! reads itself and the TLS keywords it does not (`sslmode` beyond `require`,
//! `sslrootcert`, `sslsni`), which become a rustls connector. It must never dial, never
//! read an environment variable but `HOME` (libpq's default root certificate is
//! `~/.postgresql/root.crt`), and never accept a TLS keyword it would ignore: an
//! unsupported one is refused by name.
//!
//! # The rules (libpq's)
//!
//! | `sslmode` | TLS | server certificate checked |
//! | --- | --- | --- |
//! | `disable` | never | — |
//! | `prefer` (the default) | when the server offers it | only with a root certificate: the chain |
//! | `require` | always | only with a root certificate: the chain |
//! | `verify-ca` | always | the chain, up to `sslrootcert` |
//! | `verify-full` | always | the chain and the host name (`host`, not `hostaddr`) |
//!
//! `allow` is refused ([`ConnectionStringError::UnsupportedSslMode`]). `sslrootcert`
//! names a PEM file of CA certificates, or `system` for the Mozilla roots of
//! `webpki-roots` (then the default mode is `verify-full`, and a weaker one is
//! refused). A "root certificate" above is `sslrootcert`, else
//! `~/.postgresql/root.crt` when that file exists.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use tokio_postgres_rustls::MakeRustlsConnect;

use super::tls::{client_config, Roots, Verification};
use crate::error::ConnectionStringError;

/// libpq's `sslmode`, as far as this store supports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SslMode {
    /// No TLS.
    Disable,
    /// TLS when the server offers it, plain otherwise (the default).
    Prefer,
    /// TLS or no connection.
    Require,
    /// TLS, and the server's certificate chains up to `sslrootcert`.
    VerifyCa,
    /// As `VerifyCa`, and the certificate names the host dialled.
    VerifyFull,
}

/// TLS keywords of libpq refused by name rather than passed on (tokio-postgres
/// would call them unknown) or silently ignored.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("sslcert", "client certificates are not supported"),
    ("sslkey", "client certificates are not supported"),
    ("sslpassword", "client certificates are not supported"),
    ("sslcertmode", "client certificates are not supported"),
    ("sslcrl", "certificate revocation lists are not supported"),
    (
        "sslcrldir",
        "certificate revocation lists are not supported",
    ),
    ("sslcompression", "TLS compression is not supported"),
    (
        "ssl_min_protocol_version",
        "TLS 1.2 and 1.3 are always offered",
    ),
    (
        "ssl_max_protocol_version",
        "TLS 1.2 and 1.3 are always offered",
    ),
    ("requiressl", "use sslmode=require"),
];

/// A Postgres connection string, read as libpq reads it: tokio-postgres' [`Config`]
/// with the `sslmode` applied, and the rustls connector for it.
///
/// ```
/// use pinned_store::{ConnectionString, SslMode};
///
/// let url = ConnectionString::parse("postgresql://app@db.internal/app?sslmode=require")?;
/// assert_eq!(url.ssl_mode(), SslMode::Require);
/// let kv = ConnectionString::parse("host=db.internal user=app sslmode=disable")?;
/// assert_eq!(kv.ssl_mode(), SslMode::Disable);
/// assert!(ConnectionString::parse("host=db sslmode=allow").is_err());
/// # Ok::<(), pinned_store::ConnectionStringError>(())
/// ```
///
/// [`Config`]: tokio_postgres::Config
#[derive(Clone)]
pub struct ConnectionString {
    config: tokio_postgres::Config,
    ssl_mode: SslMode,
    tls: MakeRustlsConnect,
}

impl fmt::Debug for ConnectionString {
    /// The settings without the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionString")
            .field("host", &self.config.get_hosts())
            .field("port", &self.config.get_ports())
            .field("dbname", &self.config.get_dbname())
            .field("user", &self.config.get_user())
            .field("ssl_mode", &self.ssl_mode)
            .finish_non_exhaustive()
    }
}

/// The TLS keywords, as found.
#[derive(Debug, Default)]
struct TlsKeywords {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
    sslsni: Option<String>,
}

// === impl ConnectionString ===

impl ConnectionString {
    /// Reads `text`: a `postgres://`/`postgresql://` URL (TLS keywords in its query,
    /// percent-encoded) or a libpq `key=value` string.
    ///
    /// Reads the root certificate file now, so a missing or bad one is an error here,
    /// not at the first connection.
    ///
    /// # Errors
    ///
    /// [`ConnectionStringError`]: malformed, an unsupported `sslmode` or keyword, or
    /// no usable root certificate for `verify-ca`/`verify-full`.
    pub fn parse(text: &str) -> Result<Self, ConnectionStringError> {
        let (rest, keywords) = split(text.trim())?;
        let mut config = tokio_postgres::Config::from_str(&rest)
            .map_err(|source| ConnectionStringError::Malformed { source })?;
        let explicit = keywords.sslmode.as_deref().map(parse_mode).transpose()?;
        let roots = match keywords.sslrootcert.as_deref() {
            Some("system") => Some(Roots::System),
            Some(path) => Some(Roots::File(PathBuf::from(path))),
            None => default_root_file().filter(|p| p.is_file()).map(Roots::File),
        };
        let system = roots == Some(Roots::System);
        let ssl_mode = match explicit {
            Some(mode) if system && mode != SslMode::VerifyFull => {
                return Err(ConnectionStringError::Conflict(
                    "sslrootcert=system needs sslmode=verify-full (or no sslmode, which then \
                     means verify-full)",
                ))
            }
            Some(mode) => mode,
            None if system => SslMode::VerifyFull,
            None => SslMode::Prefer,
        };
        let verification = match (ssl_mode, roots) {
            (SslMode::Disable, _) | (SslMode::Prefer | SslMode::Require, None) => {
                Verification::Nothing
            }
            (SslMode::Prefer | SslMode::Require | SslMode::VerifyCa, Some(roots)) => {
                Verification::Chain(roots)
            }
            (SslMode::VerifyFull, Some(roots)) => Verification::ChainAndName(roots),
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
                return Err(ConnectionStringError::MissingRootCert {
                    mode: mode_name(ssl_mode),
                    default: default_root_file().map_or_else(
                        || "~/.postgresql/root.crt ($HOME unset)".to_owned(),
                        |p| p.display().to_string(),
                    ),
                })
            }
        };
        let sni = match keywords.sslsni.as_deref() {
            None | Some("1") => true,
            Some("0") => false,
            Some(other) => {
                return Err(ConnectionStringError::InvalidValue {
                    key: "sslsni",
                    value: other.to_owned(),
                })
            }
        };
        config.ssl_mode(match ssl_mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        });
        let tls = MakeRustlsConnect::new(client_config(&verification, sni)?);
        Ok(Self {
            config,
            ssl_mode,
            tls,
        })
    }

    /// The `sslmode` in force (the default `prefer` when none was given, `verify-full`
    /// with `sslrootcert=system`).
    pub fn ssl_mode(&self) -> SslMode {
        self.ssl_mode
    }

    /// tokio-postgres' settings (host, port, user, database, timeouts, the TLS mode).
    pub fn config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    /// The settings, to change (a default `connect_timeout`, say).
    pub fn config_mut(&mut self) -> &mut tokio_postgres::Config {
        &mut self.config
    }

    /// The TLS connector to dial with (`tokio_postgres::Config::connect`, a deadpool
    /// `Manager`); cheap to clone.
    pub fn tls(&self) -> MakeRustlsConnect {
        self.tls.clone()
    }

    /// Dials one connection: the client, and the connection future the caller must
    /// spawn (it drives the socket).
    ///
    /// # Errors
    ///
    /// The driver's: unreachable, refused, the TLS handshake (a certificate that does
    /// not verify names its cause), authentication.
    pub async fn connect(
        &self,
    ) -> Result<
        (
            tokio_postgres::Client,
            tokio_postgres::Connection<
                tokio_postgres::Socket,
                <MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<
                    tokio_postgres::Socket,
                >>::Stream,
            >,
        ),
        tokio_postgres::Error,
    > {
        self.config.connect(self.tls()).await
    }
}

impl FromStr for ConnectionString {
    type Err = ConnectionStringError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

fn parse_mode(mode: &str) -> Result<SslMode, ConnectionStringError> {
    Ok(match mode {
        "disable" => SslMode::Disable,
        "prefer" => SslMode::Prefer,
        "require" => SslMode::Require,
        "verify-ca" => SslMode::VerifyCa,
        "verify-full" => SslMode::VerifyFull,
        other => {
            return Err(ConnectionStringError::UnsupportedSslMode {
                mode: other.to_owned(),
            })
        }
    })
}

fn mode_name(mode: SslMode) -> &'static str {
    match mode {
        SslMode::Disable => "disable",
        SslMode::Prefer => "prefer",
        SslMode::Require => "require",
        SslMode::VerifyCa => "verify-ca",
        SslMode::VerifyFull => "verify-full",
    }
}

/// libpq's default root certificate file, `$HOME/.postgresql/root.crt`.
fn default_root_file() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty())?;
    Some(PathBuf::from(home).join(".postgresql").join("root.crt"))
}

/// Takes the TLS keywords out of `text`: what is left, for tokio-postgres, and them.
fn split(text: &str) -> Result<(String, TlsKeywords), ConnectionStringError> {
    let mut keywords = TlsKeywords::default();
    let mut take = |key: &str, value: String| -> Result<bool, ConnectionStringError> {
        let slot = match key {
            "sslmode" => &mut keywords.sslmode,
            "sslrootcert" => &mut keywords.sslrootcert,
            "sslsni" => &mut keywords.sslsni,
            _ => {
                if let Some((key, why)) = UNSUPPORTED.iter().find(|(k, _)| *k == key) {
                    return Err(ConnectionStringError::UnsupportedOption {
                        key: (*key).to_owned(),
                        why,
                    });
                }
                return Ok(false);
            }
        };
        *slot = Some(value); // the last one counts, as in libpq
        Ok(true)
    };
    if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        split_url(text, &mut take).map(|rest| (rest, keywords))
    } else {
        split_pairs(text, &mut take).map(|rest| (rest, keywords))
    }
}

type Take<'a> = dyn FnMut(&str, String) -> Result<bool, ConnectionStringError> + 'a;

/// A URL's query parameters pass through `take`; those it keeps are left out of the
/// URL returned. The query starts at the first `?` after the credentials.
fn split_url(text: &str, take: &mut Take<'_>) -> Result<String, ConnectionStringError> {
    let after_credentials = text.rfind('@').map_or(0, |at| at + 1);
    let Some(q) = text[after_credentials..]
        .find('?')
        .map(|q| q + after_credentials)
    else {
        return Ok(text.to_owned());
    };
    let mut kept = Vec::new();
    for param in text[q + 1..].split('&').filter(|p| !p.is_empty()) {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        let key = decode(key)?;
        if !take(&key, decode(value)?)? {
            kept.push(param);
        }
    }
    let mut rest = text[..q].to_owned();
    if !kept.is_empty() {
        rest.push('?');
        rest.push_str(&kept.join("&"));
    }
    Ok(rest)
}

fn decode(text: &str) -> Result<String, ConnectionStringError> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|e| ConnectionStringError::Syntax {
            detail: format!("a URL parameter is not UTF-8 once decoded: {e}"),
        })
}

/// A `key=value` string's pairs pass through `take`; those it keeps are left out of
/// the string returned (the others are written back quoted).
fn split_pairs(text: &str, take: &mut Take<'_>) -> Result<String, ConnectionStringError> {
    let mut rest = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        if key.is_empty() {
            if chars.peek().is_some() {
                return Err(ConnectionStringError::Syntax {
                    detail: "a \"=\" without a keyword before it".to_owned(),
                });
            }
            return Ok(rest);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(ConnectionStringError::Syntax {
                detail: format!("missing \"=\" after {key:?}"),
            });
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                    None => {
                        return Err(ConnectionStringError::Syntax {
                            detail: format!("unterminated quoted value of {key:?}"),
                        })
                    }
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        if !take(&key, value.clone())? {
            if !rest.is_empty() {
                rest.push(' ');
            }
            rest.push_str(&key);
            rest.push_str("='");
            for c in value.chars() {
                if c == '\'' || c == '\\' {
                    rest.push('\\');
                }
                rest.push(c);
            }
            rest.push('\'');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConnectionString, ConnectionStringError> {
        ConnectionString::parse(text)
    }

    #[test]
    fn modes_in_both_forms() {
        for (text, mode) in [
            ("postgresql://u@h/db", SslMode::Prefer),
            ("postgres://u@h/db?sslmode=disable", SslMode::Disable),
            (
                "postgresql://u@h/db?application_name=x&sslmode=require",
                SslMode::Require,
            ),
            ("host=h user=u", SslMode::Prefer),
            ("host=h sslmode = require user=u", SslMode::Require),
            ("host=h sslmode='disable'", SslMode::Disable),
        ] {
            let parsed = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(parsed.ssl_mode(), mode, "{text}");
        }
        let parsed =
            parse("postgresql://u@h:6543/db?sslmode=require&application_name=app").expect("url");
        assert_eq!(parsed.config().get_application_name(), Some("app"));
        assert_eq!(parsed.config().get_ports(), &[6543]);
        assert_eq!(
            parsed.config().get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
    }

    #[test]
    fn values_keep_their_quotes_and_escapes() {
        let parsed = parse(r"host=h user='o\'brien' password='a b\\c' sslmode=disable dbname=d")
            .expect("pairs");
        assert_eq!(parsed.config().get_user(), Some("o'brien"));
        assert_eq!(parsed.config().get_password(), Some(&b"a b\\c"[..]));
        assert_eq!(parsed.config().get_dbname(), Some("d"));
        // A '?' in the password does not start the query.
        let parsed = parse("postgresql://u:p%3Fq?x@h/db?sslmode=disable").expect("url");
        assert_eq!(parsed.ssl_mode(), SslMode::Disable);
        assert_eq!(parsed.config().get_password(), Some(&b"p?q?x"[..]));
    }

    #[test]
    fn unsupported_modes_and_options_are_refused_by_name() {
        for text in [
            "host=h sslmode=allow",
            "postgresql://h/db?sslmode=verify-everything",
        ] {
            let err = parse(text).expect_err(text);
            assert!(
                matches!(err, ConnectionStringError::UnsupportedSslMode { .. }),
                "{text}: {err}"
            );
        }
        assert_eq!(
            parse("host=h sslmode=allow")
                .expect_err("allow")
                .to_string(),
            "unsupported sslmode \"allow\": use disable, prefer, require, verify-ca or \
             verify-full"
        );
        let err = parse("postgresql://h/db?sslcert=/c.pem&sslmode=require").expect_err("cert");
        assert_eq!(
            err.to_string(),
            "unsupported postgres connection option \"sslcert\": client certificates are not \
             supported"
        );
        assert!(matches!(
            parse("host=h sslsni=yes").expect_err("sni"),
            ConnectionStringError::InvalidValue { key: "sslsni", .. }
        ));
        assert!(matches!(
            parse("host=h nonsense=1").expect_err("unknown"),
            ConnectionStringError::Malformed { .. }
        ));
        assert!(matches!(
            parse("host=h user='open").expect_err("quote"),
            ConnectionStringError::Syntax { .. }
        ));
        assert!(matches!(
            parse("host=h user").expect_err("no ="),
            ConnectionStringError::Syntax { .. }
        ));
    }

    #[test]
    fn verified_modes_need_a_root_certificate() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing.pem");
        let err = parse(&format!(
            "host=h sslmode=verify-full sslrootcert={}",
            missing.display()
        ))
        .expect_err("missing file");
        assert!(
            matches!(err, ConnectionStringError::RootCertUnreadable { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("missing.pem"), "{err}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let err = parse(&format!(
            "postgresql://h/db?sslmode=verify-ca&sslrootcert={}",
            empty.display()
        ))
        .expect_err("no certificate");
        assert!(
            matches!(err, ConnectionStringError::RootCertEmpty { .. }),
            "{err}"
        );

        let ca = rcgen::generate_simple_self_signed(vec!["db".to_owned()]).expect("rcgen");
        let file = dir.path().join("ca.pem");
        std::fs::write(&file, ca.cert.pem()).expect("write");
        let ok = parse(&format!(
            "host=db sslmode=verify-full sslrootcert={}",
            file.display()
        ))
        .expect("verify-full");
        assert_eq!(ok.ssl_mode(), SslMode::VerifyFull);
        // `system`: verify-full by default, weaker modes refused.
        assert_eq!(
            parse("host=db sslrootcert=system")
                .expect("system")
                .ssl_mode(),
            SslMode::VerifyFull
        );
        assert!(matches!(
            parse("host=db sslrootcert=system sslmode=require").expect_err("weak"),
            ConnectionStringError::Conflict(_)
        ));
    }
}
