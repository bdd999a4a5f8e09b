//! [`InstanceKey`] and [`TrayKey`]: the borrowed names of an instance and of one of its
//! trays, as every [`StateStore`](crate::StateStore) operation takes them.
//!
//! They exist so that a swapped `ns`/`id` or `tray_ns`/`tray_id` pair is a named field
//! at the call site rather than one more positional `&str`. They only borrow: building
//! one must never allocate, and they must never validate or normalize what they hold
//! (the stores key rows by the exact bytes given).

use std::fmt;

/// The tray id of a singleton tray's one row (wire.md §12.4); keyed trays use the key.
pub const SINGLETON_TRAY_ID: &str = "~";

/// An instance's name, `(ns, id)`: the key the store fences by epoch.
///
/// Its `Display` is `"{ns}/{id}"`, the key text of
/// [`StoreError::FenceLost`](crate::StoreError::FenceLost).
///
/// ```
/// use pinned_store::InstanceKey;
///
/// let key = InstanceKey::new("/counters", "a");
/// assert_eq!((key.ns, key.id), ("/counters", "a"));
/// assert_eq!(key.to_string(), "/counters/a");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceKey<'a> {
    /// The instance's namespace, e.g. `"/counters"`.
    pub ns: &'a str,
    /// The instance id within `ns`.
    pub id: &'a str,
}

// === impl InstanceKey ===

impl<'a> InstanceKey<'a> {
    /// The instance `id` of namespace `ns`.
    pub const fn new(ns: &'a str, id: &'a str) -> Self {
        Self { ns, id }
    }
}

impl fmt::Display for InstanceKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.ns, self.id)
    }
}

/// One tray row's name within an instance, `(tray_ns, tray_id)`.
///
/// ```
/// use pinned_store::{TrayKey, SINGLETON_TRAY_ID};
///
/// let keyed = TrayKey::new("jobs", "j-1");
/// assert_eq!((keyed.tray_ns, keyed.tray_id), ("jobs", "j-1"));
/// assert_eq!(TrayKey::singleton("count"), TrayKey::new("count", SINGLETON_TRAY_ID));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrayKey<'a> {
    /// The tray namespace (the declared tray attribute name).
    pub tray_ns: &'a str,
    /// The tray id ([`SINGLETON_TRAY_ID`] for a singleton tray).
    pub tray_id: &'a str,
}

// === impl TrayKey ===

impl<'a> TrayKey<'a> {
    /// The row `tray_id` of tray namespace `tray_ns`.
    pub const fn new(tray_ns: &'a str, tray_id: &'a str) -> Self {
        Self { tray_ns, tray_id }
    }

    /// The one row of singleton tray `tray_ns` (tray id [`SINGLETON_TRAY_ID`]).
    pub const fn singleton(tray_ns: &'a str) -> Self {
        Self::new(tray_ns, SINGLETON_TRAY_ID)
    }
}
