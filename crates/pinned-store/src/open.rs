//! Choosing and opening a store from configuration.
//!
//! Owns the mapping from a configured location (a database URL, a file, nothing) to a
//! store, including the default: no URL means the embedded SQLite file. It must never
//! read the environment itself; callers pass what they parsed.

use std::path::PathBuf;
use std::sync::Arc;

use crate::{
    MemoryStore, PostgresOptions, PostgresStore, SqliteOptions, SqliteStore, StateStore, StoreError,
};

/// Where durable state lives.
#[derive(Debug, Clone)]
pub enum StoreConfig {
    /// [`MemoryStore`]: nothing survives the process.
    Memory,
    /// [`SqliteStore`] in this file.
    Sqlite {
        /// The database file (created if absent).
        path: PathBuf,
        /// Its options.
        options: SqliteOptions,
    },
    /// [`PostgresStore`] at this URL; tables are created on open.
    Postgres {
        /// `postgres://…` or `postgresql://…`.
        url: String,
        /// Its options.
        options: PostgresOptions,
    },
}

// === impl StoreConfig ===

impl StoreConfig {
    /// Reads a configured location: `postgres://…`/`postgresql://…` is Postgres,
    /// `sqlite:PATH` (or `sqlite://PATH`) a SQLite file, `memory:` the memory store, and
    /// no location at all the SQLite file at `default_file`. Options are the defaults.
    ///
    /// # Errors
    ///
    /// [`StoreError::Setup`] for a location of any other shape.
    pub fn from_location(
        location: Option<&str>,
        default_file: impl Into<PathBuf>,
    ) -> Result<Self, StoreError> {
        let Some(location) = location.map(str::trim).filter(|l| !l.is_empty()) else {
            return Ok(StoreConfig::Sqlite {
                path: default_file.into(),
                options: SqliteOptions::default(),
            });
        };
        if location.starts_with("postgres://") || location.starts_with("postgresql://") {
            return Ok(StoreConfig::Postgres {
                url: location.to_owned(),
                options: PostgresOptions::default(),
            });
        }
        if location == "memory:" {
            return Ok(StoreConfig::Memory);
        }
        if let Some(path) = location
            .strip_prefix("sqlite://")
            .or_else(|| location.strip_prefix("sqlite:"))
            .filter(|p| !p.is_empty())
        {
            return Ok(StoreConfig::Sqlite {
                path: PathBuf::from(path),
                options: SqliteOptions::default(),
            });
        }
        Err(StoreError::Setup {
            source: format!(
                "unsupported store location {location:?}: expected postgres://…, \
                 postgresql://…, sqlite:PATH or memory:"
            )
            .into(),
        })
    }

    /// Opens the configured store (creating tables as needed).
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::open`] and [`PostgresStore::open`].
    pub async fn open(self) -> Result<Arc<dyn StateStore>, StoreError> {
        Ok(match self {
            StoreConfig::Memory => Arc::new(MemoryStore::new()),
            StoreConfig::Sqlite { path, options } => {
                Arc::new(SqliteStore::open(path, options).await?)
            }
            StoreConfig::Postgres { url, options } => {
                Arc::new(PostgresStore::open(&url, options).await?)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(location: Option<&str>) -> Result<StoreConfig, StoreError> {
        StoreConfig::from_location(location, "default.db")
    }

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

    #[test]
    fn locations_by_scheme() {
        assert!(matches!(
            parse(Some("postgresql://u@h/db")),
            Ok(StoreConfig::Postgres { url, .. }) if url == "postgresql://u@h/db"
        ));
        assert!(matches!(
            parse(Some("postgres://h/db")),
            Ok(StoreConfig::Postgres { .. })
        ));
        assert!(matches!(parse(Some("memory:")), Ok(StoreConfig::Memory)));
        assert!(matches!(
            parse(Some("sqlite:/var/lib/pinned/state.db")),
            Ok(StoreConfig::Sqlite { path, .. }) if path.as_path() == std::path::Path::new("/var/lib/pinned/state.db")
        ));
        assert!(matches!(
            parse(Some("sqlite://rel.db")),
            Ok(StoreConfig::Sqlite { path, .. }) if path.as_path() == std::path::Path::new("rel.db")
        ));
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
            .list("/n", "a", 0, None, None)
            .await
            .expect("list")
            .is_empty());
    }
}
