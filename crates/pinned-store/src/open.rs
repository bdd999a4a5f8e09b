//! Choosing and opening a store from configuration.
//!
//! Owns the mapping from a configured location (a database URL, a file, nothing) to a
//! store, including the default: no URL means the embedded SQLite file. It must never
//! read the environment itself; callers pass what they parsed.

use std::path::PathBuf;
use std::sync::Arc;

use crate::{MemoryStore, StateStore, StoreError};
#[cfg(feature = "postgres")]
use crate::{PostgresOptions, PostgresStore};
#[cfg(feature = "sqlite")]
use crate::{SqliteOptions, SqliteStore};

/// Where durable state lives.
///
/// Only the backends this build has (Cargo features `sqlite`, `postgres`) have a
/// variant, so the enum is non-exhaustive: enabling a feature adds one.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum StoreConfig {
    /// [`MemoryStore`]: nothing survives the process.
    Memory,
    /// `SqliteStore` in this file (feature `sqlite`).
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    Sqlite {
        /// The database file (created if absent).
        path: PathBuf,
        /// Its options.
        options: SqliteOptions,
    },
    /// `PostgresStore` at this URL; tables are created on open (feature `postgres`).
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Postgres {
        /// A connection string as libpq reads it (`postgres://…`, `postgresql://…`, or
        /// `key=value` pairs; see `ConnectionString`).
        url: String,
        /// Its options.
        options: PostgresOptions,
    },
}

// === impl StoreConfig ===

impl StoreConfig {
    /// Reads a configured location: `postgres://…`/`postgresql://…` or a libpq
    /// `key=value` string (`host=db dbname=app sslmode=verify-full …`) is Postgres,
    /// `sqlite:PATH` (or `sqlite://PATH`) a SQLite file, `memory:` the memory store, and
    /// no location at all the SQLite file at `default_file`. Options are the defaults.
    ///
    /// A Postgres location is read at once (`ConnectionString::parse`), so an
    /// unsupported `sslmode` or a missing root certificate fails here.
    ///
    /// # Errors
    ///
    /// [`StoreError::BackendNotBuilt`] for a Postgres or SQLite location (including no
    /// location, which means SQLite) when that backend's feature is off;
    /// `StoreError::ConnectionString` for a Postgres location that does not read;
    /// [`StoreError::Setup`] for a location of any other shape.
    pub fn from_location(
        location: Option<&str>,
        default_file: impl Into<PathBuf>,
    ) -> Result<Self, StoreError> {
        let Some(location) = location.map(str::trim).filter(|l| !l.is_empty()) else {
            return Self::sqlite(default_file.into());
        };
        if location.starts_with("postgres://")
            || location.starts_with("postgresql://")
            || is_key_value(location)
        {
            return Self::postgres(location);
        }
        if location == "memory:" {
            return Ok(StoreConfig::Memory);
        }
        if let Some(path) = location
            .strip_prefix("sqlite://")
            .or_else(|| location.strip_prefix("sqlite:"))
            .filter(|p| !p.is_empty())
        {
            return Self::sqlite(PathBuf::from(path));
        }
        Err(StoreError::Setup {
            source: format!(
                "unsupported store location {location:?}: expected postgres://…, \
                 postgresql://…, sqlite:PATH or memory:"
            )
            .into(),
        })
    }

    /// The SQLite file at `path` with default options.
    #[cfg(feature = "sqlite")]
    fn sqlite(path: PathBuf) -> Result<Self, StoreError> {
        Ok(StoreConfig::Sqlite {
            path,
            options: SqliteOptions::default(),
        })
    }

    /// This build has no SQLite backend.
    #[cfg(not(feature = "sqlite"))]
    fn sqlite(_path: PathBuf) -> Result<Self, StoreError> {
        Err(StoreError::BackendNotBuilt { backend: "sqlite" })
    }

    /// Postgres at `url` with default options.
    #[cfg(feature = "postgres")]
    fn postgres(url: &str) -> Result<Self, StoreError> {
        crate::ConnectionString::parse(url)?;
        Ok(StoreConfig::Postgres {
            url: url.to_owned(),
            options: PostgresOptions::default(),
        })
    }

    /// This build has no Postgres backend.
    #[cfg(not(feature = "postgres"))]
    fn postgres(_url: &str) -> Result<Self, StoreError> {
        Err(StoreError::BackendNotBuilt {
            backend: "postgres",
        })
    }

    /// Opens the configured store (creating tables as needed).
    ///
    /// # Errors
    ///
    /// As `SqliteStore::open` and `PostgresStore::open`.
    pub async fn open(self) -> Result<Arc<dyn StateStore>, StoreError> {
        Ok(match self {
            StoreConfig::Memory => Arc::new(MemoryStore::new()),
            #[cfg(feature = "sqlite")]
            StoreConfig::Sqlite { path, options } => {
                Arc::new(SqliteStore::open(path, options).await?)
            }
            #[cfg(feature = "postgres")]
            StoreConfig::Postgres { url, options } => {
                Arc::new(PostgresStore::open(&url, options).await?)
            }
        })
    }
}

/// Whether `location` reads as libpq `key=value` pairs: it starts with a keyword
/// (letters and `_`) followed by `=`.
fn is_key_value(location: &str) -> bool {
    let keyword_end = location
        .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
        .unwrap_or(location.len());
    keyword_end > 0 && location[keyword_end..].trim_start().starts_with('=')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(location: Option<&str>) -> Result<StoreConfig, StoreError> {
        StoreConfig::from_location(location, "default.db")
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn no_location_means_the_embedded_file() {
        for location in [None, Some(""), Some("  ")] {
            match parse(location) {
                Ok(StoreConfig::Sqlite { path, .. }) => {
                    assert_eq!(path, PathBuf::from("default.db"))
                }
                other => panic!("{location:?}: {other:?}"),
            }
        }
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_locations() {
        assert!(matches!(
            parse(Some("sqlite:/var/lib/pinned/state.db")),
            Ok(StoreConfig::Sqlite { path, .. }) if path.as_path() == std::path::Path::new("/var/lib/pinned/state.db")
        ));
        assert!(matches!(
            parse(Some("sqlite://rel.db")),
            Ok(StoreConfig::Sqlite { path, .. }) if path.as_path() == std::path::Path::new("rel.db")
        ));
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_locations() {
        assert!(matches!(
            parse(Some("postgresql://u@h/db")),
            Ok(StoreConfig::Postgres { url, .. }) if url == "postgresql://u@h/db"
        ));
        assert!(matches!(
            parse(Some("postgres://h/db")),
            Ok(StoreConfig::Postgres { .. })
        ));
        assert!(matches!(
            parse(Some("host=db.internal dbname=app sslmode=require")),
            Ok(StoreConfig::Postgres { url, .. }) if url.starts_with("host=db.internal")
        ));
        assert!(matches!(
            parse(Some("postgresql://h/db?sslmode=allow")),
            Err(StoreError::ConnectionString(
                crate::ConnectionStringError::UnsupportedSslMode { .. }
            ))
        ));
    }

    #[cfg(not(feature = "sqlite"))]
    #[test]
    fn sqlite_locations_without_the_feature() {
        for location in [None, Some("sqlite:state.db")] {
            assert!(
                matches!(
                    parse(location),
                    Err(StoreError::BackendNotBuilt { backend: "sqlite" })
                ),
                "{location:?}"
            );
        }
    }

    #[cfg(not(feature = "postgres"))]
    #[test]
    fn postgres_locations_without_the_feature() {
        let err = parse(Some("postgres://h/db")).expect_err("no postgres backend");
        assert_eq!(
            err.to_string(),
            "this build of pinned-store has no postgres backend; enable the `postgres` feature"
        );
    }

    #[test]
    fn other_locations() {
        assert!(matches!(parse(Some("memory:")), Ok(StoreConfig::Memory)));
        for bad in ["mysql://x", "sqlite:", "state.db"] {
            assert!(
                matches!(parse(Some(bad)), Err(StoreError::Setup { .. })),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn memory_opens() {
        let store = StoreConfig::Memory.open().await.expect("memory store");
        assert!(store
            .list(crate::InstanceKey::new("/n", "a"), 0, None, None)
            .await
            .expect("list")
            .is_empty());
    }
}
