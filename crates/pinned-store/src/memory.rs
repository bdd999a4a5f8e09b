//! `MemoryStore`: the in-process `StateStore` for tests and single-process experiments.
//!
//! Owns a map of instances to (epoch, rows) behind one lock. It must never await while
//! holding that lock, and it keeps nothing across a restart.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use parking_lot::Mutex;

use crate::store::{alarm_at, alarm_nonce, check_epoch};
use crate::{
    BatchOp, Doc, DueAlarm, InstanceKey, MarkedInstance, Peek, PeekedRow, StateStore, StoreError,
    Tray, TrayKey, TrayRow, WorldStamp, ALARM_TRAY,
};

/// A `StateStore` held in memory. Cheap to create; every operation completes without
/// awaiting. State is lost when the store is dropped.
#[derive(Debug, Default)]
pub struct MemoryStore {
    instances: Mutex<HashMap<(String, String), Instance>>,
}

#[derive(Debug, Default)]
struct Instance {
    epoch: u64,
    trays: BTreeMap<(String, String), (bool, Doc)>,
}

// === impl MemoryStore ===

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fences `instance` at `epoch` and runs `f` on it under the lock.
    fn with_instance<R>(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
        f: impl FnOnce(&mut Instance) -> R,
    ) -> Result<R, StoreError> {
        check_epoch(epoch)?;
        let mut instances = self.instances.lock();
        let key = (instance.ns.to_owned(), instance.id.to_owned());
        let stored = instances.get(&key).map_or(0, |i| i.epoch);
        if epoch < stored {
            return Err(StoreError::fence_lost(instance, epoch));
        }
        let instance = instances.entry(key).or_default();
        instance.epoch = epoch;
        Ok(f(instance))
    }
}

fn tray_key(tray: TrayKey<'_>) -> (String, String) {
    (tray.tray_ns.to_owned(), tray.tray_id.to_owned())
}

#[async_trait]
impl StateStore for MemoryStore {
    async fn set_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        marked: bool,
        doc: Doc,
        epoch: u64,
    ) -> Result<(), StoreError> {
        self.with_instance(instance, epoch, |i| {
            i.trays.insert(tray_key(tray), (marked, doc));
        })
    }

    async fn delete_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        self.with_instance(instance, epoch, |i| {
            i.trays.remove(&tray_key(tray));
        })
    }

    async fn get_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        epoch: u64,
    ) -> Result<Option<Tray>, StoreError> {
        self.with_instance(instance, epoch, |i| {
            i.trays.get(&tray_key(tray)).map(|(marked, doc)| Tray {
                marked: *marked,
                doc: doc.clone(),
            })
        })
    }

    async fn list(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
        tray_ns: Option<&str>,
        marked: Option<bool>,
    ) -> Result<Vec<TrayRow>, StoreError> {
        self.with_instance(instance, epoch, |i| {
            i.trays
                .iter()
                .filter(|((t_ns, _), (m, _))| {
                    tray_ns.is_none_or(|want| want == t_ns) && marked.is_none_or(|want| want == *m)
                })
                .map(|((t_ns, t_id), (m, doc))| TrayRow {
                    tray_ns: t_ns.clone(),
                    tray_id: t_id.clone(),
                    marked: *m,
                    doc: doc.clone(),
                })
                .collect()
        })
    }

    async fn delete_instance(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        self.with_instance(instance, epoch, |i| i.trays.clear())
    }

    async fn apply_batch(
        &self,
        instance: InstanceKey<'_>,
        ops: Vec<BatchOp>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        // Decoded before the fence, so nothing below it can fail: applying in place is
        // all-or-nothing.
        let mut decoded = Vec::with_capacity(ops.len());
        for op in ops {
            decoded.push(match op {
                BatchOp::Set {
                    tray_ns,
                    tray_id,
                    marked,
                    doc,
                } => {
                    let doc = doc.to_doc().map_err(|e| StoreError::Corrupt {
                        key: format!("{}/{} {tray_ns}/{tray_id}", instance.ns, instance.id),
                        detail: format!("the document does not decode: {e}"),
                    })?;
                    ((tray_ns, tray_id), Some((marked, doc)))
                }
                BatchOp::Delete { tray_ns, tray_id } => ((tray_ns, tray_id), None),
            });
        }
        self.with_instance(instance, epoch, |i| {
            for (key, image) in decoded {
                match image {
                    Some(image) => {
                        i.trays.insert(key, image);
                    }
                    None => {
                        i.trays.remove(&key);
                    }
                }
            }
        })
    }

    async fn due_alarms(&self, due_by_ms: i64, limit: usize) -> Result<Vec<DueAlarm>, StoreError> {
        let alarm = tray_key(ALARM_TRAY);
        let mut due: Vec<DueAlarm> = {
            let instances = self.instances.lock();
            instances
                .iter()
                .filter_map(|((ns, id), instance)| {
                    let (_, doc) = instance.trays.get(&alarm)?;
                    let at = alarm_at(doc).filter(|at| *at <= due_by_ms)?;
                    Some(DueAlarm {
                        ns: ns.clone(),
                        id: id.clone(),
                        at,
                        nonce: alarm_nonce(doc),
                        world: WorldStamp::any(),
                    })
                })
                .collect()
        };
        due.sort_by(|a, b| (a.at, &a.ns, &a.id).cmp(&(b.at, &b.ns, &b.id)));
        due.truncate(limit);
        Ok(due)
    }

    async fn marked_instances(
        &self,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<MarkedInstance>, StoreError> {
        let mut marked: Vec<(String, String)> = {
            let instances = self.instances.lock();
            instances
                .iter()
                .filter(|((ns, id), instance)| {
                    after.is_none_or(|after| (ns.as_str(), id.as_str()) > after)
                        && instance.trays.values().any(|(marked, _)| *marked)
                })
                .map(|(key, _)| key.clone())
                .collect()
        };
        // `String` orders by bytes, as the SQL stores do.
        marked.sort_unstable();
        marked.truncate(limit);
        // This store has no world options: every row is the single world's.
        Ok(marked
            .into_iter()
            .map(|(ns, id)| MarkedInstance {
                ns,
                id,
                world: WorldStamp::any(),
            })
            .collect())
    }

    async fn instance_ids(
        &self,
        ns: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let mut ids: Vec<String> = {
            let instances = self.instances.lock();
            instances
                .iter()
                .filter(|((i_ns, id), instance)| {
                    i_ns == ns
                        && after.is_none_or(|after| id.as_str() > after)
                        && !instance.trays.is_empty()
                })
                .map(|((_, id), _)| id.clone())
                .collect()
        };
        ids.sort_unstable();
        ids.truncate(limit);
        Ok(ids)
    }

    async fn peek(&self, instance: InstanceKey<'_>) -> Result<Peek, StoreError> {
        let instances = self.instances.lock();
        let key = (instance.ns.to_owned(), instance.id.to_owned());
        let Some(stored) = instances.get(&key) else {
            return Ok(Peek::default());
        };
        Ok(Peek {
            epoch: Some(stored.epoch),
            rows: stored
                .trays
                .iter()
                .map(|((tray_ns, tray_id), (marked, doc))| PeekedRow {
                    row: TrayRow {
                        tray_ns: tray_ns.clone(),
                        tray_id: tray_id.clone(),
                        marked: *marked,
                        doc: doc.clone(),
                    },
                    world: WorldStamp::any(),
                })
                .collect(),
        })
    }

    async fn reclaim_fences(&self, below_epoch: u64, limit: usize) -> Result<u64, StoreError> {
        let mut instances = self.instances.lock();
        let doomed: Vec<(String, String)> = instances
            .iter()
            .filter(|(_, i)| i.trays.is_empty() && i.epoch < below_epoch)
            .map(|(key, _)| key.clone())
            .take(limit)
            .collect();
        for key in &doomed {
            instances.remove(key);
        }
        Ok(doomed.len() as u64)
    }
}
