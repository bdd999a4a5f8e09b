//! Durable instance state for pinned: the epoch-fenced [`StateStore`] and its three
//! implementations.
//!
//! Owns the storage of tray rows `(ns, id, tray_ns, tray_id) → (marked, doc)` and the
//! store-level fence of wire.md §8.3: every operation carries the caller's placement
//! epoch, a lower epoch than the instance's stored one fails with
//! [`StoreError::FenceLost`], and an equal or higher one advances the stored epoch
//! atomically with the operation. It must never decide what a fence loss means for an
//! instance (the worker poisons and aborts it) and never depends on the worker or on
//! pinboard.
//!
//! | store | for | survives a restart |
//! | --- | --- | --- |
//! | [`MemoryStore`] | tests | no |
//! | `SqliteStore` | one machine, no setup: the default without a database URL | yes (one file, WAL) |
//! | `PostgresStore` | fleets; shares the Python reference's tables | yes |
//!
//! [`StoreConfig::from_location`] picks one from a configured location (`postgres://…`,
//! `sqlite:PATH`, `memory:`, or nothing for the default SQLite file).
//!
//! # Features
//!
//! Each durable backend is a Cargo feature; [`MemoryStore`] is always built.
//!
//! | feature | default | gives |
//! | --- | --- | --- |
//! | `sqlite` | yes | `SqliteStore`, `SqliteOptions`, `SyncMode`, `StoreError::Sqlite` |
//! | `postgres` | no | `PostgresStore`, `PostgresOptions`, its `DEFAULT_*` constants, `StoreError::Postgres`, `ConnectionString` (libpq strings, TLS through rustls), the sweeper indexes' `SweepIndexes`, `SweepIndexBuild`, `SweepScan`, `PlanChoice` |
//! | `test-util` | no | the `conformance` suite (its `PostgresCleanup` needs `postgres` too) |
//!
//! A location naming a backend this build lacks is refused by
//! [`StoreConfig::from_location`] with [`StoreError::BackendNotBuilt`].
//!
//! ```
//! use pinned_store::{InstanceKey, MemoryStore, StateStore, StoreError, TrayKey};
//! use serde_json::json;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), StoreError> {
//! let store = MemoryStore::new();
//! let doc = json!({"count": 1}).as_object().cloned().unwrap_or_default();
//! let a = InstanceKey::new("/counters", "a");
//! let count = TrayKey::singleton("count");
//! store.set_tray(a, count, false, doc, 1).await?;
//! let tray = store.get_tray(a, count, 1).await?;
//! assert_eq!(tray.map(|t| t.doc["count"].clone()), Some(json!(1)));
//!
//! // A newer activation (epoch 2) reads; the old one (epoch 1) is fenced out.
//! store.list(a, 2, None, None).await?;
//! let err = store.delete_tray(a, count, 1).await.unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "fence lost for '/counters/a': epoch 1 was superseded by a newer activation"
//! );
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod doc_text;
mod error;
mod key;
#[cfg(feature = "postgres")]
mod locks;
mod memory;
mod open;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
mod store;

#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod conformance;
#[cfg(feature = "test-util")]
mod faults;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub use faults::{FailingStore, Outage};

pub use doc_text::DocText;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use error::ConnectionStringError;
pub use error::{BoxError, StoreError};
pub use key::{InstanceKey, TrayKey, SINGLETON_TRAY_ID};
pub use memory::MemoryStore;
pub use open::StoreConfig;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::{
    ConnectionString, IndexState, PlanChoice, PostgresOptions, PostgresStore, SslMode,
    SweepIndexBuild, SweepIndexes, SweepScan, ALARM_AT_COLUMN, ALARM_AT_TRIGGER, ALARM_DUE_INDEX,
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT, DEFAULT_INDEX_BUILD_DEADLINE,
    DEFAULT_LOCK_TIMEOUT, DEFAULT_POOL_SIZE, DEFAULT_STATEMENT_TIMEOUT, DEFAULT_TXN_DEADLINE,
    MARKED_INDEX, RETIRED_ALARM_INDEX, TRAY_INDEX_FILLFACTOR,
};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::{SqliteOptions, SqliteStore, SyncMode};
pub use store::{
    BatchOp, Doc, DueAlarm, MarkedInstance, Peek, PeekedRow, StateStore, Tray, TrayRow, WorldStamp,
    ALARM_TRAY, ALARM_TRAY_ID, ALARM_TRAY_NS,
};
