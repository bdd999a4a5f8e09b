//! [`StorePages`]: the page rows of one paged field of one open tray: how
//! they are named and how they are read from the instance's store.
//!
//! A page of field `f` of tray `t` under key `k` is the row
//! `(tray_ns, tray_id) = ("t~f", "k~<page>")`. No row of the Python
//! reference is named so: its tray names are Python identifiers, which
//! never hold `~` (and this library refuses tray names that do), so a
//! page can never be read as a tray, by either worker. The name is
//! injective: the tray name ends at the first `~` of `tray_ns`, the page
//! number (digits only) starts after the last `~` of `tray_id`.
//!
//! Reads wait for every write the instance enlisted first, then read at
//! its epoch (a lost fence aborts the instance). Only pages that no longer
//! change are read through [`PageSource`], so a few recent ones are kept.
//! Nothing here writes: page images leave with the tray's row.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use pinned_store::{Doc, InstanceKey, StateStore, TrayKey};

use super::frontier::Frontier;
use super::paged::PageSource;
use super::TrayError;
use crate::namespace::Record;

/// Pages kept after a read, per field of an open tray.
const KEPT_PAGES: usize = 8;

/// The page rows of one paged field of one open tray.
pub(crate) struct StorePages {
    tray: &'static str,
    key: String,
    tray_ns: String,
    store: Arc<dyn StateStore>,
    /// Weak: the slot owns its trays, which own their pages.
    slot: Weak<Record>,
    frontier: Arc<Frontier>,
    kept: Mutex<VecDeque<(u64, Arc<Doc>)>>,
}

impl StorePages {
    pub(crate) fn new(
        tray: &'static str,
        field: &str,
        key: &str,
        store: Arc<dyn StateStore>,
        slot: Weak<Record>,
        frontier: Arc<Frontier>,
    ) -> Self {
        Self {
            tray,
            key: key.to_owned(),
            tray_ns: format!("{tray}~{field}"),
            store,
            slot,
            frontier,
            kept: Mutex::new(VecDeque::new()),
        }
    }

    /// The rows' `tray_ns`.
    pub(crate) fn tray_ns(&self) -> &str {
        &self.tray_ns
    }

    /// Page `page`'s `tray_id`.
    pub(crate) fn tray_id(&self, page: u64) -> String {
        format!("{}~{page}", self.key)
    }

    /// Page `page`'s row as stored now, once every write enlisted before
    /// the call landed.
    pub(crate) async fn fetch(&self, page: u64) -> Result<Option<Doc>, TrayError> {
        self.frontier.receipt().await?;
        let slot = self.slot.upgrade().ok_or(TrayError::Closed)?;
        let epoch = slot.epoch().unwrap_or(0);
        let tray_id = self.tray_id(page);
        let row = self
            .store
            .get_tray(
                InstanceKey::new(&slot.host.ns, &slot.id),
                TrayKey::new(&self.tray_ns, &tray_id),
                epoch,
            )
            .await
            .map_err(|error| {
                crate::durable::abort_on_fence_lost(&slot, &error);
                TrayError::Store(error)
            })?;
        Ok(row.map(|row| row.doc))
    }
}

impl PageSource for StorePages {
    fn read(self: Arc<Self>, page: u64) -> BoxFuture<'static, Result<Option<Arc<Doc>>, TrayError>> {
        Box::pin(async move {
            let kept = self
                .kept
                .lock()
                .iter()
                .find(|(number, _)| *number == page)
                .map(|(_, doc)| doc.clone());
            if let Some(doc) = kept {
                return Ok(Some(doc));
            }
            let Some(doc) = self.fetch(page).await? else {
                return Ok(None);
            };
            let doc = Arc::new(doc);
            let mut kept = self.kept.lock();
            if !kept.iter().any(|(number, _)| *number == page) {
                if kept.len() == KEPT_PAGES {
                    kept.pop_front();
                }
                kept.push_back((page, doc.clone()));
            }
            Ok(Some(doc))
        })
    }

    fn malformed(&self, reason: String) -> TrayError {
        TrayError::Malformed {
            tray: self.tray.to_owned(),
            key: self.key.clone(),
            reason,
        }
    }
}
