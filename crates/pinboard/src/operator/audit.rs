//! [`StateAudit`]: the ring of storage controls asked for through this
//! node (`pinboard state audit`), newest last, at most [`AUDIT_CAPACITY`].
//!
//! Owns the entries' shape and the bound; never decides or sends anything.

use std::collections::VecDeque;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Audit entries kept (the oldest drop).
pub const AUDIT_CAPACITY: usize = 256;
/// Audit entries answered when the caller names no `limit`.
pub const DEFAULT_AUDIT_LIMIT: usize = 50;

/// One control asked for, as the audit list keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// When it was answered (Unix ms, this node's clock).
    pub at_ms: u64,
    /// Namespace.
    pub ns: String,
    /// Instance id.
    pub id: String,
    /// The control.
    pub action: String,
    /// The tray and key, for `unpark` and `skip`.
    pub tray: Option<String>,
    /// Who asked: the CLI's `--by` (default `operator`), or
    /// `dashboard:<session prefix>`.
    pub by: String,
    /// The owner's session, once resolved.
    pub owner: Option<String>,
    /// The placement epoch the owner acted at.
    pub epoch: Option<u64>,
    /// The answer's status.
    pub status: u16,
    /// The answer's `detail` when it failed.
    pub detail: Option<String>,
}

/// The audit list of controls asked for on this node, newest last.
#[derive(Debug, Default)]
pub struct StateAudit(Mutex<VecDeque<AuditEntry>>);

impl StateAudit {
    /// Keeps `entry`, dropping the oldest when full.
    pub fn record(&self, entry: AuditEntry) {
        let mut ring = self.0.lock();
        if ring.len() == AUDIT_CAPACITY {
            ring.pop_front();
        }
        ring.push_back(entry);
    }

    /// The newest `limit` entries, newest first.
    pub fn recent(&self, limit: usize) -> Vec<AuditEntry> {
        self.0.lock().iter().rev().take(limit).cloned().collect()
    }
}
