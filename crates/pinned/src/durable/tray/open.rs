//! [`InstanceTrays`]: the trays one instance has open, how they are opened
//! (from a row, or fresh) and hydrated at activation, and how they are
//! settled at teardown.
//!
//! At activation the marked rows (read before the object activated, with
//! the id's pause row: `StateStore::list_marked_and`) plus one
//! `list(tray_ns)` per always-open keyed type are every row to open; a
//! marked row with no declaration, or of the other kind, fails the
//! activation. Openings are
//! serialized per instance (they are rare, a store read each), so a key is
//! never open twice. This module owns the open map and nothing else: the
//! pump and the write path live with the tray, which reaches back to the
//! map only as the [`OpenMap`] in the [`TrayEnv`] built here once.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use pinned_store::{Doc, InstanceKey, StateStore, TrayKey, TrayRow};

use super::env::{OpenMap, TrayEnv};
use super::frontier::Frontier;
use super::machine::OpenTray;
use super::opened::Opened;
use super::spec::{Declared, Spec};
use super::{Tray, TrayError, SINGLETON_ID};
use crate::namespace::context::Context;
use crate::namespace::Record;

type Key = (&'static str, String);

/// The open trays of one instance.
pub(crate) struct InstanceTrays {
    /// Weak on purpose: the slot holds its trays strongly (until the end of
    /// its teardown), so a strong pointer back would make a cycle that
    /// keeps a record alive whenever a teardown is cut short.
    slot: Weak<Record>,
    declared: Arc<Declared>,
    store: Arc<dyn StateStore>,
    frontier: Arc<Frontier>,
    /// What every tray opened here is given: the slot, the frontier and
    /// this map.
    env: TrayEnv,
    open: Mutex<HashMap<Key, Arc<dyn Opened>>>,
    opening: tokio::sync::Mutex<()>,
    /// The marked rows the activation read, until [`hydrate`](Self::hydrate)
    /// opens them.
    marked: Mutex<Vec<TrayRow>>,
}

impl InstanceTrays {
    /// The open trays hung on `record`, if any.
    pub(crate) fn of(record: &Record) -> Option<Arc<InstanceTrays>> {
        record.trays()?.downcast().ok()
    }

    /// Takes the open trays off a `record` that is leaving.
    pub(crate) fn take(record: &Record) -> Option<Arc<InstanceTrays>> {
        record.take_trays()?.downcast().ok()
    }

    /// The trays of `slot`, whose marked rows the activation read (`marked`).
    pub(crate) fn new(
        slot: &Arc<Record>,
        declared: Arc<Declared>,
        store: Arc<dyn StateStore>,
        marked: Vec<TrayRow>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|map: &Weak<InstanceTrays>| {
            let frontier = Arc::new(Frontier::new(store.clone(), Arc::downgrade(slot)));
            Self {
                slot: Arc::downgrade(slot),
                env: TrayEnv {
                    slot: Arc::downgrade(slot),
                    frontier: frontier.clone(),
                    store: store.clone(),
                    map: map.clone(),
                },
                frontier,
                declared,
                store,
                open: Mutex::new(HashMap::new()),
                opening: tokio::sync::Mutex::new(()),
                marked: Mutex::new(marked),
            }
        })
    }

    fn slot(&self) -> Result<Arc<Record>, TrayError> {
        self.slot.upgrade().ok_or(TrayError::Closed)
    }

    /// Passes a store answer through, aborting the instance on a lost fence.
    fn fenced<R>(
        slot: &Arc<Record>,
        answer: Result<R, pinned_store::StoreError>,
    ) -> Result<R, TrayError> {
        answer.map_err(|error| {
            crate::durable::abort_on_fence_lost(slot, &error);
            TrayError::Store(error)
        })
    }

    /// The open tray `tray_ns` under `key` for the operator's controls,
    /// whatever its type; `None` when it is not open (or deleted).
    pub(crate) fn operated(
        &self,
        tray_ns: &str,
        key: &str,
    ) -> Option<Arc<dyn super::operate::Operated>> {
        let open = self.open.lock();
        let (_, opened) = open
            .iter()
            .find(|((name, open_key), _)| *name == tray_ns && open_key == key)?;
        (!opened.deleted()).then(|| opened.clone().operated())
    }

    fn lookup<T: Tray>(&self, key: &str) -> Option<Arc<OpenTray<T>>> {
        let opened = self.open.lock().get(&(T::NAME, key.to_owned())).cloned()?;
        if opened.deleted() {
            return None;
        }
        opened.any().downcast::<OpenTray<T>>().ok()
    }

    /// The open tray `T` under `key`, opening it from its row (or fresh when
    /// `create`) when it is not open.
    pub(crate) async fn obtain<T: Tray>(
        self: &Arc<Self>,
        key: &str,
        keyed: bool,
        create: bool,
    ) -> Result<Arc<OpenTray<T>>, TrayError> {
        let spec = self.declared.of::<T>(keyed)?;
        if keyed && key.is_empty() {
            return Err(TrayError::EmptyKey);
        }
        if let Some(open) = self.lookup::<T>(key) {
            return Ok(open);
        }
        self.obtain_spec(spec, key, create)
            .await?
            .any()
            .downcast::<OpenTray<T>>()
            .map_err(|_| TrayError::NotDeclared(T::NAME))
    }

    /// [`obtain`](Self::obtain) of the declaration `spec`, erased.
    async fn obtain_spec(
        &self,
        spec: &Spec,
        key: &str,
        create: bool,
    ) -> Result<Arc<dyn Opened>, TrayError> {
        let _opening = self.opening.lock().await;
        // A delete under way finishes before the key opens again.
        let open = self.open.lock().get(&(spec.name, key.to_owned())).cloned();
        if let Some(open) = open {
            if !open.deleted() {
                return Ok(open);
            }
            open.freed().await;
        }
        let slot = self.slot()?;
        // Read this instance's own writes: a tray that passivated a moment
        // ago may have its last row image still on the way.
        self.frontier.receipt().await?;
        let epoch = slot.epoch().unwrap_or(0);
        let row = Self::fenced(
            &slot,
            self.store
                .get_tray(
                    InstanceKey::new(&slot.host.ns, &slot.id),
                    TrayKey::new(spec.name, key),
                    epoch,
                )
                .await,
        )?;
        if row.is_none() && !create {
            return Err(TrayError::NotFound {
                tray: spec.name,
                key: key.to_owned(),
            });
        }
        let opened = self
            .insert(spec, key.to_owned(), row.map(|row| (row.marked, row.doc)))
            .await?;
        drop(_opening);
        self.open_hooked(spec.name, key, &opened).await?;
        Ok(opened)
    }

    /// Restores a tray into the map, with what it keeps in rows of its own
    /// read back; [`open_hooked`](Self::open_hooked) then opens it for use.
    async fn insert(
        &self,
        spec: &Spec,
        key: String,
        row: Option<(bool, Doc)>,
    ) -> Result<Arc<dyn Opened>, TrayError> {
        let opened = (spec.open)(&self.env, spec, key.clone(), row)?;
        opened.clone().load().await?;
        self.open.lock().insert((spec.name, key), opened.clone());
        Ok(opened)
    }

    /// Runs `tray`'s `on_open` and starts its pump, once the object exists
    /// (inside `Object::activate` it waits for the hydration that follows).
    /// Never under the opening lock: a hook may open other trays. A failed
    /// hook takes the tray out of the map again.
    async fn open_hooked(
        &self,
        name: &'static str,
        key: &str,
        tray: &Arc<dyn Opened>,
    ) -> Result<(), TrayError> {
        let slot = self.slot()?;
        let Some(instance) = slot.instance() else {
            return Ok(());
        };
        if let Err(error) = tray
            .clone()
            .open(instance, Context::new(slot.clone()))
            .await
        {
            self.forget(name, key, Arc::as_ptr(tray).cast::<()>());
            return Err(error);
        }
        Ok(())
    }

    fn all(&self) -> Vec<Arc<dyn Opened>> {
        self.open.lock().values().cloned().collect()
    }

    /// Runs every open tray's `on_close`: the instance is being torn down.
    pub(crate) async fn close_all(&self) {
        let Ok(slot) = self.slot() else {
            return;
        };
        let Some(instance) = slot.instance() else {
            return;
        };
        for tray in self.all() {
            tray.close(instance.clone(), Context::new(slot.clone()))
                .await;
        }
    }

    /// Opens every marked row and every always-open tray, starting their
    /// pumps: the activation's share of the trays. A marked row is the
    /// instance's own to change, so the rows read before the object
    /// activated are still its rows: a tray the object opened meanwhile is
    /// open already and skipped.
    pub(crate) async fn hydrate(self: &Arc<Self>) -> Result<(), TrayError> {
        let slot = self.slot()?;
        let epoch = slot.epoch().unwrap_or(0);
        let (ns, id) = (&slot.host.ns, &slot.id);
        let mut rows = std::mem::take(&mut *self.marked.lock());
        for spec in &self.declared.specs {
            if spec.always_open && spec.keyed {
                rows.extend(Self::fenced(
                    &slot,
                    self.store
                        .list(InstanceKey::new(ns, id), epoch, Some(spec.name), None)
                        .await,
                )?);
            }
        }
        let _opening = self.opening.lock().await;
        let mut opened: Vec<Key> = Vec::new();
        for row in rows {
            let Some(spec) = self.declared.by_name(&row.tray_ns) else {
                return Err(TrayError::Malformed {
                    tray: row.tray_ns,
                    key: row.tray_id,
                    reason: "a marked row with no matching tray declaration on this object"
                        .to_owned(),
                });
            };
            let wrong_kind = if spec.keyed {
                row.tray_id.is_empty()
            } else {
                row.tray_id != SINGLETON_ID
            };
            if wrong_kind {
                return Err(TrayError::Malformed {
                    tray: row.tray_ns,
                    key: row.tray_id,
                    reason: format!(
                        "the row does not fit the declared {} tray",
                        if spec.keyed { "keyed" } else { "singleton" }
                    ),
                });
            }
            let key: Key = (spec.name, row.tray_id);
            if opened.contains(&key) || self.open.lock().contains_key(&key) {
                continue;
            }
            self.insert(spec, key.1.clone(), Some((row.marked, row.doc)))
                .await?;
            opened.push(key);
        }
        for spec in &self.declared.specs {
            let key: Key = (spec.name, SINGLETON_ID.to_owned());
            if spec.keyed || self.open.lock().contains_key(&key) {
                continue;
            }
            let row = Self::fenced(
                &slot,
                self.store
                    .get_tray(
                        InstanceKey::new(ns, id),
                        TrayKey::singleton(spec.name),
                        epoch,
                    )
                    .await,
            )?;
            self.insert(spec, key.1, row.map(|row| (row.marked, row.doc)))
                .await?;
        }
        drop(_opening);
        // Every tray restored here, and those opened inside
        // `Object::activate` before the object existed, open now.
        let open: Vec<(Key, Arc<dyn Opened>)> = self
            .open
            .lock()
            .iter()
            .map(|(key, tray)| (key.clone(), tray.clone()))
            .collect();
        for ((name, key), tray) in open {
            self.open_hooked(name, &key, &tray).await?;
        }
        Ok(())
    }

    /// The keys of the open trays of type `T`.
    pub(crate) fn keys<T: Tray>(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .open
            .lock()
            .keys()
            .filter(|(name, _)| *name == T::NAME)
            .map(|(_, key)| key.clone())
            .collect();
        keys.sort_unstable();
        keys
    }

    /// Whether an open tray holds marked work a pump could still do.
    pub(crate) fn pending(&self) -> bool {
        // Never a tray's lock under the map's: passivation takes them the
        // other way round.
        self.all().iter().any(|tray| tray.pending())
    }

    /// Waits until every effect enlisted so far is in the store.
    pub(crate) async fn settle(&self) {
        let receipt = self.frontier.receipt();
        if let Err(error) = receipt.await {
            tracing::warn!(error = %pinned_edge::logging::Chain(&error), "tray effects did not all land before teardown");
        }
    }
}

impl OpenMap for InstanceTrays {
    fn resolve(
        self: Arc<Self>,
        name: String,
        key: String,
    ) -> futures_util::future::BoxFuture<'static, Result<Option<Arc<dyn Opened>>, TrayError>> {
        Box::pin(async move {
            let Some(spec) = self.declared.by_name(&name) else {
                return Ok(None);
            };
            match self.obtain_spec(spec, &key, false).await {
                Ok(open) => Ok(Some(open)),
                Err(TrayError::NotFound { .. }) => Ok(None),
                Err(error) => Err(error),
            }
        })
    }

    fn forget(&self, name: &'static str, key: &str, tray: *const ()) {
        let mut open = self.open.lock();
        let entry = (name, key.to_owned());
        if open
            .get(&entry)
            .is_some_and(|current| Arc::as_ptr(current).cast::<()>() == tray)
        {
            open.remove(&entry);
        }
    }

    fn passivate(&self, name: &'static str, key: &str, tray: *const (), holders: usize) -> bool {
        let mut open = self.open.lock();
        let entry = (name, key.to_owned());
        let Some(current) = open.get(&entry) else {
            return false;
        };
        // Only the tray asking, not one reopened under its key since.
        if Arc::as_ptr(current).cast::<()>() != tray {
            return false;
        }
        // Lock order: a tray's state lock, then this map's (the pump
        // passivates under its tray's lock).
        if Arc::strong_count(current) > holders {
            return false;
        }
        open.remove(&entry);
        true
    }
}
