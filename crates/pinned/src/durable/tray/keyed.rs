//! The contract between a field that takes appends ([`Queue`](super::Queue))
//! and a keyed admission into its tray
//! ([`TrayCtx::dispatch`](super::TrayCtx::dispatch)): [`Keyed`] (what the
//! admission asks of the field) and [`KeyedAdmission`] (the admission's key
//! and its tally).
//!
//! Only the contract lives here, at the bottom of the tray modules, so the
//! field kinds can name it without naming the dispatch ledger; the ledger
//! drives it. Nothing here writes a row.

use serde_json::Value as Json;

/// The doc key under which a stored queue item carries the key of the
/// keyed admission that appended it (the reference's tag).
pub(crate) const ADMIT_TAG: &str = "~admit";

/// One keyed admission under way: its key, whether the target already
/// holds the key (then every append is absorbed), and what happened to the
/// appends so far.
#[derive(Debug)]
pub struct KeyedAdmission<'a> {
    pub(crate) key: &'a Json,
    pub(crate) ignored: bool,
    /// Appends the admission's edit made.
    pub(crate) attempted: u64,
    /// Appends that landed (were not absorbed).
    pub(crate) landed: u64,
}

impl<'a> KeyedAdmission<'a> {
    pub(crate) fn new(key: &'a Json, ignored: bool) -> Self {
        Self {
            key,
            ignored,
            attempted: 0,
            landed: 0,
        }
    }

    /// The reference's outcome: absorbed when the target already held the
    /// key, or when appends were made and none landed.
    pub(crate) fn absorbed(&self) -> bool {
        self.ignored || (self.attempted > 0 && self.landed == 0)
    }
}

/// A field whose appends a keyed admission tags with its key and absorbs
/// on a re-run. Implemented by [`Queue`](super::Queue); the ledger reaches
/// it through [`Field::keyed`](super::Field::keyed). Not meant to be
/// implemented outside this crate (it cannot be named there).
pub trait Keyed: Send + Sync {
    /// Appends made since the field was made (not durable; only the
    /// difference over one synchronous edit counts).
    fn appended(&self) -> u64;

    /// Applies `admission` to the appends made since [`appended`](Self::appended)
    /// answered `since`: each is absorbed (removed) while the target
    /// ignores the key or while entries tagged with the key from an earlier
    /// run are left to match it, else tagged with the key.
    fn admit_appended(&mut self, since: u64, admission: &mut KeyedAdmission<'_>);
}
