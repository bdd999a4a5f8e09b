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

use crate::{BatchOp, Doc, StateStore, StoreError, Tray, TrayRow};

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
#[derive(Debug)]
pub struct PostgresCleanup {
    ns: String,
}

impl PostgresCleanup {
    /// Cleans up `ns` on drop.
    pub fn new(ns: &str) -> Self {
        Self { ns: ns.to_owned() }
    }
}

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
            many_instances_in_parallel
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
    assert_eq!(s.get_tray(ns, "a", "t", "~", 1).await.unwrap(), None);
    s.set_tray(ns, "a", "t", "~", false, doc(json!({"n": 1})), 1)
        .await
        .unwrap();
    let want = Tray {
        marked: false,
        doc: doc(json!({"n": 1})),
    };
    assert_eq!(
        s.get_tray(ns, "a", "t", "~", 1).await.unwrap(),
        Some(want.clone())
    );
    // Idempotent upsert.
    s.set_tray(ns, "a", "t", "~", false, doc(json!({"n": 1})), 1)
        .await
        .unwrap();
    assert_eq!(s.get_tray(ns, "a", "t", "~", 1).await.unwrap(), Some(want));
    // Whole-row overwrite: the old doc's keys do not survive.
    s.set_tray(ns, "a", "t", "~", true, doc(json!({"m": [1, 2]})), 1)
        .await
        .unwrap();
    assert_eq!(
        s.get_tray(ns, "a", "t", "~", 1).await.unwrap(),
        Some(Tray {
            marked: true,
            doc: doc(json!({"m": [1, 2]}))
        })
    );
    // Another tray of the same instance is untouched and separate.
    assert_eq!(s.get_tray(ns, "a", "t", "k", 1).await.unwrap(), None);
    s.delete_tray(ns, "a", "t", "~", 1).await.unwrap();
    assert_eq!(s.get_tray(ns, "a", "t", "~", 1).await.unwrap(), None);
    // Idempotent delete, also of a row that never existed.
    s.delete_tray(ns, "a", "t", "~", 1).await.unwrap();
    s.delete_tray(ns, "a", "never", "x", 1).await.unwrap();
    assert!(s.list(ns, "a", 1, None, None).await.unwrap().is_empty());
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
        let got = store.get_tray(ns, "d", "docs", &tray_id, 1).await.unwrap();
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
        store.set_tray(ns, "d", t_ns, t_id, m, d, 1).await.unwrap();
    }
}

/// `list` returns only this instance's rows, byte-ordered by `(tray_ns, tray_id)`, with
/// the two filters ANDed.
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
            ns,
            "i",
            t_ns,
            t_id,
            marked,
            doc(json!({"k": format!("{t_ns}/{t_id}")})),
            3,
        )
        .await
        .unwrap();
    }
    // A row of another instance in the same namespace must not show up.
    s.set_tray(ns, "other", "a", "1", true, doc(json!({})), 3)
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

    let all = keys(s.list(ns, "i", 3, None, None).await.unwrap());
    assert_eq!(all, owned(want.clone()), "all rows in byte order");

    let only_a = keys(s.list(ns, "i", 3, Some("a"), None).await.unwrap());
    assert_eq!(
        only_a,
        owned(want.iter().copied().filter(|r| r.0 == "a").collect())
    );

    let marked = keys(s.list(ns, "i", 3, None, Some(true)).await.unwrap());
    assert_eq!(
        marked,
        owned(want.iter().copied().filter(|r| r.2).collect())
    );

    let unmarked = keys(s.list(ns, "i", 3, None, Some(false)).await.unwrap());
    assert_eq!(
        unmarked,
        owned(want.iter().copied().filter(|r| !r.2).collect())
    );

    let both = keys(s.list(ns, "i", 3, Some("a"), Some(true)).await.unwrap());
    assert_eq!(
        both,
        owned(vec![("a", "1", true), ("a", "2", true)]),
        "filters AND together"
    );
    assert!(
        s.list(ns, "i", 3, Some("b"), Some(true))
            .await
            .unwrap()
            .len()
            == 1
    );
    assert!(s
        .list(ns, "i", 3, Some("none"), None)
        .await
        .unwrap()
        .is_empty());
    assert!(s.list(ns, "fresh", 3, None, None).await.unwrap().is_empty());
}

/// A batch applies its ops in order: later ops see earlier ones, deletes included.
pub async fn batch_applies_in_order(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    s.set_tray(ns, "b", "pre", "x", true, doc(json!({"old": true})), 1)
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
    s.apply_batch(ns, "b", ops, 2).await.unwrap();
    let rows = s.list(ns, "b", 2, None, None).await.unwrap();
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
    s.apply_batch(ns, "b", Vec::new(), 5).await.unwrap();
    assert_fence_lost(
        s.set_tray(ns, "b", "t", "5", false, Doc::new(), 4).await,
        &format!("{ns}/b"),
        4,
    );
    assert_eq!(s.list(ns, "b", 5, None, None).await.unwrap().len(), 2);
}

/// A batch at a superseded epoch fails as a whole and changes nothing.
pub async fn fenced_batch_applies_nothing(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    s.set_tray(ns, "f", "t", "keep", false, doc(json!({"v": "kept"})), 3)
        .await
        .unwrap();
    let ops = vec![
        BatchOp::set("t", "new", true, doc(json!({}))),
        BatchOp::delete("t", "keep"),
    ];
    assert_fence_lost(s.apply_batch(ns, "f", ops, 2).await, &format!("{ns}/f"), 2);
    let rows = s.list(ns, "f", 3, None, None).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].tray_id, "keep");
    assert_eq!(rows[0].doc, doc(json!({"v": "kept"})));
}

/// Every op below the stored epoch fails with `FenceLost` (reference text) and changes
/// nothing; the stored epoch itself still works.
pub async fn fence_lost_on_old_epoch(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    let key = format!("{ns}/x");
    s.set_tray(ns, "x", "t", "~", false, doc(json!({"owner": 2})), 2)
        .await
        .unwrap();
    let err = s
        .set_tray(ns, "x", "t", "~", true, doc(json!({"owner": 1})), 1)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("fence lost for '{key}': epoch 1 was superseded by a newer activation")
    );
    assert!(err.is_fence_lost() && !err.retryable());
    assert_fence_lost(s.delete_tray(ns, "x", "t", "~", 1).await, &key, 1);
    assert_fence_lost(s.get_tray(ns, "x", "t", "~", 1).await, &key, 1);
    assert_fence_lost(s.list(ns, "x", 1, None, None).await, &key, 1);
    assert_fence_lost(s.apply_batch(ns, "x", vec![], 0).await, &key, 0);
    assert_eq!(
        s.get_tray(ns, "x", "t", "~", 2).await.unwrap(),
        Some(Tray {
            marked: false,
            doc: doc(json!({"owner": 2}))
        }),
        "fenced ops changed nothing"
    );
    // Equal epoch keeps working.
    s.delete_tray(ns, "x", "t", "~", 2).await.unwrap();
}

/// Reads acquire the instance too: a read at a newer epoch fences older writers.
pub async fn reads_fence_and_advance(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    assert_eq!(s.get_tray(ns, "r", "t", "~", 5).await.unwrap(), None);
    assert_fence_lost(
        s.set_tray(ns, "r", "t", "~", false, Doc::new(), 4).await,
        &format!("{ns}/r"),
        4,
    );
    assert!(s.list(ns, "r", 7, None, None).await.unwrap().is_empty());
    assert_fence_lost(
        s.get_tray(ns, "r", "t", "~", 6).await,
        &format!("{ns}/r"),
        6,
    );
    s.set_tray(ns, "r", "t", "~", false, Doc::new(), 7)
        .await
        .unwrap();
    // A never-seen instance starts at 0.
    s.set_tray(ns, "zero", "t", "~", false, Doc::new(), 0)
        .await
        .unwrap();
    assert_eq!(s.list(ns, "zero", 0, None, None).await.unwrap().len(), 1);
}

/// The stored epoch only moves up, to any value up to `i64::MAX`; larger epochs are
/// refused before touching the store.
pub async fn epoch_advances_and_is_bounded(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    for epoch in [0, 1, 1, 10, 1 << 40, i64::MAX as u64] {
        s.set_tray(ns, "e", "t", "~", false, doc(json!({"e": epoch})), epoch)
            .await
            .unwrap();
    }
    assert_fence_lost(
        s.get_tray(ns, "e", "t", "~", (1 << 40) + 1).await,
        &format!("{ns}/e"),
        (1 << 40) + 1,
    );
    let too_big = i64::MAX as u64 + 1;
    match s
        .set_tray(ns, "e2", "t", "~", false, Doc::new(), too_big)
        .await
    {
        Err(StoreError::EpochOutOfRange { epoch }) => assert_eq!(epoch, too_big),
        other => panic!("expected EpochOutOfRange, got {other:?}"),
    }
    // The refused epoch left no trace: epoch 0 still works on that instance.
    s.set_tray(ns, "e2", "t", "~", false, Doc::new(), 0)
        .await
        .unwrap();
}

/// Fences are per `(ns, id)`, even where `"<ns>/<id>"` strings coincide.
pub async fn instances_are_isolated(store: Arc<dyn StateStore>, ns: &str) {
    let s = store.as_ref();
    let ns2 = format!("{ns}/a");
    s.set_tray(ns, "a/b", "t", "~", false, doc(json!({"who": 1})), 9)
        .await
        .unwrap();
    // Same key text "<ns>/a/b", different instance: starts at epoch 0.
    s.set_tray(&ns2, "b", "t", "~", false, doc(json!({"who": 2})), 1)
        .await
        .unwrap();
    assert_eq!(
        s.get_tray(ns, "a/b", "t", "~", 9)
            .await
            .unwrap()
            .map(|t| t.doc),
        Some(doc(json!({"who": 1})))
    );
    assert_eq!(
        s.get_tray(&ns2, "b", "t", "~", 1)
            .await
            .unwrap()
            .map(|t| t.doc),
        Some(doc(json!({"who": 2})))
    );
    assert_eq!(s.list(ns, "a", 0, None, None).await.unwrap(), vec![]);
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
                    .set_tray(&ns, "hot", "own", &tray_id, n % 2 == 0, d.clone(), epoch)
                    .await;
                let shared = store
                    .set_tray(&ns, "hot", "shared", "~", false, d, epoch)
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
    let rows = store.list(ns, "hot", winner, None, None).await.unwrap();
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
        .get_tray(ns, "hot", "shared", "~", winner)
        .await
        .unwrap()
        .expect("shared row");
    assert_eq!(
        shared.doc["epoch"],
        json!(winner),
        "last shared write came from a winner"
    );
    assert_fence_lost(
        store.get_tray(ns, "hot", "shared", "~", winner - 1).await,
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
                        &ns,
                        &id,
                        "count",
                        "~",
                        n + 1 < WRITES,
                        doc(json!({"n": n, "i": i})),
                        epoch,
                    )
                    .await
                    .unwrap();
                store
                    .apply_batch(
                        &ns,
                        &id,
                        vec![
                            BatchOp::set("log", format!("{n}"), false, doc(json!({"n": n}))),
                            BatchOp::delete("log", format!("{}", n.wrapping_sub(2))),
                        ],
                        epoch,
                    )
                    .await
                    .unwrap();
            }
            let rows = store.list(&ns, &id, epoch, None, None).await.unwrap();
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
