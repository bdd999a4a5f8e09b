//! Rows and fences shared with the Python reference's `PostgresStateStore` (pinned
//! 0.16.0, driven through `tests/py/xlang.py` by the project's venv Python).
//!
//! Fails (never skips) when Postgres or the venv is missing. The interpreter is
//! `PINNED_TEST_PYTHON`, else `<workspace>/.venv/bin/python`.

#![allow(clippy::unwrap_used)] // tests may panic on the unexpected

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use pinned_store::conformance::{database_url, doc, unique_ns, PostgresCleanup};
use pinned_store::{
    BatchOp, InstanceKey, PostgresOptions, PostgresStore, StateStore, StoreError, Tray, TrayKey,
    TrayRow, WorldStamp,
};
use serde_json::{json, Value};

fn python() -> PathBuf {
    let path = std::env::var_os("PINNED_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python")
        });
    assert!(
        path.exists(),
        "the Python reference venv is required: {} does not exist \
         (create it with `python3 -m venv .venv && .venv/bin/pip install 'pinned[postgres]==0.16.0'`, \
         or set PINNED_TEST_PYTHON)",
        path.display()
    );
    path
}

/// Runs `ops` through the Python store and returns one result object per op.
fn py(env: &str, hostname: &str, ops: Value) -> Vec<Value> {
    py_on(&database_url(), env, hostname, ops)
}

/// [`py`] on the database at `dsn`.
fn py_on(dsn: &str, env: &str, hostname: &str, ops: Value) -> Vec<Value> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/xlang.py");
    let arg = json!({"env": env, "hostname": hostname, "ops": ops}).to_string();
    let out = Command::new(python())
        .arg(&script)
        .arg(dsn)
        .arg(arg)
        .output()
        .expect("run the Python reference");
    assert!(
        out.status.success(),
        "python failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("python prints a JSON array")
}

fn ok(result: &Value) -> &Value {
    result
        .get("ok")
        .unwrap_or_else(|| panic!("python op failed: {result}"))
}

fn rows_to_json(rows: &[TrayRow]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| json!({"tray_ns": r.tray_ns, "tray_id": r.tray_id, "marked": r.marked, "doc": r.doc}))
            .collect(),
    )
}

async fn rust_store(env: &str, hostname: &str) -> PostgresStore {
    PostgresStore::open(
        &database_url(),
        PostgresOptions {
            env: env.into(),
            hostname: hostname.into(),
            ..PostgresOptions::default()
        },
    )
    .await
    .expect("Postgres must be reachable at PINNED_TEST_DATABASE_URL")
}

async fn stamps(ns: &str, id: &str) -> Vec<(String, String, String)> {
    let (client, conn) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    client
        .query(
            "SELECT tray_ns || '/' || tray_id, env, hostname FROM pinned_tray_index \
             WHERE ns = $1 AND id = $2 ORDER BY (tray_ns || '/' || tray_id) COLLATE \"C\"",
            &[&ns, &id],
        )
        .await
        .expect("select")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

fn rich_doc() -> Value {
    json!({
        "~v": 2,
        "~inbox": [{"~admit": "x", "n": 1}, {"n": 2.5}],
        "text": "héllo ✓ \u{1F600} \"q\" \\ \n",
        "big": 9007199254740993u64,
        "neg": -42,
        "nested": {"a": {"b": [true, false, null]}},
        "": ""
    })
}

#[tokio::test]
async fn rows_written_by_python_read_back_in_rust() -> anyhow::Result<()> {
    let ns = unique_ns("py2rs");
    let _cleanup = PostgresCleanup::new(&ns);
    let store = rust_store("*", "*").await;
    let results = py(
        "py-env",
        "py-host",
        json!([
            {"op": "set", "ns": ns, "id": "a", "tray_ns": "inbox", "tray_id": "~",
             "marked": true, "doc": rich_doc(), "epoch": 3},
            {"op": "set", "ns": ns, "id": "a", "tray_ns": "kv", "tray_id": "k2",
             "marked": false, "doc": {"v": 2}, "epoch": 3},
            {"op": "batch", "ns": ns, "id": "a", "epoch": 3, "ops": [
                ["kv", "k1", false, {"v": 1}],
                ["kv", "gone", true, {}],
                ["kv", "gone", null, null],
                ["Kv", "upper", true, {"case": "sorted before lower"}]
            ]},
            {"op": "list", "ns": ns, "id": "a", "epoch": 3},
        ]),
    );
    for r in &results {
        ok(r);
    }
    let rows = store
        .list(InstanceKey::new(&ns, "a"), 3, None, None)
        .await?;
    let want = vec![
        TrayRow {
            tray_ns: "Kv".into(),
            tray_id: "upper".into(),
            marked: true,
            doc: doc(json!({"case": "sorted before lower"})),
        },
        TrayRow {
            tray_ns: "inbox".into(),
            tray_id: "~".into(),
            marked: true,
            doc: doc(rich_doc()),
        },
        TrayRow {
            tray_ns: "kv".into(),
            tray_id: "k1".into(),
            marked: false,
            doc: doc(json!({"v": 1})),
        },
        TrayRow {
            tray_ns: "kv".into(),
            tray_id: "k2".into(),
            marked: false,
            doc: doc(json!({"v": 2})),
        },
    ];
    assert_eq!(rows, want);
    // Python lists in the same order with the same values.
    assert_eq!(ok(&results[3]), &rows_to_json(&rows));
    assert_eq!(
        store
            .get_tray(InstanceKey::new(&ns, "a"), TrayKey::singleton("inbox"), 3)
            .await?,
        Some(Tray {
            marked: true,
            doc: doc(rich_doc())
        })
    );
    assert_eq!(
        store
            .list(InstanceKey::new(&ns, "a"), 3, Some("kv"), Some(false))
            .await?
            .len(),
        2
    );
    // Python's epoch 3 is stored: Rust at 2 is fenced, with the same text.
    let err = store
        .list(InstanceKey::new(&ns, "a"), 2, None, None)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("fence lost for '{ns}/a': epoch 2 was superseded by a newer activation")
    );
    assert!(stamps(&ns, "a")
        .await
        .iter()
        .all(|(_, e, h)| e == "py-env" && h == "py-host"));
    Ok(())
}

#[tokio::test]
async fn rows_written_by_rust_read_back_in_python() -> anyhow::Result<()> {
    let ns = unique_ns("rs2py");
    let _cleanup = PostgresCleanup::new(&ns);
    let store = rust_store("rs-env", "rs-host").await;
    store
        .set_tray(
            InstanceKey::new(&ns, "b"),
            TrayKey::singleton("inbox"),
            true,
            doc(rich_doc()),
            5,
        )
        .await?;
    store
        .apply_batch(
            InstanceKey::new(&ns, "b"),
            vec![
                BatchOp::set("kv", "k1", false, doc(json!({"v": 1}))),
                BatchOp::set("kv", "gone", false, doc(json!({}))),
                BatchOp::tray("kv", "gone", None, doc(json!({}))),
                BatchOp::set("Kv", "upper", true, doc(json!({}))),
            ],
            5,
        )
        .await?;
    store
        .set_tray(
            InstanceKey::new(&ns, "b"),
            TrayKey::new("kv", "dead"),
            false,
            doc(json!({})),
            5,
        )
        .await?;
    store
        .delete_tray(InstanceKey::new(&ns, "b"), TrayKey::new("kv", "dead"), 5)
        .await?;
    let rust_rows = store
        .list(InstanceKey::new(&ns, "b"), 5, None, None)
        .await?;

    let results = py(
        "*",
        "*",
        json!([
            {"op": "list", "ns": ns, "id": "b", "epoch": 5},
            {"op": "get", "ns": ns, "id": "b", "tray_ns": "inbox", "tray_id": "~", "epoch": 5},
            {"op": "list", "ns": ns, "id": "b", "epoch": 5, "tray_ns": "kv", "marked": false},
            {"op": "get", "ns": ns, "id": "b", "tray_ns": "kv", "tray_id": "gone", "epoch": 5},
            {"op": "get", "ns": ns, "id": "b", "tray_ns": "inbox", "tray_id": "~", "epoch": 4},
        ]),
    );
    assert_eq!(ok(&results[0]), &rows_to_json(&rust_rows));
    assert_eq!(ok(&results[1]), &json!({"marked": true, "doc": rich_doc()}));
    assert_eq!(
        ok(&results[2]),
        &json!([{"tray_ns": "kv", "tray_id": "k1", "marked": false, "doc": {"v": 1}}])
    );
    assert_eq!(ok(&results[3]), &Value::Null);
    // Python at epoch 4 is fenced by Rust's 5, with the text Rust would have produced.
    let fence = &results[4];
    assert_eq!(fence["error"], "FenceLost", "{fence}");
    assert_eq!(fence["key"], json!(format!("{ns}/b")));
    assert_eq!(fence["epoch"], json!(4));
    assert_eq!(
        fence["message"],
        json!(StoreError::fence_lost(InstanceKey::new(&ns, "b"), 4).to_string())
    );
    let stamped = stamps(&ns, "b").await;
    assert_eq!(stamped.len(), 3);
    assert!(
        stamped
            .iter()
            .all(|(_, e, h)| e == "rs-env" && h == "rs-host"),
        "{stamped:?}"
    );
    Ok(())
}

#[tokio::test]
async fn python_is_fenced_after_rust_advances_the_epoch() -> anyhow::Result<()> {
    let ns = unique_ns("fence");
    let _cleanup = PostgresCleanup::new(&ns);
    let store = rust_store("*", "*").await;
    let first = py(
        "*",
        "*",
        json!([{"op": "set", "ns": ns, "id": "c", "tray_ns": "t", "tray_id": "~",
                "marked": false, "doc": {"owner": "python"}, "epoch": 3}]),
    );
    ok(&first[0]);
    // A newer Rust activation only *reads* at epoch 9: that alone fences Python out.
    let seen = store
        .get_tray(InstanceKey::new(&ns, "c"), TrayKey::singleton("t"), 9)
        .await?;
    assert_eq!(seen.map(|t| t.doc), Some(doc(json!({"owner": "python"}))));
    let results = py(
        "*",
        "*",
        json!([
            {"op": "set", "ns": ns, "id": "c", "tray_ns": "t", "tray_id": "~",
             "marked": true, "doc": {"owner": "stale python"}, "epoch": 3},
            {"op": "batch", "ns": ns, "id": "c", "epoch": 8, "ops": [["t", "~", null, null]]},
            {"op": "delete", "ns": ns, "id": "c", "tray_ns": "t", "tray_id": "~", "epoch": 8},
            {"op": "set", "ns": ns, "id": "c", "tray_ns": "t", "tray_id": "new",
             "marked": false, "doc": {"owner": "python at 9"}, "epoch": 9},
        ]),
    );
    for (i, epoch) in [(0, 3), (1, 8), (2, 8)] {
        assert_eq!(results[i]["error"], "FenceLost", "{}", results[i]);
        assert_eq!(results[i]["epoch"], json!(epoch));
    }
    ok(&results[3]);
    let rows = store
        .list(InstanceKey::new(&ns, "c"), 9, None, None)
        .await?;
    assert_eq!(
        rows.iter()
            .map(|r| (r.tray_id.as_str(), r.doc["owner"].clone()))
            .collect::<Vec<_>>(),
        vec![("new", json!("python at 9")), ("~", json!("python"))]
    );
    // And Rust, in turn, is fenced by Python's epoch 10.
    ok(&py(
        "*",
        "*",
        json!([{"op": "list", "ns": ns, "id": "c", "epoch": 10}]),
    )[0]);
    assert!(store
        .list(InstanceKey::new(&ns, "c"), 9, None, None)
        .await
        .unwrap_err()
        .is_fence_lost());
    Ok(())
}

/// The reference's tables with the sweeper's indexes on them, in a schema of their own
/// (`search_path`: the DSN's `options` for Python, the transaction hook for Rust), set up
/// by the reference first or by Rust first. The reference's `setup` runs beside the
/// indexes, its writes (an alarm whose `at` is a string included) go through the index
/// expression, and the indexed scans find its rows.
#[tokio::test]
async fn the_reference_shares_its_tables_with_the_sweeper_indexes() -> anyhow::Result<()> {
    let (raw, conn) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    for python_first in [true, false] {
        let schema = format!("pst_xlang_{}_{python_first}", std::process::id());
        raw.batch_execute(&format!(
            "SET client_min_messages = warning; \
             DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        ))
        .await?;
        let base = database_url();
        let sep = if base.contains('?') { '&' } else { '?' };
        let dsn = format!("{base}{sep}options=-csearch_path%3D{schema}");
        let writes = json!([
            {"op": "set", "ns": "/x", "id": "due", "tray_ns": "pinned", "tray_id": "alarm",
             "marked": false, "doc": {"at": 5, "nonce": "n"}, "epoch": 1},
            {"op": "set", "ns": "/x", "id": "odd", "tray_ns": "pinned", "tray_id": "alarm",
             "marked": false, "doc": {"at": "soon"}, "epoch": 1},
            {"op": "set", "ns": "/x", "id": "busy", "tray_ns": "kv", "tray_id": "k",
             "marked": true, "doc": {}, "epoch": 1},
        ]);
        if python_first {
            py_on(&dsn, "*", "py.test", json!([])); // its setup alone
        }
        let store = PostgresStore::open(
            &database_url(),
            PostgresOptions {
                transaction_sql: Some(format!("SET LOCAL search_path = {schema}")),
                ..PostgresOptions::default()
            },
        )
        .await?;
        test_support::eventually("the sweeper indexes", Duration::from_secs(60), || async {
            store.sweep_indexes().await.unwrap().ready().then_some(())
        })
        .await;
        for result in py_on(&dsn, "*", "py.test", writes) {
            ok(&result);
        }
        let due = store.due_alarms(10, 10).await?;
        assert_eq!(
            due.iter()
                .map(|a| (a.id.as_str(), a.at, a.nonce.as_deref()))
                .collect::<Vec<_>>(),
            [("due", 5, Some("n"))],
            "python first: {python_first}"
        );
        let marked = store.marked_instances(None, 10).await?;
        assert_eq!(marked.len(), 1);
        assert_eq!(marked[0].id, "busy");
        assert_eq!(marked[0].world, WorldStamp::new("py.test", "*"));
        raw.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await?;
    }
    Ok(())
}
