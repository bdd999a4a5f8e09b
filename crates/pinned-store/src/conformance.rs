//! The conformance suite every `StateStore` must pass (feature `test-util`).
//!
//! Owns the behavioural contract of wire.md §8.3 and §12.1 as executable cases. Each case
//! takes a store and a namespace no other test uses (so cases can share one Postgres
//! database and run in parallel) and panics on the first violation. It must never depend
//! on a particular backend; backend-specific checks live in that backend's tests.
//!
//! Run all of them for a store with [`conformance_tests!`](crate::conformance_tests):
//!
//! ```no_run
//! async fn fixture() -> pinned_store::conformance::Fixture {
//!     pinned_store::conformance::Fixture::new(std::sync::Arc::new(pinned_store::MemoryStore::new()))
//! }
//! pinned_store::conformance_tests!(fixture);
//! # fn main() {}
//! ```

#![allow(clippy::unwrap_used)] // a test harness: panicking is how it reports

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::{
    BatchOp, Doc, DueAlarm, InstanceKey, StateStore, StoreError, Tray, TrayKey, TrayRow,
    ALARM_TRAY, ALARM_TRAY_ID, ALARM_TRAY_NS,
};

/// A store under test, the namespace a case may use, and anything that must live as
/// long as the store (a temporary directory, say).
pub struct Fixture {
    /// The store.
    pub store: Arc<dyn StateStore>,
    /// A namespace (`/…`) unique to this fixture.
    pub ns: String,
    /// Dropped after the case.
    pub keep: Option<Box<dyn Any + Send>>,
}

impl Fixture {
    /// Wraps `store` with a fresh unique namespace.
    pub fn new(store: Arc<dyn StateStore>) -> Self {
        Self {
            store,
            ns: unique_ns("conf"),
            keep: None,
        }
    }
}

/// A namespace no other test in any process is likely to use: `/<prefix>-<pid>-<n>-<t>`.
pub fn unique_ns(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("/{prefix}-{}-{n}-{t:x}", std::process::id())
}

/// The Postgres URL tests use: `PINNED_TEST_DATABASE_URL`, else the local default
/// `postgresql://postgres@127.0.0.1:5432/test`.
pub fn database_url() -> String {
    std::env::var("PINNED_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:5432/test".to_owned())
}

/// Deletes every row of a namespace (and of the namespaces below it, `<ns>/…`) from the
/// Postgres tables at [`database_url`] when dropped, so tests sharing a database leave
/// nothing behind for others (pinboard's sweeper scans these tables). Runs on its own
/// thread and runtime, so it works inside and outside async code, and during a panic.
/// Needs the `postgres` feature.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[derive(Debug)]
pub struct PostgresCleanup {
    ns: String,
}

#[cfg(feature = "postgres")]
impl PostgresCleanup {
    /// Cleans up `ns` on drop.
    pub fn new(ns: &str) -> Self {
        Self { ns: ns.to_owned() }
    }
}

#[cfg(feature = "postgres")]
impl Drop for PostgresCleanup {
    fn drop(&mut self) {
        let ns = self.ns.clone();
        let url = database_url();
        let cleaned = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async move {
                let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::spawn(conn);
                for table in ["pinned_tray_index", "pinned_epoch"] {
                    let sql = format!(
                        "DELETE FROM {table} WHERE ns = $1 OR left(ns, length($1) + 1) = $1 || '/'"
                    );
                    client
                        .execute(&sql, &[&ns])
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Ok::<(), String>(())
            })
        })
        .join();
        if let Ok(Err(err)) = cleaned {
            eprintln!("cleanup of {} failed: {err}", self.ns);
        }
    }
}

/// A JSON object from a `json!` literal (panics on a non-object).
pub fn doc(value: Value) -> Doc {
    match value {
        Value::Object(map) => map,
        other => panic!("not a JSON object: {other}"),
    }
}

/// Expands to one `#[tokio::test]` per conformance case, each built from `$fixture`, an
/// async fn returning a [`Fixture`].
#[macro_export]
macro_rules! conformance_tests {
    ($fixture:path) => {
        $crate::conformance_tests!(@cases $fixture;
            crud_round_trip,
            docs_round_trip_exactly,
            list_filters_and_order,
            batch_applies_in_order,
            fenced_batch_applies_nothing,
            fence_lost_on_old_epoch,
            reads_fence_and_advance,
            epoch_advances_and_is_bounded,
            instances_are_isolated,
            concurrent_writers_one_instance,
            many_instances_in_parallel,
            due_alarms_filter_and_order,
            due_alarms_limit_and_changes,
            due_alarms_at_range,
            marked_instances_paginate,
            delete_instance_empties_one_instance,
            peek_and_instance_ids_read_without_fencing
        );
    };
    (@cases $fixture:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = $fixture().await;
                $crate::conformance::$case(fixture.store.clone(), &fixture.ns).await;
                drop(fixture);
            }
        )*
    };
}

fn assert_fence_lost(result: Result<impl std::fmt::Debug, StoreError>, key: &str, epoch: u64) {
    match result {
        Err(StoreError::FenceLost { key: k, epoch: e }) => {
            assert_eq!((k.as_str(), e), (key, epoch), "FenceLost fields");
        }
        other => panic!("expected FenceLost for {key} at {epoch}, got {other:?}"),
    }
}

/// set / get / overwrite / delete, idempotence, absent rows.
pub async fn crud_round_trip(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    assert_eq!(
        s.get_tray(InstanceKey::new(ns, "a"), TrayKey::singleton("t"), 1)
            .await
            .unwrap(),
        None
    );
    s.set_tray(
        InstanceKey::new(ns, "a"),
        TrayKey::singleton("t"),
        false,
        doc(json!({"n": 1})),
        1,
    )
    .await
    .unwrap();
    let want = Tray {
        marked: false,
        doc: doc(json!({"n": 1})),
    };
    assert_eq!(
        s.get_tray(InstanceKey::new(ns, "a"), TrayKey::singleton("t"), 1)
            .await
            .unwrap(),
        Some(want.clone())
    );
    // Idempotent upsert.
    s.set_tray(
        InstanceKey::new(ns, "a"),
        TrayKey::singleton("t"),
        false,
        doc(json!({"n": 1})),
        1,
    )
    .await
    .unwrap();
    assert_eq!(
        s.get_tray(InstanceKey::new(ns, "a"), TrayKey::singleton("t"), 1)
            .await
            .unwrap(),
        Some(want)
    );
    // Whole-row overwrite: the old doc's keys do not survive.
    s.set_tray(
        InstanceKey::new(ns, "a"),
        TrayKey::singleton("t"),
        true,
        doc(json!({"m": [1, 2]})),
        1,
    )
    .await
    .unwrap();
    assert_eq!(
        s.get_tray(InstanceKey::new(ns, "a"), TrayKey::singleton("t"), 1)
            .await
            .unwrap(),
        Some(Tray {
            marked: true,
            doc: doc(json!({"m": [1, 2]}))
        })
    );
    // Another tray of the same instance is untouched and separate.
    assert_eq!(
        s.get_tray(InstanceKey::new(ns, "a"), TrayKey::new("t", "k"), 1)
            .await
            .unwrap(),
        None
    );
    s.delete_tray(InstanceKey::new(ns, "a"), TrayKey::singleton("t"), 1)
        .await
        .unwrap();
    assert_eq!(
        s.get_tray(InstanceKey::new(ns, "a"), TrayKey::singleton("t"), 1)
            .await
            .unwrap(),
        None
    );
    // Idempotent delete, also of a row that never existed.
    s.delete_tray(InstanceKey::new(ns, "a"), TrayKey::singleton("t"), 1)
        .await
        .unwrap();
    s.delete_tray(InstanceKey::new(ns, "a"), TrayKey::new("never", "x"), 1)
        .await
        .unwrap();
    assert!(s
        .list(InstanceKey::new(ns, "a"), 1, None, None)
        .await
        .unwrap()
        .is_empty());
}

/// Nested, unicode, numeric-edge and empty docs come back equal.
pub async fn docs_round_trip_exactly(store: Arc<dyn StateStore>, ns: &str) {
    let docs = [
        json!({}),
        json!({"~v": 1, "~inbox": [], "~state": {"deep": {"er": [null, true, false]}}}),
        json!({"i64min": i64::MIN, "u64max": u64::MAX, "neg": -7, "f": 0.1, "big": 1.5e300}),
        json!({"text": "héllo ✓ \u{1F600} \"quoted\" back\\slash\nnewline", "": "empty key"}),
        json!({"arr": [1, "two", {"three": 3}, [4]]}),
    ];
    for (i, value) in docs.iter().enumerate() {
        let tray_id = format!("d{i}");
        s_set(&store, ns, "docs", &tray_id, i % 2 == 0, doc(value.clone())).await;
        let got = store
            .get_tray(InstanceKey::new(ns, "d"), TrayKey::new("docs", &tray_id), 1)
            .await
            .unwrap();
        assert_eq!(
            got,
            Some(Tray {
                marked: i % 2 == 0,
                doc: doc(value.clone())
            }),
            "doc {i}"
        );
    }
    async fn s_set(store: &Arc<dyn StateStore>, ns: &str, t_ns: &str, t_id: &str, m: bool, d: Doc) {
        store
            .set_tray(InstanceKey::new(ns, "d"), TrayKey::new(t_ns, t_id), m, d, 1)
            .await
            .unwrap();
    }
}

/// `list` returns only this instance's rows, byte-ordered by `(tray_ns, tray_id)`, with
/// the two filters ANDed; `list_marked_and` the marked ones and one named row, likewise.
pub async fn list_filters_and_order(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    // Inserted out of order; byte order puts "A" < "a" < "b" < "~" < "é".
    let rows = [
        ("b", "2", true),
        ("a", "10", false),
        ("é", "x", true),
        ("a", "2", true),
        ("~", "~", false),
        ("A", "z", false),
        ("b", "1", false),
        ("a", "1", true),
    ];
    for (t_ns, t_id, marked) in rows {
        s.set_tray(
            InstanceKey::new(ns, "i"),
            TrayKey::new(t_ns, t_id),
            marked,
            doc(json!({"k": format!("{t_ns}/{t_id}")})),
            3,
        )
        .await
        .unwrap();
    }
    // A row of another instance in the same namespace must not show up.
    s.set_tray(
        InstanceKey::new(ns, "other"),
        TrayKey::new("a", "1"),
        true,
        doc(json!({})),
        3,
    )
    .await
    .unwrap();

    let mut want: Vec<(&str, &str, bool)> = rows.to_vec();
    want.sort_by(|x, y| (x.0.as_bytes(), x.1.as_bytes()).cmp(&(y.0.as_bytes(), y.1.as_bytes())));
    let keys = |rows: Vec<TrayRow>| -> Vec<(String, String, bool)> {
        rows.into_iter()
            .map(|r| {
                assert_eq!(r.doc["k"], json!(format!("{}/{}", r.tray_ns, r.tray_id)));
                (r.tray_ns, r.tray_id, r.marked)
            })
            .collect()
    };
    let owned = |v: Vec<(&str, &str, bool)>| -> Vec<(String, String, bool)> {
        v.into_iter()
            .map(|(a, b, m)| (a.to_owned(), b.to_owned(), m))
            .collect()
    };

    let all = keys(
        s.list(InstanceKey::new(ns, "i"), 3, None, None)
            .await
            .unwrap(),
    );
    assert_eq!(all, owned(want.clone()), "all rows in byte order");

    let only_a = keys(
        s.list(InstanceKey::new(ns, "i"), 3, Some("a"), None)
            .await
            .unwrap(),
    );
    assert_eq!(
        only_a,
        owned(want.iter().copied().filter(|r| r.0 == "a").collect())
    );

    let marked = keys(
        s.list(InstanceKey::new(ns, "i"), 3, None, Some(true))
            .await
            .unwrap(),
    );
    assert_eq!(
        marked,
        owned(want.iter().copied().filter(|r| r.2).collect())
    );

    let unmarked = keys(
        s.list(InstanceKey::new(ns, "i"), 3, None, Some(false))
            .await
            .unwrap(),
    );
    assert_eq!(
        unmarked,
        owned(want.iter().copied().filter(|r| !r.2).collect())
    );

    let both = keys(
        s.list(InstanceKey::new(ns, "i"), 3, Some("a"), Some(true))
            .await
            .unwrap(),
    );
    assert_eq!(
        both,
        owned(vec![("a", "1", true), ("a", "2", true)]),
        "filters AND together"
    );
    assert!(
        s.list(InstanceKey::new(ns, "i"), 3, Some("b"), Some(true))
            .await
            .unwrap()
            .len()
            == 1
    );
    assert!(s
        .list(InstanceKey::new(ns, "i"), 3, Some("none"), None)
        .await
        .unwrap()
        .is_empty());
    assert!(s
        .list(InstanceKey::new(ns, "fresh"), 3, None, None)
        .await
        .unwrap()
        .is_empty());

    // The marked rows and one named row, once, in the same order; fenced like `list`.
    let marked_and = |tray: (&'static str, &'static str)| {
        let instance = InstanceKey::new(ns, "i");
        async move {
            keys(
                s.list_marked_and(instance, 3, TrayKey::new(tray.0, tray.1))
                    .await
                    .unwrap(),
            )
        }
    };
    let with = |extra: Option<(&'static str, &'static str, bool)>| {
        owned(
            want.iter()
                .copied()
                .filter(|r| r.2 || Some(*r) == extra)
                .collect(),
        )
    };
    assert_eq!(
        marked_and(("A", "z")).await,
        with(Some(("A", "z", false))),
        "an unmarked row joins the marked ones in order"
    );
    assert_eq!(marked_and(("b", "1")).await, with(Some(("b", "1", false))));
    assert_eq!(
        marked_and(("a", "1")).await,
        with(None),
        "a marked row comes once"
    );
    assert_eq!(
        marked_and(("none", "x")).await,
        with(None),
        "an absent row is left out"
    );
    assert_fence_lost(
        s.list_marked_and(InstanceKey::new(ns, "i"), 2, TrayKey::new("A", "z"))
            .await,
        &format!("{ns}/i"),
        2,
    );
}

/// A batch applies its ops in order: later ops see earlier ones, deletes included.
pub async fn batch_applies_in_order(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    s.set_tray(
        InstanceKey::new(ns, "b"),
        TrayKey::new("pre", "x"),
        true,
        doc(json!({"old": true})),
        1,
    )
    .await
    .unwrap();
    let ops = vec![
        BatchOp::set("t", "1", false, doc(json!({"v": 1}))),
        BatchOp::set("t", "2", true, doc(json!({"v": 1}))),
        BatchOp::delete("t", "1"),
        BatchOp::set("t", "2", false, doc(json!({"v": 2}))),
        BatchOp::tray("t", "3", Some(true), doc(json!({"v": 3}))),
        // The reference's `marked = None` delete.
        BatchOp::tray("t", "3", None, Doc::new()),
        BatchOp::delete("t", "absent"),
        BatchOp::tray("pre", "x", None, Doc::new()),
        BatchOp::set("t", "4", true, doc(json!({"v": 4}))),
    ];
    s.apply_batch(InstanceKey::new(ns, "b"), ops, 2)
        .await
        .unwrap();
    let rows = s
        .list(InstanceKey::new(ns, "b"), 2, None, None)
        .await
        .unwrap();
    assert_eq!(
        rows,
        vec![
            TrayRow {
                tray_ns: "t".into(),
                tray_id: "2".into(),
                marked: false,
                doc: doc(json!({"v": 2}))
            },
            TrayRow {
                tray_ns: "t".into(),
                tray_id: "4".into(),
                marked: true,
                doc: doc(json!({"v": 4}))
            },
        ]
    );
    // An empty batch only fences, and does advance the epoch.
    s.apply_batch(InstanceKey::new(ns, "b"), Vec::new(), 5)
        .await
        .unwrap();
    assert_fence_lost(
        s.set_tray(
            InstanceKey::new(ns, "b"),
            TrayKey::new("t", "5"),
            false,
            Doc::new(),
            4,
        )
        .await,
        &format!("{ns}/b"),
        4,
    );
    assert_eq!(
        s.list(InstanceKey::new(ns, "b"), 5, None, None)
            .await
            .unwrap()
            .len(),
        2
    );
    // At the epoch already stored (a store's fast path, when it has one), rows
    // written twice still end as the last op left them.
    let ops = vec![
        BatchOp::delete("t", "4"),
        BatchOp::set("t", "4", true, doc(json!({"v": 44}))),
        BatchOp::set("t", "6", true, doc(json!({"v": 6}))),
        BatchOp::delete("t", "6"),
        BatchOp::set("t", "2", true, doc(json!({"v": 3}))),
        BatchOp::set("t", "2", false, doc(json!({"v": 4}))),
    ];
    s.apply_batch(InstanceKey::new(ns, "b"), ops, 5)
        .await
        .unwrap();
    let rows = s
        .list(InstanceKey::new(ns, "b"), 5, None, None)
        .await
        .unwrap();
    let images: Vec<_> = rows
        .iter()
        .map(|r| (r.tray_id.as_str(), r.marked, r.doc.clone()))
        .collect();
    assert_eq!(
        images,
        vec![
            ("2", false, doc(json!({"v": 4}))),
            ("4", true, doc(json!({"v": 44}))),
        ]
    );
}

/// A batch at a superseded epoch fails as a whole and changes nothing.
pub async fn fenced_batch_applies_nothing(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    s.set_tray(
        InstanceKey::new(ns, "f"),
        TrayKey::new("t", "keep"),
        false,
        doc(json!({"v": "kept"})),
        3,
    )
    .await
    .unwrap();
    let ops = vec![
        BatchOp::set("t", "new", true, doc(json!({}))),
        BatchOp::delete("t", "keep"),
    ];
    assert_fence_lost(
        s.apply_batch(InstanceKey::new(ns, "f"), ops, 2).await,
        &format!("{ns}/f"),
        2,
    );
    let rows = s
        .list(InstanceKey::new(ns, "f"), 3, None, None)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].tray_id, "keep");
    assert_eq!(rows[0].doc, doc(json!({"v": "kept"})));
}

/// Every op below the stored epoch fails with `FenceLost` (reference text) and changes
/// nothing; the stored epoch itself still works.
pub async fn fence_lost_on_old_epoch(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    let key = format!("{ns}/x");
    s.set_tray(
        InstanceKey::new(ns, "x"),
        TrayKey::singleton("t"),
        false,
        doc(json!({"owner": 2})),
        2,
    )
    .await
    .unwrap();
    let err = s
        .set_tray(
            InstanceKey::new(ns, "x"),
            TrayKey::singleton("t"),
            true,
            doc(json!({"owner": 1})),
            1,
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("fence lost for '{key}': epoch 1 was superseded by a newer activation")
    );
    assert!(err.is_fence_lost() && !err.retryable());
    assert_fence_lost(
        s.delete_tray(InstanceKey::new(ns, "x"), TrayKey::singleton("t"), 1)
            .await,
        &key,
        1,
    );
    assert_fence_lost(
        s.get_tray(InstanceKey::new(ns, "x"), TrayKey::singleton("t"), 1)
            .await,
        &key,
        1,
    );
    assert_fence_lost(
        s.list(InstanceKey::new(ns, "x"), 1, None, None).await,
        &key,
        1,
    );
    assert_fence_lost(
        s.apply_batch(InstanceKey::new(ns, "x"), vec![], 0).await,
        &key,
        0,
    );
    assert_eq!(
        s.get_tray(InstanceKey::new(ns, "x"), TrayKey::singleton("t"), 2)
            .await
            .unwrap(),
        Some(Tray {
            marked: false,
            doc: doc(json!({"owner": 2}))
        }),
        "fenced ops changed nothing"
    );
    // Equal epoch keeps working.
    s.delete_tray(InstanceKey::new(ns, "x"), TrayKey::singleton("t"), 2)
        .await
        .unwrap();
}

/// Reads acquire the instance too: a read at a newer epoch fences older writers.
pub async fn reads_fence_and_advance(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    assert_eq!(
        s.get_tray(InstanceKey::new(ns, "r"), TrayKey::singleton("t"), 5)
            .await
            .unwrap(),
        None
    );
    assert_fence_lost(
        s.set_tray(
            InstanceKey::new(ns, "r"),
            TrayKey::singleton("t"),
            false,
            Doc::new(),
            4,
        )
        .await,
        &format!("{ns}/r"),
        4,
    );
    assert!(s
        .list(InstanceKey::new(ns, "r"), 7, None, None)
        .await
        .unwrap()
        .is_empty());
    assert_fence_lost(
        s.get_tray(InstanceKey::new(ns, "r"), TrayKey::singleton("t"), 6)
            .await,
        &format!("{ns}/r"),
        6,
    );
    s.set_tray(
        InstanceKey::new(ns, "r"),
        TrayKey::singleton("t"),
        false,
        Doc::new(),
        7,
    )
    .await
    .unwrap();
    // A never-seen instance starts at 0.
    s.set_tray(
        InstanceKey::new(ns, "zero"),
        TrayKey::singleton("t"),
        false,
        Doc::new(),
        0,
    )
    .await
    .unwrap();
    assert_eq!(
        s.list(InstanceKey::new(ns, "zero"), 0, None, None)
            .await
            .unwrap()
            .len(),
        1
    );
}

/// The stored epoch only moves up, to any value up to `i64::MAX`; larger epochs are
/// refused before touching the store.
pub async fn epoch_advances_and_is_bounded(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    for epoch in [0, 1, 1, 10, 1 << 40, i64::MAX as u64] {
        s.set_tray(
            InstanceKey::new(ns, "e"),
            TrayKey::singleton("t"),
            false,
            doc(json!({"e": epoch})),
            epoch,
        )
        .await
        .unwrap();
    }
    assert_fence_lost(
        s.get_tray(
            InstanceKey::new(ns, "e"),
            TrayKey::singleton("t"),
            (1 << 40) + 1,
        )
        .await,
        &format!("{ns}/e"),
        (1 << 40) + 1,
    );
    let too_big = i64::MAX as u64 + 1;
    match s
        .set_tray(
            InstanceKey::new(ns, "e2"),
            TrayKey::singleton("t"),
            false,
            Doc::new(),
            too_big,
        )
        .await
    {
        Err(StoreError::EpochOutOfRange { epoch }) => assert_eq!(epoch, too_big),
        other => panic!("expected EpochOutOfRange, got {other:?}"),
    }
    // The refused epoch left no trace: epoch 0 still works on that instance.
    s.set_tray(
        InstanceKey::new(ns, "e2"),
        TrayKey::singleton("t"),
        false,
        Doc::new(),
        0,
    )
    .await
    .unwrap();
}

/// Fences are per `(ns, id)`, even where `"<ns>/<id>"` strings coincide.
pub async fn instances_are_isolated(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    let ns2 = format!("{ns}/a");
    s.set_tray(
        InstanceKey::new(ns, "a/b"),
        TrayKey::singleton("t"),
        false,
        doc(json!({"who": 1})),
        9,
    )
    .await
    .unwrap();
    // Same key text "<ns>/a/b", different instance: starts at epoch 0.
    s.set_tray(
        InstanceKey::new(&ns2, "b"),
        TrayKey::singleton("t"),
        false,
        doc(json!({"who": 2})),
        1,
    )
    .await
    .unwrap();
    assert_eq!(
        s.get_tray(InstanceKey::new(ns, "a/b"), TrayKey::singleton("t"), 9)
            .await
            .unwrap()
            .map(|t| t.doc),
        Some(doc(json!({"who": 1})))
    );
    assert_eq!(
        s.get_tray(InstanceKey::new(&ns2, "b"), TrayKey::singleton("t"), 1)
            .await
            .unwrap()
            .map(|t| t.doc),
        Some(doc(json!({"who": 2})))
    );
    assert_eq!(
        s.list(InstanceKey::new(ns, "a"), 0, None, None)
            .await
            .unwrap(),
        vec![]
    );
}

/// Many tasks write one instance at interleaved epochs. The highest epoch wins: none of
/// its writes is lost, every write that reported success is present, every write that
/// reported `FenceLost` is absent, a fenced task stays fenced, and the last write to a
/// shared row comes from a winner.
pub async fn concurrent_writers_one_instance(store: Arc<dyn StateStore>, ns: &str) {
    const TASKS: u64 = 24;
    const WRITES: u64 = 8;
    const EPOCHS: u64 = 6;
    let key = format!("{ns}/hot");
    let mut handles = Vec::new();
    for task in 0..TASKS {
        // Epochs 1..=EPOCHS, scrambled across tasks; at least one task per epoch.
        let epoch = (task * 7 + 3) % EPOCHS + 1;
        let store = store.clone();
        let ns = ns.to_owned();
        let key = key.clone();
        handles.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for n in 0..WRITES {
                let d = doc(json!({"task": task, "n": n, "epoch": epoch}));
                let tray_id = format!("{task}-{n}");
                let own = store
                    .set_tray(
                        InstanceKey::new(&ns, "hot"),
                        TrayKey::new("own", &tray_id),
                        n % 2 == 0,
                        d.clone(),
                        epoch,
                    )
                    .await;
                let shared = store
                    .set_tray(
                        InstanceKey::new(&ns, "hot"),
                        TrayKey::singleton("shared"),
                        false,
                        d,
                        epoch,
                    )
                    .await;
                for result in [&own, &shared] {
                    if let Err(err) = result {
                        assert!(
                            matches!(err, StoreError::FenceLost { key: k, epoch: e }
                                if *k == key && *e == epoch),
                            "unexpected error {err:?}"
                        );
                    }
                }
                outcomes.push((n, own.is_ok(), shared.is_ok()));
                tokio::task::yield_now().await;
            }
            (task, epoch, outcomes)
        }));
    }
    let mut results = Vec::new();
    for handle in handles {
        results.push(handle.await.expect("writer task panicked"));
    }
    let winner = EPOCHS;
    let rows = store
        .list(InstanceKey::new(ns, "hot"), winner, None, None)
        .await
        .unwrap();
    let present: BTreeMap<String, TrayRow> = rows
        .iter()
        .filter(|r| r.tray_ns == "own")
        .map(|r| (r.tray_id.clone(), r.clone()))
        .collect();
    for (task, epoch, outcomes) in &results {
        let mut fenced = false;
        for &(n, own_ok, shared_ok) in outcomes {
            if *epoch == winner {
                assert!(
                    own_ok && shared_ok,
                    "a write at the winning epoch was refused"
                );
            }
            if fenced {
                assert!(
                    !own_ok && !shared_ok,
                    "task {task} wrote again after being fenced"
                );
            }
            fenced |= !own_ok || !shared_ok;
            let tray_id = format!("{task}-{n}");
            match present.get(&tray_id) {
                Some(row) => {
                    assert!(
                        own_ok,
                        "row {tray_id} present although its write was fenced"
                    );
                    assert_eq!(row.doc, doc(json!({"task": task, "n": n, "epoch": epoch})));
                    assert_eq!(row.marked, n % 2 == 0);
                }
                None => assert!(!own_ok, "row {tray_id} lost although its write succeeded"),
            }
        }
    }
    let shared = store
        .get_tray(
            InstanceKey::new(ns, "hot"),
            TrayKey::singleton("shared"),
            winner,
        )
        .await
        .unwrap()
        .expect("shared row");
    assert_eq!(
        shared.doc["epoch"],
        json!(winner),
        "last shared write came from a winner"
    );
    assert_fence_lost(
        store
            .get_tray(
                InstanceKey::new(ns, "hot"),
                TrayKey::singleton("shared"),
                winner - 1,
            )
            .await,
        &key,
        winner - 1,
    );
}

/// Many instances written concurrently each end with exactly their own rows.
pub async fn many_instances_in_parallel(store: Arc<dyn StateStore>, ns: &str) {
    const INSTANCES: usize = 64;
    const WRITES: u64 = 6;
    let mut handles = Vec::new();
    for i in 0..INSTANCES {
        let store = store.clone();
        let ns = ns.to_owned();
        handles.push(tokio::spawn(async move {
            let id = format!("i{i}");
            let epoch = (i % 3) as u64;
            for n in 0..WRITES {
                store
                    .set_tray(
                        InstanceKey::new(&ns, &id),
                        TrayKey::singleton("count"),
                        n + 1 < WRITES,
                        doc(json!({"n": n, "i": i})),
                        epoch,
                    )
                    .await
                    .unwrap();
                store
                    .apply_batch(
                        InstanceKey::new(&ns, &id),
                        vec![
                            BatchOp::set("log", format!("{n}"), false, doc(json!({"n": n}))),
                            BatchOp::delete("log", format!("{}", n.wrapping_sub(2))),
                        ],
                        epoch,
                    )
                    .await
                    .unwrap();
            }
            let rows = store
                .list(InstanceKey::new(&ns, &id), epoch, None, None)
                .await
                .unwrap();
            assert_eq!(rows.len(), 3, "count + two newest log rows for {id}");
            assert_eq!(rows[0].tray_ns, "count");
            assert_eq!(rows[0].doc, doc(json!({"n": WRITES - 1, "i": i})));
            assert!(!rows[0].marked);
            let logs: Vec<&str> = rows[1..].iter().map(|r| r.tray_id.as_str()).collect();
            assert_eq!(
                logs,
                vec![format!("{}", WRITES - 2), format!("{}", WRITES - 1)]
            );
        }));
    }
    for handle in handles {
        handle.await.expect("instance task panicked");
    }
}

// === the unfenced scans ===
//
// The scans read every instance, so on a shared database (Postgres) they also return other
// tests' rows. The checks below hold whatever foreign rows exist: a result must be sorted,
// within its limit and bound, and contain exactly this case's rows up to its last key (all
// of them when it came back short). This case's rows are those of `ns` and `<ns>/…`.

fn is_ours(ns: &str, row_ns: &str) -> bool {
    row_ns == ns
        || row_ns
            .strip_prefix(ns)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Alarm times for this case: far in the future (year ~3085, so no pinboard sweeper ever
/// finds them due), offset per namespace so concurrent runs rarely overlap, and small
/// enough that `x.5` is an exact `f64`.
fn alarm_base(ns: &str) -> i64 {
    let hash = ns.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (1_i64 << 45) + ((hash % (1 << 20)) as i64) * 1024
}

fn alarm_key(a: &DueAlarm) -> (i64, &str, &str) {
    (a.at, a.ns.as_str(), a.id.as_str())
}

/// `due_alarms(due_by, limit)` against `want`: this case's alarm rows due by `due_by`.
async fn check_due(store: &dyn StateStore, ns: &str, due_by: i64, limit: usize, want: &[DueAlarm]) {
    let got = store.due_alarms(due_by, limit).await.unwrap();
    assert!(got.len() <= limit, "{} rows over limit {limit}", got.len());
    assert!(
        got.windows(2).all(|w| alarm_key(&w[0]) < alarm_key(&w[1])),
        "not ordered by (at, ns, id): {got:?}"
    );
    assert!(
        got.iter().all(|a| a.at <= due_by),
        "not due by {due_by}: {got:?}"
    );
    let mut want: Vec<DueAlarm> = want.iter().filter(|a| a.at <= due_by).cloned().collect();
    want.sort_by(|a, b| alarm_key(a).cmp(&alarm_key(b)));
    if got.len() == limit {
        // Full page: ours up to its last key, none if it is empty (limit 0).
        match got.last() {
            Some(last) => want.retain(|a| alarm_key(a) <= alarm_key(last)),
            None => want.clear(),
        }
    }
    let ours: Vec<DueAlarm> = got.into_iter().filter(|a| is_ours(ns, &a.ns)).collect();
    assert_eq!(ours, want, "due_alarms({due_by}, {limit})");
}

fn due(ns: &str, id: &str, at: i64, nonce: Option<&str>) -> DueAlarm {
    DueAlarm {
        ns: ns.to_owned(),
        id: id.to_owned(),
        at,
        nonce: nonce.map(str::to_owned),
        world: crate::WorldStamp::any(),
    }
}

async fn set_alarm(store: &dyn StateStore, ns: &str, id: &str, marked: bool, alarm: Value) {
    store
        .set_tray(InstanceKey::new(ns, id), ALARM_TRAY, marked, doc(alarm), 3)
        .await
        .unwrap();
}

/// `due_alarms` returns exactly the alarm rows whose `doc.at` is an integer-valued number
/// at or before the bound, ordered by `(at, ns, id)`, with string nonces; malformed `at`
/// values, other trays and not-yet-due alarms are skipped.
pub async fn due_alarms_filter_and_order(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    let b = alarm_base(ns);
    let sub = format!("{ns}/sub");
    let due_by = b + 50;
    // Due. Ties on `at` order by (ns, id): "a1" < "a3" < "<ns>/sub"'s "a0".
    set_alarm(s, ns, "a1", false, json!({"at": b + 10, "nonce": "n1"})).await;
    set_alarm(s, ns, "a2", false, json!({"at": b + 5, "nonce": 7})).await;
    set_alarm(s, ns, "a3", false, json!({"at": b + 10})).await;
    set_alarm(s, &sub, "a0", false, json!({"at": b + 10, "nonce": "sub"})).await;
    // An integer-valued float counts; so does a marked alarm row; `at == due_by` is due.
    set_alarm(
        s,
        ns,
        "float",
        false,
        json!({"at": (b + 20) as f64, "nonce": "f"}),
    )
    .await;
    set_alarm(s, ns, "marked", true, json!({"at": b + 30, "nonce": null})).await;
    set_alarm(s, ns, "edge", false, json!({"at": due_by, "nonce": "e"})).await;
    // Not due yet.
    set_alarm(
        s,
        ns,
        "late",
        false,
        json!({"at": due_by + 1, "nonce": "l"}),
    )
    .await;
    set_alarm(s, ns, "later", false, json!({"at": (due_by as f64) + 1e9})).await;
    // Malformed `at`: skipped wherever it would sort.
    for (id, at) in [
        ("frac", json!((b + 3) as f64 + 0.5)),
        ("string", json!(format!("{}", b + 1))),
        ("null", Value::Null),
        ("bool", json!(true)),
        ("object", json!({"at": b})),
        ("array", json!([b])),
        ("tiny", json!(-1e300)),
    ] {
        set_alarm(s, ns, id, false, json!({"at": at, "nonce": id})).await;
    }
    set_alarm(s, ns, "missing", false, json!({"nonce": "m"})).await;
    // Same `at` in rows that are not the alarm tray.
    s.set_tray(
        InstanceKey::new(ns, "other"),
        TrayKey::new(ALARM_TRAY_NS, "not-alarm"),
        false,
        doc(json!({"at": b})),
        3,
    )
    .await
    .unwrap();
    s.set_tray(
        InstanceKey::new(ns, "other"),
        TrayKey::new("not-pinned", ALARM_TRAY_ID),
        true,
        doc(json!({"at": b})),
        3,
    )
    .await
    .unwrap();

    let want = vec![
        due(ns, "a2", b + 5, None),
        due(ns, "a1", b + 10, Some("n1")),
        due(ns, "a3", b + 10, None),
        due(&sub, "a0", b + 10, Some("sub")),
        due(ns, "float", b + 20, Some("f")),
        due(ns, "marked", b + 30, None),
        due(ns, "edge", due_by, Some("e")),
    ];
    check_due(s, ns, due_by, 1000, &want).await;
    // Stricter bounds keep the prefix; the half-millisecond "frac" never shows.
    check_due(s, ns, b + 9, 1000, &want).await;
    check_due(s, ns, b + 10, 1000, &want).await;
    check_due(s, ns, due_by - 1, 1000, &want).await;
    check_due(s, ns, b - 1, 1000, &want).await;
    // A later bound adds "late" only.
    let mut with_late = want.clone();
    with_late.push(due(ns, "late", due_by + 1, Some("l")));
    check_due(s, ns, due_by + 1, 1000, &with_late).await;

    // The scans take no fence: an older epoch still writes afterwards.
    s.set_tray(
        InstanceKey::new(ns, "a1"),
        TrayKey::singleton("t"),
        false,
        Doc::new(),
        3,
    )
    .await
    .unwrap();
}

/// `limit` cuts the ordered result; deleted, replaced and unparseable-after-rewrite
/// alarms leave or move in the next scan.
pub async fn due_alarms_limit_and_changes(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    let b = alarm_base(ns);
    let due_by = b + 100;
    let mut want = Vec::new();
    for i in 0..6_i64 {
        let id = format!("i{i}");
        // Out of order on purpose: at = b + 60, b + 50, …
        let at = b + 60 - 10 * i;
        let nonce = format!("n{i}");
        set_alarm(s, ns, &id, false, json!({"at": at, "nonce": nonce})).await;
        want.push(due(ns, &id, at, Some(&nonce)));
    }
    for limit in [0, 1, 2, 5, 6, 7, 1000] {
        check_due(s, ns, due_by, limit, &want).await;
    }

    // Deleted (directly and by batch) alarms disappear.
    s.delete_tray(InstanceKey::new(ns, "i5"), ALARM_TRAY, 3)
        .await
        .unwrap();
    s.apply_batch(
        InstanceKey::new(ns, "i4"),
        vec![BatchOp::delete(ALARM_TRAY_NS, ALARM_TRAY_ID)],
        3,
    )
    .await
    .unwrap();
    want.retain(|a| a.id != "i5" && a.id != "i4");
    check_due(s, ns, due_by, 1000, &want).await;
    check_due(s, ns, due_by, 1, &want).await;

    // A replaced alarm moves (new time, new nonce); one rewritten with a malformed `at`
    // or postponed past the bound disappears.
    set_alarm(s, ns, "i0", false, json!({"at": b + 1, "nonce": "moved"})).await;
    set_alarm(s, ns, "i1", false, json!({"at": "soon", "nonce": "bad"})).await;
    set_alarm(s, ns, "i2", false, json!({"at": due_by + 1})).await;
    want.retain(|a| a.id == "i3");
    want.push(due(ns, "i0", b + 1, Some("moved")));
    for limit in [1, 2, 1000] {
        check_due(s, ns, due_by, limit, &want).await;
    }
    check_due(s, ns, due_by + 1, 1000, &{
        let mut w = want.clone();
        w.push(due(ns, "i2", due_by + 1, None));
        w
    })
    .await;
}

/// `at` must fit `i64`: `i64::MAX` is an alarm (due only by `i64::MAX`); larger integers
/// and floats out of range are skipped. (All far in the future: no sweeper sees them.)
pub async fn due_alarms_at_range(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    set_alarm(s, ns, "max", false, json!({"at": i64::MAX, "nonce": "max"})).await;
    set_alarm(s, ns, "u64", false, json!({"at": u64::MAX})).await;
    set_alarm(s, ns, "over", false, json!({"at": i64::MAX as u64 + 1})).await;
    set_alarm(
        s,
        ns,
        "2^63",
        false,
        json!({"at": 9_223_372_036_854_775_808.0_f64}),
    )
    .await;
    set_alarm(s, ns, "huge", false, json!({"at": 1e300})).await;
    let want = vec![due(ns, "max", i64::MAX, Some("max"))];
    check_due(s, ns, i64::MAX, 1000, &want).await;
    check_due(s, ns, i64::MAX - 1, 1000, &want).await;
}

/// `marked_instances` lists each instance with at least one marked row once, in
/// `(ns, id)` byte order (as a pair, not as `"<ns>/<id>"`), paginated strictly after the
/// given key; instances with only unmarked rows never appear.
pub async fn marked_instances_paginate(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    let sub = format!("{ns}/sub");
    let set = |n: &str, id: &str, t_id: &str, marked: bool| {
        let (n, id, t_id) = (n.to_owned(), id.to_owned(), t_id.to_owned());
        let store = store.clone();
        async move {
            store
                .set_tray(
                    InstanceKey::new(&n, &id),
                    TrayKey::new("t", &t_id),
                    marked,
                    doc(json!({"m": marked})),
                    2,
                )
                .await
                .unwrap();
        }
    };
    // Marked: several marked rows count once; byte order puts "B" < "a" < "z" < "é".
    set(ns, "a", "1", true).await;
    set(ns, "a", "2", true).await;
    set(ns, "a", "3", false).await;
    set(ns, "é", "1", true).await;
    set(ns, "B", "1", true).await;
    // As a pair ("<ns>", "z") < ("<ns>/sub", "a"), though "<ns>/z" > "<ns>/sub/a".
    set(ns, "z", "1", true).await;
    set(&sub, "a", "1", true).await;
    set(&sub, "b", "x", false).await;
    set(&sub, "b", "y", true).await;
    // Never marked, or no longer.
    set(ns, "unmarked", "1", false).await;
    set(ns, "unmarked", "2", false).await;
    set_alarm(s, ns, "alarm-only", false, json!({"at": 1})).await;
    set(ns, "was", "1", true).await;
    set(ns, "was", "1", false).await;
    set(ns, "gone", "1", true).await;
    s.delete_tray(InstanceKey::new(ns, "gone"), TrayKey::new("t", "1"), 2)
        .await
        .unwrap();

    let pair = |n: &str, id: &str| (n.to_owned(), id.to_owned());
    let want = vec![
        pair(ns, "B"),
        pair(ns, "a"),
        pair(ns, "z"),
        pair(ns, "é"),
        pair(&sub, "a"),
        pair(&sub, "b"),
    ];
    for page in [1, 2, 4, 6, 100] {
        assert_eq!(page_through(s, ns, page).await, want, "pages of {page}");
    }
    assert!(marked_pairs(s, Some((ns, "")), 0).await.is_empty());

    // Strictly after a key, whether or not it is itself listed.
    let first = marked_pairs(s, Some((ns, "B")), 2).await;
    assert_eq!(first, want[1..3].to_vec());
    let first = marked_pairs(s, Some((ns, "b")), 2).await;
    assert_eq!(first, want[2..4].to_vec());
    let first = marked_pairs(s, Some((ns, "é")), 1).await;
    assert_eq!(first, want[4..5].to_vec());
    let last = marked_pairs(s, Some((&sub, "b")), 5).await;
    assert!(last.iter().all(|(n, _)| !is_ours(ns, n)), "{last:?}");

    // From the start: ordered, and ours up to the page's last key.
    let start = marked_pairs(s, None, 3).await;
    assert!(start.len() <= 3 && start.windows(2).all(|w| w[0] < w[1]));
    if start.len() < 3 {
        assert_eq!(start, want, "a short first page holds everything");
    }

    // Unmarking the only marked row, or deleting it, removes the instance; marking adds.
    set(ns, "a", "1", false).await;
    assert_eq!(page_through(s, ns, 2).await, want);
    set(ns, "a", "2", false).await;
    s.delete_tray(InstanceKey::new(&sub, "b"), TrayKey::new("t", "y"), 2)
        .await
        .unwrap();
    set(ns, "unmarked", "2", true).await;
    let want = vec![
        pair(ns, "B"),
        pair(ns, "unmarked"),
        pair(ns, "z"),
        pair(ns, "é"),
        pair(&sub, "a"),
    ];
    assert_eq!(page_through(s, ns, 2).await, want);
}

/// `marked_instances` as `(ns, id)` pairs.
async fn marked_pairs(
    store: &dyn StateStore,
    after: Option<(&str, &str)>,
    limit: usize,
) -> Vec<(String, String)> {
    store
        .marked_instances(after, limit)
        .await
        .unwrap()
        .into_iter()
        .map(|m| (m.ns, m.id))
        .collect()
}

/// Pages through `marked_instances` from just before `ns` until past `<ns>/…`, checking
/// every page, and returns this case's instances.
async fn page_through(store: &dyn StateStore, ns: &str, page: usize) -> Vec<(String, String)> {
    let mut after = (ns.to_owned(), String::new());
    let mut ours = Vec::new();
    loop {
        let got = marked_pairs(store, Some((&after.0, &after.1)), page).await;
        assert!(got.len() <= page, "page over limit {page}: {got:?}");
        let mut prev = &after;
        for key in &got {
            assert!(key > prev, "{key:?} not after {prev:?} (page of {page})");
            prev = key;
        }
        let Some(last) = got.last().cloned() else {
            return ours;
        };
        let done = got.len() < page || (last.0.as_str() > ns && !is_ours(ns, &last.0));
        ours.extend(got.into_iter().filter(|(n, _)| is_ours(ns, n)));
        if done {
            return ours;
        }
        after = last;
    }
}

/// `instance_ids` pages one namespace's ids holding rows in byte order;
/// `peek` reads an instance's rows and epoch without moving the epoch, so
/// an owner at that epoch is not fenced out by it.
pub async fn peek_and_instance_ids_read_without_fencing(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    for (id, epoch) in [("b", 5), ("a", 2), ("c~", 1)] {
        s.set_tray(
            InstanceKey::new(ns, id),
            TrayKey::singleton("t"),
            id == "a",
            doc(json!({"id": id})),
            epoch,
        )
        .await
        .unwrap();
    }
    // An id only ever read holds no row: not listed.
    s.get_tray(
        InstanceKey::new(ns, "read-only"),
        TrayKey::singleton("t"),
        1,
    )
    .await
    .unwrap();
    // Below `ns`, so the Postgres fixture cleans it up too.
    let other = format!("{ns}/other");
    s.set_tray(
        InstanceKey::new(&other, "a"),
        TrayKey::singleton("t"),
        false,
        doc(json!({})),
        1,
    )
    .await
    .unwrap();
    assert_eq!(
        s.instance_ids(ns, None, 10).await.unwrap(),
        ["a", "b", "c~"]
    );
    assert_eq!(s.instance_ids(ns, None, 2).await.unwrap(), ["a", "b"]);
    assert_eq!(s.instance_ids(ns, Some("b"), 2).await.unwrap(), ["c~"]);
    assert!(s.instance_ids(ns, Some("c~"), 2).await.unwrap().is_empty());

    let peek = s.peek(InstanceKey::new(ns, "b")).await.unwrap();
    assert_eq!(peek.epoch, Some(5));
    assert_eq!(peek.rows.len(), 1);
    assert_eq!(peek.rows[0].row.doc, doc(json!({"id": "b"})));
    assert!(!peek.rows[0].row.marked);
    let nothing = s.peek(InstanceKey::new(ns, "never")).await.unwrap();
    assert_eq!((nothing.epoch, nothing.rows.len()), (None, 0));
    // The owner at epoch 5 still writes: the peek fenced nothing.
    s.set_tray(
        InstanceKey::new(ns, "b"),
        TrayKey::singleton("t"),
        false,
        doc(json!({})),
        5,
    )
    .await
    .unwrap();
    // And a peek of a never-written id left no fence row behind.
    assert_eq!(
        s.peek(InstanceKey::new(ns, "never")).await.unwrap().epoch,
        None
    );
}

/// `delete_instance` removes every row of one instance (trays, marked ones, the alarm) and
/// nothing of another; it is fenced, and the fence survives it.
pub async fn delete_instance_empties_one_instance(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    // The alarm first: the helper writes at epoch 3.
    set_alarm(s, ns, "gone", false, json!({"at": 1, "nonce": "n"})).await;
    for (tray_ns, tray_id, marked) in [("a", "~", false), ("b", "1", true), ("b", "2", false)] {
        s.set_tray(
            InstanceKey::new(ns, "gone"),
            TrayKey::new(tray_ns, tray_id),
            marked,
            doc(json!({"v": 1})),
            4,
        )
        .await
        .unwrap();
    }
    s.set_tray(
        InstanceKey::new(ns, "kept"),
        TrayKey::singleton("a"),
        true,
        doc(json!({"v": 2})),
        1,
    )
    .await
    .unwrap();
    // An older epoch may not delete.
    assert_fence_lost(
        s.delete_instance(InstanceKey::new(ns, "gone"), 3).await,
        &format!("{ns}/gone"),
        3,
    );
    assert_eq!(
        s.list(InstanceKey::new(ns, "gone"), 4, None, None)
            .await
            .unwrap()
            .len(),
        4
    );
    s.delete_instance(InstanceKey::new(ns, "gone"), 4)
        .await
        .unwrap();
    assert!(s
        .list(InstanceKey::new(ns, "gone"), 4, None, None)
        .await
        .unwrap()
        .is_empty());
    // Idempotent.
    s.delete_instance(InstanceKey::new(ns, "gone"), 4)
        .await
        .unwrap();
    // The other instance is untouched, and the fence outlives the rows.
    assert_eq!(
        s.list(InstanceKey::new(ns, "kept"), 1, None, None)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_fence_lost(
        s.set_tray(
            InstanceKey::new(ns, "gone"),
            TrayKey::singleton("a"),
            false,
            doc(json!({})),
            3,
        )
        .await,
        &format!("{ns}/gone"),
        3,
    );
    let due = s.due_alarms(i64::MAX, 1_000).await.unwrap();
    assert!(
        due.iter()
            .all(|alarm| !(alarm.ns == ns && alarm.id == "gone")),
        "the alarm row went with the instance"
    );
}

/// [`StateStore::reclaim_fences`]: the fence rows of instances that hold no row and sit
/// below the given epoch go, at most `limit` a call; an instance with a row keeps its
/// fence, and so does one at or above the epoch. Not in [`conformance_tests!`]: the
/// reclaim spans every namespace, so it needs a store no other case shares.
pub async fn reclaim_fences_spares_written_and_recent_instances(
    store: Arc<dyn StateStore>,
    ns: &str,
) {
    let key = |id: &'static str| InstanceKey::new(ns, id);
    // Read only (what a scanner's random ids leave): three below the cut.
    for id in ["read-1", "read-2", "read-3"] {
        store
            .get_tray(key(id), TrayKey::singleton("t"), 10)
            .await
            .unwrap();
    }
    // Written, below the cut; emptied again, below the cut; read above the cut.
    store
        .set_tray(
            key("written"),
            TrayKey::singleton("t"),
            false,
            doc(json!({"v": 1})),
            10,
        )
        .await
        .unwrap();
    store
        .set_tray(
            key("emptied"),
            TrayKey::singleton("t"),
            false,
            doc(json!({"v": 1})),
            10,
        )
        .await
        .unwrap();
    store.delete_instance(key("emptied"), 10).await.unwrap();
    store
        .get_tray(key("recent"), TrayKey::singleton("t"), 500)
        .await
        .unwrap();

    assert_eq!(store.reclaim_fences(100, 0).await.unwrap(), 0, "limit 0");
    assert_eq!(
        store.reclaim_fences(100, 2).await.unwrap(),
        2,
        "the limit holds"
    );
    assert_eq!(store.reclaim_fences(100, 10).await.unwrap(), 2, "the rest");
    assert_eq!(
        store.reclaim_fences(100, 10).await.unwrap(),
        0,
        "nothing left"
    );

    // Reclaimed: an instance never seen again (epoch 0), so any epoch acquires it.
    for id in ["read-1", "read-2", "read-3", "emptied"] {
        assert_eq!(
            store
                .get_tray(key(id), TrayKey::singleton("t"), 1)
                .await
                .unwrap(),
            None,
            "{id} acquires at epoch 1 once its fence went"
        );
    }
    // Kept: the written instance and the recent one still fence older epochs out.
    assert_fence_lost(
        store
            .get_tray(key("written"), TrayKey::singleton("t"), 9)
            .await,
        &format!("{ns}/written"),
        9,
    );
    assert_eq!(
        store
            .get_tray(key("written"), TrayKey::singleton("t"), 10)
            .await
            .unwrap()
            .map(|t| t.doc),
        Some(doc(json!({"v": 1}))),
        "a written instance keeps its rows"
    );
    assert_fence_lost(
        store
            .get_tray(key("recent"), TrayKey::singleton("t"), 499)
            .await,
        &format!("{ns}/recent"),
        499,
    );
}
