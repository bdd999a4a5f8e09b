//! The durable layer: an instance's rows in the store ([`store`]), its
//! alarm and named schedules ([`alarm`]), its trays ([`tray`]), and
//! pinboard's `_alarm` and `_wake` entry points ([`entry`]).
//!
//! It sits above the namespace layer: it enters instances through their
//! namespace's admission and runs the object's hooks with a
//! [`Context`]. The namespace never reaches up here: the factory that
//! builds a namespace hands it this layer's side as a [`Durability`]
//! ([`Durable`], built once per namespace when the worker has a store),
//! which the namespace calls at its lifecycle points. The parts of
//! [`Context`] that reach the store (rows, timers, trays) are this
//! layer's, below.

use std::any::Any;
use std::sync::Arc;

use dashmap::DashMap;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use pinned_store::{StateStore, StoreError};

use crate::namespace::context::Context;
use crate::namespace::{spawn_detached, Durability, Namespace, Record};
use crate::BoxError;

pub(crate) mod alarm;
pub(crate) mod entry;
pub(crate) mod inspect;
pub(crate) mod reclaim;
pub(crate) mod store;
pub mod tray;

use self::alarm::{Alarm, Timer};
use self::store::InstanceStore;
use self::tray::{Declared, InstanceTrays};

/// The durable layer's side of one namespace: its store, its declared
/// trays and its armed timers.
pub(crate) struct Durable {
    store: Arc<dyn StateStore>,
    /// The object's trays.
    pub(crate) declared: Arc<Declared>,
    /// Armed alarm timers by id.
    pub(crate) timers: DashMap<Arc<str>, Timer>,
    /// Ids an operator action holds on this worker.
    pub(crate) holds: inspect::Holds,
}

impl Durable {
    /// The durable side of a namespace with `store`, whose object declares
    /// `declared`.
    pub(crate) fn new(store: Arc<dyn StateStore>, declared: Arc<Declared>) -> Self {
        Self {
            store,
            declared,
            timers: DashMap::new(),
            holds: inspect::Holds::default(),
        }
    }

    /// The durable side of `host`, if it has one.
    pub(crate) fn of(host: &Namespace) -> Option<&Durable> {
        host.durable.as_deref()?.as_any().downcast_ref()
    }
}

impl Durability for Durable {
    fn open<'a>(&'a self, record: &'a Arc<Record>) -> BoxFuture<'a, Result<bool, BoxError>> {
        async move {
            let Some(marked) = inspect::admits(&self.holds, &*self.store, record).await? else {
                return Ok(false);
            };
            if !self.declared.is_empty() {
                record.set_trays(InstanceTrays::new(
                    record,
                    self.declared.clone(),
                    self.store.clone(),
                    marked,
                ));
            }
            Ok(true)
        }
        .boxed()
    }

    fn resume<'a>(&'a self, record: &'a Arc<Record>) -> BoxFuture<'a, Result<(), BoxError>> {
        async move {
            if let Some(trays) = InstanceTrays::of(record) {
                trays.hydrate().await?;
            }
            Ok(())
        }
        .boxed()
    }

    fn activated(&self, host: &Arc<Namespace>, record: &Arc<Record>) {
        alarm::rearm_from_store(host, record);
    }

    fn closing<'a>(&'a self, record: &'a Arc<Record>) -> BoxFuture<'a, ()> {
        async move {
            if let Some(trays) = InstanceTrays::of(record) {
                trays.close_all().await;
            }
        }
        .boxed()
    }

    fn settle<'a>(&'a self, host: &'a Namespace, record: &'a Arc<Record>) -> BoxFuture<'a, bool> {
        async move {
            let pending = match InstanceTrays::take(record) {
                Some(trays) => {
                    trays.settle().await;
                    trays.pending()
                }
                None => false,
            };
            if !host.control.fires_evicted_alarms() {
                // Behind pinboard an evicted instance's alarm is the sweeper's.
                alarm::disarm(host, &record.id);
            }
            pending
        }
        .boxed()
    }

    fn closed(&self, host: &Arc<Namespace>, id: &str, pending: bool) {
        if !host.control.fires_evicted_alarms() {
            return;
        }
        // Locally nobody else wakes an instance that left with tray work
        // pending (an abort mid-dispatch): wake it after a sweep interval.
        if pending && !host.is_shut_down() && !host.leaving() {
            let period = host.options.sweep_interval;
            let (host, id) = (host.clone(), id.to_owned());
            spawn_detached(&host.domain.clone(), async move {
                tokio::time::sleep(period).await;
                if !host.is_shut_down() && !host.is_resident(&id) {
                    tray::wake::wake(&host, &id).await;
                }
            });
        }
    }

    fn started(&self, host: &Arc<Namespace>) {
        // No pinboard sweeper wakes instances whose rows claim work: the
        // worker does, once at start.
        if host.control.fires_evicted_alarms() && !self.declared.is_empty() {
            spawn_detached(&host.domain, tray::wake::wake_marked(host.clone()));
        }
    }

    fn shut_down(&self) {
        self.timers.retain(|_, timer| {
            timer.abort();
            false
        });
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Aborts the instance of `slot` when `error` is a lost fence: a newer
/// activation owns its rows.
pub(crate) fn abort_on_fence_lost(slot: &Arc<Record>, error: &StoreError) {
    if error.is_fence_lost() {
        tracing::warn!(namespace = %slot.host.ns, id = %slot.id, error = %pinned_edge::logging::Chain(&error), "store fence lost; aborting the instance");
        Namespace::abort(slot);
    }
}

/// The durable parts of an instance's context.
impl Context {
    /// The instance's durable rows, `None` when the worker has no store.
    pub fn store(&self) -> Option<InstanceStore> {
        self.slot()
            .host
            .store
            .clone()
            .map(|store| InstanceStore::new(store, self.slot().clone()))
    }

    /// The singleton tray `T` (declared with
    /// [`Trays::singleton`](crate::durable::tray::Trays::singleton)). Open from the
    /// activation on; usable in [`Object::activate`](crate::Object::activate)
    /// too (it opens there).
    ///
    /// # Errors
    ///
    /// [`TrayError::NoStore`](crate::durable::tray::TrayError::NoStore),
    /// [`TrayError::NotDeclared`](crate::durable::tray::TrayError::NotDeclared), a row
    /// that does not restore, a store failure.
    pub async fn tray<T: crate::durable::tray::Tray>(
        &self,
    ) -> Result<crate::durable::tray::TrayHandle<T>, crate::durable::tray::TrayError> {
        let trays = self.trays()?;
        trays
            .obtain::<T>(crate::durable::tray::SINGLETON_ID, false, true)
            .await
            .map(crate::durable::tray::TrayHandle::new)
    }

    /// The keyed trays of type `T` (declared with
    /// [`Trays::keyed`](crate::durable::tray::Trays::keyed)).
    ///
    /// # Errors
    ///
    /// [`TrayError::NoStore`](crate::durable::tray::TrayError::NoStore),
    /// [`TrayError::NotDeclared`](crate::durable::tray::TrayError::NotDeclared).
    pub fn keyed<T: crate::durable::tray::Tray>(
        &self,
    ) -> Result<crate::durable::tray::KeyedTrays<T>, crate::durable::tray::TrayError> {
        let trays = self.trays()?;
        if let Some(durable) = Durable::of(&self.slot().host) {
            durable.declared.of::<T>(true)?;
        }
        Ok(crate::durable::tray::KeyedTrays::new(trays))
    }

    fn trays(
        &self,
    ) -> Result<Arc<crate::durable::tray::InstanceTrays>, crate::durable::tray::TrayError> {
        let Some(durable) = Durable::of(&self.slot().host) else {
            return Err(crate::durable::tray::TrayError::NoStore);
        };
        crate::durable::tray::InstanceTrays::of(self.slot()).ok_or_else(|| {
            if durable.declared.is_empty() {
                crate::durable::tray::TrayError::NotDeclared("(none declared)")
            } else {
                crate::durable::tray::TrayError::Closed
            }
        })
    }

    /// The instance's alarm (`set`, `get`).
    pub fn alarm(&self) -> Alarm {
        Alarm::new(self.slot().clone())
    }

    /// The named schedule `name`: one of many durable timers of the
    /// instance (`at`, `after`, `cancel`, `get`), each firing
    /// [`Object::scheduled`](crate::Object::scheduled) at least once.
    pub fn schedule(&self, name: &str) -> crate::durable::alarm::Schedule {
        crate::durable::alarm::Schedule::new(self.slot().clone(), name)
    }

    /// Every named schedule of the instance with its time, earliest first.
    ///
    /// # Errors
    ///
    /// No store, a store failure.
    pub async fn schedules(
        &self,
    ) -> Result<Vec<(String, std::time::SystemTime)>, crate::durable::alarm::AlarmError> {
        crate::durable::alarm::schedules(self.slot()).await
    }
}
