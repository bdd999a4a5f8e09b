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
use std::time::Duration;

use crate::directory::{DrainKind, HostShared};

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

    /// Ids held per namespace (resident, activating or closing), for a
    /// re-registration; namespaces holding none are left out.
    pub(crate) fn instances(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        self.0
            .iter()
            .map(|host| (host.ns.to_string(), host.ids()))
            .filter(|(_, ids)| !ids.is_empty())
            .collect()
    }

    /// Aborts every instance of every namespace.
    pub(crate) fn abort_all(&self) {
        for host in self.0.iter() {
            host.abort_all();
        }
    }

    /// Applies the control plane's drain echo to every namespace.
    pub(crate) fn server_drain(&self, draining: bool, deadline: Option<Duration>) {
        for host in self.0.iter() {
            if draining {
                host.start_drain(DrainKind::Server, deadline);
            } else {
                host.stop_drain(DrainKind::Server);
            }
        }
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
