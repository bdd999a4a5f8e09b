//! [`InstanceStore`]: the instance's view of the worker's `StateStore`,
//! bound to its `(ns, id)` and writing at its placement epoch.
//!
//! It refuses instance writes to the reserved tray namespace `pinned`
//! (the alarm row lives there) and otherwise passes straight through; it
//! never caches. A lost fence aborts the instance, so memory never runs
//! ahead of the store. It also owns the typed view of a tray ([`InstanceStore::get`],
//! [`InstanceStore::put`]): a doc (always a JSON object) to and from any serde
//! type.

use std::sync::Arc;

use pinned_store::{BatchOp, Doc, InstanceKey, StateStore, StoreError, Tray, TrayKey, TrayRow};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::namespace::Record;

/// The tray namespace reserved for the worker's own rows (alarms).
pub const RESERVED_TRAY_NS: &str = "pinned";

/// Why an instance store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InstanceStoreError {
    /// Instance code may not write the reserved tray namespace `pinned`.
    #[error("tray namespace {0:?} is reserved for pinned itself")]
    Reserved(String),
    /// The store refused or failed (a `FenceLost` means a newer activation
    /// owns the instance: this one has been aborted).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// [`InstanceStore::get`]: the stored doc does not deserialize as the
    /// requested type.
    #[error("tray {tray_ns}/{tray_id} does not decode as the requested type: {source}")]
    Decode {
        /// The tray namespace read.
        tray_ns: String,
        /// The tray id read.
        tray_id: String,
        /// Why deserializing failed.
        #[source]
        source: serde_json::Error,
    },
    /// [`InstanceStore::put`]: the value failed to serialize to JSON.
    #[error("value for tray {tray_ns}/{tray_id} does not serialize: {source}")]
    Encode {
        /// The tray namespace written.
        tray_ns: String,
        /// The tray id written.
        tray_id: String,
        /// Why serializing failed.
        #[source]
        source: serde_json::Error,
    },
    /// [`InstanceStore::put`]: the value serialized to JSON other than an
    /// object; a tray doc is always a JSON object.
    #[error("tray {tray_ns}/{tray_id} doc must be a JSON object, got {kind}")]
    NotAnObject {
        /// The tray namespace written.
        tray_ns: String,
        /// The tray id written.
        tray_id: String,
        /// The JSON kind the value serialized to: `"null"`, `"boolean"`,
        /// `"number"`, `"string"` or `"array"`.
        kind: &'static str,
    },
}

/// The instance's durable rows. Get it from
/// [`Context::store`](crate::Context::store).
#[derive(Clone)]
pub struct InstanceStore {
    store: Arc<dyn StateStore>,
    slot: Arc<Record>,
}

impl std::fmt::Debug for InstanceStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceStore")
            .field("ns", &self.slot.host.ns)
            .field("id", &self.slot.id)
            .finish()
    }
}

fn writable(tray_ns: &str) -> Result<(), InstanceStoreError> {
    if tray_ns == RESERVED_TRAY_NS {
        return Err(InstanceStoreError::Reserved(tray_ns.to_owned()));
    }
    Ok(())
}

/// The name of a JSON value's kind, as [`InstanceStoreError::NotAnObject`]
/// reports it.
fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `value` as the doc of tray `(tray_ns, tray_id)`: it must serialize to a
/// JSON object.
fn to_doc<T: Serialize + ?Sized>(
    tray_ns: &str,
    tray_id: &str,
    value: &T,
) -> Result<Doc, InstanceStoreError> {
    match serde_json::to_value(value) {
        Ok(Value::Object(doc)) => Ok(doc),
        Ok(other) => Err(InstanceStoreError::NotAnObject {
            tray_ns: tray_ns.to_owned(),
            tray_id: tray_id.to_owned(),
            kind: json_kind(&other),
        }),
        Err(source) => Err(InstanceStoreError::Encode {
            tray_ns: tray_ns.to_owned(),
            tray_id: tray_id.to_owned(),
            source,
        }),
    }
}

/// The doc of tray `(tray_ns, tray_id)` as a `T`.
fn from_doc<T: DeserializeOwned>(
    tray_ns: &str,
    tray_id: &str,
    doc: Doc,
) -> Result<T, InstanceStoreError> {
    serde_json::from_value(Value::Object(doc)).map_err(|source| InstanceStoreError::Decode {
        tray_ns: tray_ns.to_owned(),
        tray_id: tray_id.to_owned(),
        source,
    })
}

impl InstanceStore {
    pub(crate) fn new(store: Arc<dyn StateStore>, slot: Arc<Record>) -> Self {
        Self { store, slot }
    }

    /// The epoch every operation carries: the instance's placement epoch,
    /// 0 before any admitted epoch (local mode).
    pub fn epoch(&self) -> u64 {
        self.slot.epoch().unwrap_or(0)
    }

    /// The instance this store reads and writes, as the store names it.
    fn instance(&self) -> InstanceKey<'_> {
        InstanceKey::new(&self.slot.host.ns, &self.slot.id)
    }

    /// Passes a store answer through; a lost fence first aborts the
    /// instance: a newer activation owns its rows, so this one's memory
    /// must not run ahead of the store (its in-flight requests answer 503
    /// `instance aborted`, and the next request activates afresh from the
    /// rows).
    fn fenced<T>(&self, answer: Result<T, StoreError>) -> Result<T, InstanceStoreError> {
        answer.map_err(|error| {
            crate::durable::abort_on_fence_lost(&self.slot, &error);
            InstanceStoreError::Store(error)
        })
    }

    /// Upserts tray `(tray_ns, tray_id)`.
    ///
    /// # Errors
    ///
    /// The reserved namespace, a lost fence, a store failure.
    pub async fn set_tray(
        &self,
        tray_ns: &str,
        tray_id: &str,
        marked: bool,
        doc: Doc,
    ) -> Result<(), InstanceStoreError> {
        writable(tray_ns)?;
        let written = self
            .store
            .set_tray(
                self.instance(),
                TrayKey::new(tray_ns, tray_id),
                marked,
                doc,
                self.epoch(),
            )
            .await;
        self.fenced(written)
    }

    /// Deletes tray `(tray_ns, tray_id)`.
    ///
    /// # Errors
    ///
    /// The reserved namespace, a lost fence, a store failure.
    pub async fn delete_tray(
        &self,
        tray_ns: &str,
        tray_id: &str,
    ) -> Result<(), InstanceStoreError> {
        writable(tray_ns)?;
        let deleted = self
            .store
            .delete_tray(
                self.instance(),
                TrayKey::new(tray_ns, tray_id),
                self.epoch(),
            )
            .await;
        self.fenced(deleted)
    }

    /// Reads tray `(tray_ns, tray_id)`.
    ///
    /// # Errors
    ///
    /// A lost fence, a store failure.
    pub async fn get_tray(
        &self,
        tray_ns: &str,
        tray_id: &str,
    ) -> Result<Option<Tray>, InstanceStoreError> {
        let read = self
            .store
            .get_tray(
                self.instance(),
                TrayKey::new(tray_ns, tray_id),
                self.epoch(),
            )
            .await;
        self.fenced(read)
    }

    /// Reads tray `(tray_ns, tray_id)` and deserializes its doc as a `T`;
    /// `None` when the tray is absent. Whether it is marked is not reported
    /// (use [`get_tray`](Self::get_tray) for that).
    ///
    /// ```no_run
    /// # async fn demo(ctx: pinned::Context) -> Result<(), pinned::InstanceStoreError> {
    /// #[derive(serde::Deserialize)]
    /// struct Profile {
    ///     name: String,
    /// }
    ///
    /// if let Some(store) = ctx.store() {
    ///     let profile: Option<Profile> = store.get("profile", "~").await?;
    ///     println!("{:?}", profile.map(|p| p.name));
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`InstanceStoreError::Decode`] when the doc does not deserialize as a
    /// `T`; a lost fence, a store failure.
    pub async fn get<T: DeserializeOwned>(
        &self,
        tray_ns: &str,
        tray_id: &str,
    ) -> Result<Option<T>, InstanceStoreError> {
        self.get_tray(tray_ns, tray_id)
            .await?
            .map(|tray| from_doc(tray_ns, tray_id, tray.doc))
            .transpose()
    }

    /// Serializes `value` as the doc of tray `(tray_ns, tray_id)` and upserts
    /// it unmarked (at rest); [`put_marked`](Self::put_marked) chooses.
    ///
    /// ```no_run
    /// # async fn demo(ctx: pinned::Context) -> Result<(), pinned::InstanceStoreError> {
    /// #[derive(serde::Serialize)]
    /// struct Profile {
    ///     name: String,
    /// }
    ///
    /// if let Some(store) = ctx.store() {
    ///     let profile = Profile { name: "Ada".into() };
    ///     store.put("profile", "~", &profile).await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The reserved namespace; [`InstanceStoreError::NotAnObject`] when
    /// `value` serializes to anything but a JSON object (a tray doc always is
    /// one), [`InstanceStoreError::Encode`] when it fails to serialize; a lost
    /// fence, a store failure.
    pub async fn put<T: Serialize + ?Sized>(
        &self,
        tray_ns: &str,
        tray_id: &str,
        value: &T,
    ) -> Result<(), InstanceStoreError> {
        self.put_marked(tray_ns, tray_id, false, value).await
    }

    /// As [`put`](Self::put), with the row's `marked` flag given: `true`
    /// while the tray holds in-flight work.
    ///
    /// ```no_run
    /// # async fn demo(ctx: pinned::Context) -> Result<(), pinned::InstanceStoreError> {
    /// if let Some(store) = ctx.store() {
    ///     let job = serde_json::json!({ "step": 1 });
    ///     store.put_marked("jobs", "export", true, &job).await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`put`](Self::put).
    pub async fn put_marked<T: Serialize + ?Sized>(
        &self,
        tray_ns: &str,
        tray_id: &str,
        marked: bool,
        value: &T,
    ) -> Result<(), InstanceStoreError> {
        writable(tray_ns)?;
        let doc = to_doc(tray_ns, tray_id, value)?;
        self.set_tray(tray_ns, tray_id, marked, doc).await
    }

    /// Every row of the instance, filtered (ANDed), ordered by
    /// `(tray_ns, tray_id)`.
    ///
    /// # Errors
    ///
    /// A lost fence, a store failure.
    pub async fn list(
        &self,
        tray_ns: Option<&str>,
        marked: Option<bool>,
    ) -> Result<Vec<TrayRow>, InstanceStoreError> {
        let rows = self
            .store
            .list(self.instance(), self.epoch(), tray_ns, marked)
            .await;
        self.fenced(rows)
    }

    /// Deletes every row of the instance at once: its trays and its alarm
    /// (whose timer is dropped too). The instance's epoch stays, so an older
    /// owner still cannot write. What is in memory is the object's to clear.
    ///
    /// # Errors
    ///
    /// A lost fence, a store failure.
    pub async fn delete_all(&self) -> Result<(), InstanceStoreError> {
        let deleted = self
            .store
            .delete_instance(self.instance(), self.epoch())
            .await;
        self.fenced(deleted)?;
        crate::durable::alarm::disarm(&self.slot.host, &self.slot.id);
        Ok(())
    }

    /// Applies `ops` atomically, in order.
    ///
    /// # Errors
    ///
    /// An op in the reserved namespace, a lost fence, a store failure.
    pub async fn apply_batch(&self, ops: Vec<BatchOp>) -> Result<(), InstanceStoreError> {
        for op in &ops {
            writable(op.key().tray_ns)?;
        }
        let applied = self
            .store
            .apply_batch(self.instance(), ops, self.epoch())
            .await;
        self.fenced(applied)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::ser::Error as _;
    use serde_json::json;

    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Profile {
        name: String,
        visits: u32,
    }

    /// Refuses to serialize.
    struct Broken;

    impl Serialize for Broken {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(S::Error::custom("broken on purpose"))
        }
    }

    #[test]
    fn objects_become_docs_and_back() {
        let profile = Profile {
            name: "Ada".into(),
            visits: 3,
        };
        let doc = to_doc("p", "~", &profile).expect("a struct is an object");
        assert_eq!(
            Value::Object(doc.clone()),
            json!({"name": "Ada", "visits": 3})
        );
        let back: Profile = from_doc("p", "~", doc).expect("round trip");
        assert_eq!(back, profile);

        let map = BTreeMap::from([("k", 1)]);
        assert!(to_doc("p", "~", &map).is_ok());
        assert!(to_doc("p", "~", &json!({})).is_ok());
    }

    #[test]
    fn anything_but_an_object_names_its_kind() {
        let kind = |err: InstanceStoreError| match err {
            InstanceStoreError::NotAnObject {
                tray_ns,
                tray_id,
                kind,
            } => {
                assert_eq!((tray_ns.as_str(), tray_id.as_str()), ("t", "i"));
                kind
            }
            other => panic!("expected NotAnObject, got {other:?}"),
        };
        let err = |r: Result<Doc, InstanceStoreError>| r.expect_err("not an object");
        assert_eq!(kind(err(to_doc("t", "i", &[1, 2]))), "array");
        assert_eq!(kind(err(to_doc("t", "i", "text"))), "string");
        assert_eq!(kind(err(to_doc("t", "i", &7))), "number");
        assert_eq!(kind(err(to_doc("t", "i", &true))), "boolean");
        assert_eq!(kind(err(to_doc("t", "i", &()))), "null");
        assert_eq!(kind(err(to_doc("t", "i", &None::<Profile>))), "null");

        let text = err(to_doc("t", "i", &[1])).to_string();
        assert_eq!(text, "tray t/i doc must be a JSON object, got array");
    }

    #[test]
    fn serialization_failure_is_encode() {
        match to_doc("t", "i", &Broken) {
            Err(InstanceStoreError::Encode { source, .. }) => {
                assert!(source.to_string().contains("broken on purpose"))
            }
            other => panic!("expected Encode, got {other:?}"),
        }
    }

    #[test]
    fn a_doc_of_the_wrong_shape_is_decode() {
        let doc = to_doc("t", "i", &json!({"name": 5})).expect("object");
        match from_doc::<Profile>("t", "i", doc) {
            Err(InstanceStoreError::Decode {
                tray_ns, tray_id, ..
            }) => assert_eq!((tray_ns.as_str(), tray_id.as_str()), ("t", "i")),
            other => panic!("expected Decode, got {other:?}"),
        }
    }
}
