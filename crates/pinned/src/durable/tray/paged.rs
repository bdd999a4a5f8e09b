//! The contract between a field that keeps its contents in rows of their
//! own beside the tray's row ([`Log`](super::Log)'s pages) and the tray
//! that writes and reads those rows: [`Paged`] (what the tray asks of the
//! field) and [`PageSource`] (where the field's reads of older pages go).
//!
//! Only the contract lives here, at the bottom of the tray modules, so the
//! field kinds can name it without naming the tray or the store. A field
//! never writes a row itself: it hands the tray page images, which the
//! tray enlists together with its own row, so both land in one batch.

use std::ops::Range;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use pinned_store::{Doc, DocText};
use serde_json::Value as Json;

use super::TrayError;

/// A page row to write: its number and its image, `None` to delete it.
pub(crate) type PageWrite = (u64, Option<DocText>);

/// A field whose contents live in page rows beside the tray's row, its
/// doc entry holding only where they are. Implemented by
/// [`Log`](super::Log); the tray reaches it through
/// [`Field::paged`](super::Field::paged). Not meant to be implemented
/// outside this crate (it cannot be named there).
pub trait Paged: Send + Sync {
    /// The page the restored field needs read back before it takes writes
    /// (the page it appends to), if any.
    fn page_to_load(&self) -> Option<u64>;

    /// Hands over the row of [`page_to_load`](Self::page_to_load) (`None`:
    /// no such row).
    ///
    /// # Errors
    ///
    /// The row is missing or does not hold what the doc entry says.
    fn load(&mut self, page: Option<&Doc>) -> Result<(), String>;

    /// The page rows to write since the last call, in order.
    ///
    /// # Errors
    ///
    /// An appended value did not serialize to JSON.
    fn take_writes(&mut self, writes: &mut Vec<PageWrite>) -> Result<(), serde_json::Error>;

    /// Every page row the field holds now (to delete them with the tray).
    fn pages(&self) -> Range<u64>;

    /// Schedules the deletion of the pages `entry` (the field's entry in a
    /// row of a discarded schema version) held, with the next write.
    fn discard(&mut self, entry: Option<&Json>);

    /// Where the field's reads of pages it does not hold go.
    fn bind(&mut self, source: Arc<dyn PageSource>);
}

/// Reads the page rows of one paged field of one open tray.
pub trait PageSource: Send + Sync {
    /// Page `page`'s row, once every write enlisted before the call landed
    /// (`None`: no such row, trimmed away). Only pages that no longer
    /// change are read this way, so an answer may be kept.
    fn read(self: Arc<Self>, page: u64) -> BoxFuture<'static, Result<Option<Arc<Doc>>, TrayError>>;

    /// The error of a stored page that does not decode, naming the tray.
    fn malformed(&self, reason: String) -> TrayError;
}
