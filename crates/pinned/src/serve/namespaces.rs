//! The worker's namespace table: every hosted namespace, in the
//! order they were declared.
//!
//! Built once by [`Options::build`](crate::Options::build) and handed, by
//! value, to whatever serves across namespaces (dispatch, the registration
//! loop, the in-process cluster switchboard). No host holds the table, so
//! there is no path from a host back to the worker: the table is wired top
//! down and never through a back-pointer.

use std::ops::Deref;
use std::sync::Arc;

use crate::namespace::Namespace;

/// Every hosted namespace of one worker (cheap to clone).
#[derive(Clone)]
pub(crate) struct Namespaces(Arc<[Arc<Namespace>]>);

impl Namespaces {
    pub(crate) fn new(hosts: Vec<Arc<Namespace>>) -> Self {
        Self(hosts.into())
    }

    /// The host of namespace `ns` (with its leading slash).
    pub(crate) fn find(&self, ns: &str) -> Option<&Arc<Namespace>> {
        self.0.iter().find(|host| &*host.ns == ns)
    }

    /// Every namespace as the control plane commands it.
    pub(crate) fn commanded(&self) -> crate::plane::registration::Commands {
        self.0.iter().map(|host| host.commanded()).collect()
    }
}

impl Deref for Namespaces {
    type Target = [Arc<Namespace>];

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<'a> IntoIterator for &'a Namespaces {
    type Item = &'a Arc<Namespace>;
    type IntoIter = std::slice::Iter<'a, Arc<Namespace>>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}
