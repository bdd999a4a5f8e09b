//! The worker's namespace table: every hosted namespace's directory, in the
//! order they were declared.
//!
//! Built once by [`Options::build`](crate::Options::build) and handed, by
//! value, to whatever serves across namespaces (dispatch, the registration
//! loop, the in-process cluster switchboard). No host holds the table, so
//! there is no path from a host back to the worker: the table is wired top
//! down and never through a back-pointer.

use std::ops::Deref;
use std::sync::Arc;

use crate::directory::HostShared;

/// Every hosted namespace of one worker (cheap to clone).
#[derive(Clone)]
pub(crate) struct Hosts(Arc<[Arc<HostShared>]>);

impl Hosts {
    pub(crate) fn new(hosts: Vec<Arc<HostShared>>) -> Self {
        Self(hosts.into())
    }

    /// The host of namespace `ns` (with its leading slash).
    pub(crate) fn find(&self, ns: &str) -> Option<&Arc<HostShared>> {
        self.0.iter().find(|host| &*host.ns == ns)
    }

    /// Every namespace as the control plane commands it.
    pub(crate) fn commanded(&self) -> crate::registration::Namespaces {
        self.0.iter().map(|host| host.commanded()).collect()
    }
}

impl Deref for Hosts {
    type Target = [Arc<HostShared>];

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<'a> IntoIterator for &'a Hosts {
    type Item = &'a Arc<HostShared>;
    type IntoIter = std::slice::Iter<'a, Arc<HostShared>>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}
