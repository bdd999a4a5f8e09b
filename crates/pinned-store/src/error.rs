//! The one error type every store returns, and its classification.
//!
//! Owns [`StoreError`]: what went wrong, whether the caller may simply try again
//! ([`StoreError::retryable`]), and the exact `FenceLost` text of the Python reference
//! (wire.md §8.3). It must never decide *policy* (poisoning an instance, aborting it):
//! that belongs to the worker that reads the classification.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::InstanceKey;

/// A boxed error from a backend, kept as the `source` of a [`StoreError`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Everything a [`StateStore`](crate::StateStore) operation can fail with.
///
/// Only [`FenceLost`](StoreError::FenceLost) is part of the protocol; the other variants
/// say which backend failed and how. Use [`retryable`](StoreError::retryable) rather than
/// matching variants to decide whether to try again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The caller's epoch is below the instance's stored epoch: a newer activation owns
    /// the instance and this caller is permanently fenced. Nothing was applied.
    ///
    /// Its `Display` is the Python reference's text, e.g.
    /// `fence lost for '/threads/a': epoch 3 was superseded by a newer activation`.
    #[error(
        "fence lost for {}: epoch {epoch} was superseded by a newer activation",
        PyRepr(key)
    )]
    FenceLost {
        /// `"<ns>/<id>"`, e.g. `"/threads/a"`.
        key: String,
        /// The caller's (superseded) epoch.
        epoch: u64,
    },

    /// The epoch does not fit the stores' signed 64-bit column (`BIGINT`); nothing ran.
    #[error("epoch {epoch} is out of range: stores hold epochs up to {}", i64::MAX)]
    EpochOutOfRange {
        /// The refused epoch.
        epoch: u64,
    },

    /// Postgres refused a statement or the connection broke before commit. Nothing was
    /// committed. Retryable when the cause is transient (connection loss, lock or
    /// statement timeout, serialization failure, server shutting down).
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    #[error("postgres: {}", Causes(source))]
    Postgres {
        /// The driver's error (carries the SQLSTATE when the server sent one).
        #[source]
        source: tokio_postgres::Error,
    },

    /// No connection could be had: dialling a fresh connection failed or the pool is
    /// unusable. Nothing ran; the database may come back.
    #[error("postgres unavailable: {}", Causes(&**source))]
    Unavailable {
        /// Why the connection could not be had.
        #[source]
        source: BoxError,
    },

    /// The whole transaction exceeded its deadline before commit; its connection was
    /// killed, so nothing was committed.
    #[error("store transaction exceeded its {deadline:?} deadline")]
    Deadline {
        /// The deadline that was exceeded.
        deadline: Duration,
    },

    /// The commit was sent but its outcome is unknown (the connection failed or the
    /// deadline passed during commit). The operation may or may not be durable: re-read
    /// before acting on it. Never retried by the store.
    #[error("store commit outcome unknown: {source}")]
    CommitIndeterminate {
        /// What interrupted the commit.
        #[source]
        source: BoxError,
    },

    /// SQLite failed. Nothing was committed. Retryable when the database was busy or
    /// locked by another process.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    #[error("sqlite: {source}")]
    Sqlite {
        /// The driver's error.
        #[source]
        source: std::sync::Arc<rusqlite::Error>,
    },

    /// A stored row could not be read back as `(marked: bool, doc: JSON object)`.
    #[error("stored tray row {key} is corrupt: {detail}")]
    Corrupt {
        /// `"<ns>/<id> <tray_ns>/<tray_id>"` of the bad row.
        key: String,
        /// What was wrong with it.
        detail: String,
    },

    /// The store was shut down (its SQLite thread is gone); nothing ran.
    #[error("store is closed")]
    Closed,

    /// The store could not be configured or its tables created.
    #[error("store setup failed: {source}")]
    Setup {
        /// Why setup failed.
        #[source]
        source: BoxError,
    },

    /// A Postgres connection string could not be read, or asks for TLS this store
    /// cannot give (an unsupported `sslmode`, a missing root certificate). Nothing was
    /// dialled.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    #[error(transparent)]
    ConnectionString(#[from] ConnectionStringError),

    /// The configured location names a backend this build of pinned-store was compiled
    /// without (its Cargo feature is off); nothing was opened.
    #[error("this build of pinned-store has no {backend} backend; enable the `{backend}` feature")]
    BackendNotBuilt {
        /// The backend, which is also its feature's name: `"sqlite"` or `"postgres"`.
        backend: &'static str,
    },
}

/// An error and its causes, `: `-separated: the drivers keep the reason in `source()`
/// (tokio-postgres shows "error performing TLS handshake", its cause the certificate
/// rustls refused). A cause whose text its parent already shows is not repeated.
struct Causes<'a>(&'a (dyn StdError + 'static));

impl fmt::Display for Causes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut next = self.0.source();
        while let Some(cause) = next {
            let text = cause.to_string();
            if !shown.contains(&text) {
                write!(f, ": {text}")?;
                shown = text;
            }
            next = cause.source();
        }
        Ok(())
    }
}

// === impl StoreError ===

impl StoreError {
    /// Builds the fence error for `instance` at the caller's `epoch`.
    pub fn fence_lost(instance: InstanceKey<'_>, epoch: u64) -> Self {
        StoreError::FenceLost {
            key: instance.to_string(),
            epoch,
        }
    }

    /// True for [`StoreError::FenceLost`].
    pub fn is_fence_lost(&self) -> bool {
        matches!(self, StoreError::FenceLost { .. })
    }

    /// Whether trying the same operation again later may succeed *and* is safe: the
    /// failure is transient and nothing was committed.
    ///
    /// `FenceLost`, out-of-range epochs, corrupt rows, a closed store and a commit of
    /// unknown outcome are never retryable.
    pub fn retryable(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            StoreError::Postgres { source } => postgres_transient(source),
            StoreError::Unavailable { .. } | StoreError::Deadline { .. } => true,
            #[cfg(feature = "sqlite")]
            StoreError::Sqlite { source } => matches!(
                source.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            ),
            StoreError::FenceLost { .. }
            | StoreError::EpochOutOfRange { .. }
            | StoreError::CommitIndeterminate { .. }
            | StoreError::Corrupt { .. }
            | StoreError::Closed
            | StoreError::Setup { .. }
            | StoreError::BackendNotBuilt { .. } => false,
            #[cfg(feature = "postgres")]
            StoreError::ConnectionString(_) => false,
        }
    }
}

/// Why a Postgres connection string was refused ([`ConnectionString::parse`]): it
/// is malformed, or asks for TLS this store cannot give.
///
/// [`ConnectionString::parse`]: crate::ConnectionString::parse
#[cfg(feature = "postgres")]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectionStringError {
    /// tokio-postgres refused the string (an unknown keyword, a bad port, ...).
    #[error("malformed postgres connection string: {source}")]
    Malformed {
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// A `key=value` string that does not parse (libpq's rules: `key = value`
    /// pairs, values optionally in single quotes with backslash escapes).
    #[error("malformed postgres connection string: {detail}")]
    Syntax {
        /// What is wrong, and where.
        detail: String,
    },
    /// `sslmode` is not one this store supports. libpq's `allow` (plain first, TLS
    /// only if the server insists) is refused: tokio-postgres cannot fall back that
    /// way.
    #[error(
        "unsupported sslmode {mode:?}: use disable, prefer, require, verify-ca or verify-full"
    )]
    UnsupportedSslMode {
        /// The refused value.
        mode: String,
    },
    /// A libpq TLS keyword this store does not support (client certificates,
    /// revocation lists, key passwords, protocol bounds).
    #[error("unsupported postgres connection option {key:?}: {why}")]
    UnsupportedOption {
        /// The keyword.
        key: String,
        /// Why, and what to do instead.
        why: &'static str,
    },
    /// A keyword with a value it cannot take (`sslsni=maybe`).
    #[error("invalid value {value:?} for postgres connection option {key:?}")]
    InvalidValue {
        /// The keyword.
        key: &'static str,
        /// The refused value.
        value: String,
    },
    /// Two settings that contradict each other, as libpq refuses them
    /// (`sslrootcert=system` with a mode weaker than `verify-full`).
    #[error("{0}")]
    Conflict(&'static str),
    /// `verify-ca`/`verify-full` without a root certificate: no `sslrootcert`, and
    /// libpq's default file (`~/.postgresql/root.crt`) is absent.
    #[error(
        "sslmode={mode} needs the CA that signed the server's certificate: set \
         sslrootcert=<PEM file> (or sslrootcert=system for the Mozilla roots); \
         the default {default} does not exist"
    )]
    MissingRootCert {
        /// The mode asked for.
        mode: &'static str,
        /// libpq's default file, as looked for.
        default: String,
    },
    /// The `sslrootcert` file could not be read or parsed as PEM.
    #[error("sslrootcert {}: {source}", path.display())]
    RootCertUnreadable {
        /// The file.
        path: std::path::PathBuf,
        /// The reader's or parser's error.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The `sslrootcert` file holds no certificate.
    #[error("sslrootcert {}: no CERTIFICATE block in the file", path.display())]
    RootCertEmpty {
        /// The file.
        path: std::path::PathBuf,
    },
    /// A certificate of the `sslrootcert` file is not a usable trust anchor.
    #[error("sslrootcert {}: {source}", path.display())]
    RootCertRefused {
        /// The file.
        path: std::path::PathBuf,
        /// Why rustls refused it.
        #[source]
        source: rustls::Error,
    },
    /// rustls could not build the client configuration.
    #[error("postgres TLS configuration: {source}")]
    Tls {
        /// rustls' error.
        #[source]
        source: rustls::Error,
    },
}

#[cfg(feature = "sqlite")]
impl From<rusqlite::Error> for StoreError {
    fn from(source: rusqlite::Error) -> Self {
        StoreError::Sqlite {
            source: std::sync::Arc::new(source),
        }
    }
}

#[cfg(feature = "postgres")]
impl From<tokio_postgres::Error> for StoreError {
    fn from(source: tokio_postgres::Error) -> Self {
        StoreError::Postgres { source }
    }
}

/// Whether a Postgres failure is transient: the connection is gone, or the server
/// reported a connection exception (08), a transaction rollback such as a deadlock or
/// serialization failure (40), insufficient resources (53), a lock that could not be
/// had (55P03), or operator intervention such as a statement timeout or shutdown (57).
#[cfg(feature = "postgres")]
pub(crate) fn postgres_transient(err: &tokio_postgres::Error) -> bool {
    match err.code() {
        Some(code) => {
            let code = code.code();
            code.starts_with("08")
                || code.starts_with("40")
                || code.starts_with("53")
                || code == "55P03"
                || code.starts_with("57")
        }
        // No SQLSTATE: transient only when the connection closed or its I/O failed (a
        // reset, a timeout while dialling), not for a value that failed to convert.
        None => {
            err.is_closed()
                || StdError::source(err).is_some_and(|cause| cause.is::<std::io::Error>())
        }
    }
}

/// Formats a string the way Python's `repr()` does for the `FenceLost` message.
struct PyRepr<'a>(&'a str);

impl fmt::Display for PyRepr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write;
        let s = self.0;
        let quote = if s.contains('\'') && !s.contains('"') {
            '"'
        } else {
            '\''
        };
        f.write_char(quote)?;
        for c in s.chars() {
            match c {
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c if c == quote => write!(f, "\\{c}")?,
                c if (c as u32) < 0x20 || (0x7f..=0xa0).contains(&(c as u32)) => {
                    write!(f, "\\x{:02x}", c as u32)?
                }
                c => f.write_char(c)?,
            }
        }
        f.write_char(quote)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_lost_text_matches_the_reference() {
        let err = StoreError::fence_lost(InstanceKey::new("/threads", "a"), 3);
        assert_eq!(
            err.to_string(),
            "fence lost for '/threads/a': epoch 3 was superseded by a newer activation"
        );
        assert!(err.is_fence_lost());
        assert!(!err.retryable());
    }

    #[test]
    fn repr_switches_quotes_and_escapes() {
        assert_eq!(PyRepr("it's").to_string(), "\"it's\"");
        assert_eq!(PyRepr("a'b\"c").to_string(), "'a\\'b\"c'");
        assert_eq!(PyRepr("x\\y\n").to_string(), "'x\\\\y\\n'");
        assert_eq!(PyRepr("\u{1}").to_string(), "'\\x01'");
    }

    #[test]
    fn classification() {
        assert!(StoreError::Deadline {
            deadline: Duration::from_secs(30)
        }
        .retryable());
        assert!(!StoreError::Closed.retryable());
        assert!(!StoreError::EpochOutOfRange { epoch: u64::MAX }.retryable());
        assert!(!StoreError::BackendNotBuilt {
            backend: "postgres"
        }
        .retryable());
    }

    #[test]
    fn backend_not_built_names_the_feature() {
        assert_eq!(
            StoreError::BackendNotBuilt {
                backend: "postgres"
            }
            .to_string(),
            "this build of pinned-store has no postgres backend; enable the `postgres` feature"
        );
    }
}
