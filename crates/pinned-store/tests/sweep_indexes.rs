//! The sweeper's indexes on `PostgresStore` (real Postgres at `PINNED_TEST_DATABASE_URL`):
//! built by `setup`, named by the plan of both scans (custom and generic) over enough rows
//! that the server would scan the table otherwise, a page reading about `limit` rows, the
//! same answers with and without them, concurrent builds, the repair of what a failed
//! build left behind, the migration of a table in the earlier layout (the alarm index on
//! an expression over `doc`), and tray row writes that are HOT updates, the store's and
//! the Python reference's statements alike.
//!
//! Each test works in a schema of its own (the store's transaction hook sets the
//! `search_path`), dropped at the end, so its rows never meet other tests' or a sweeper's.
//! These tests fail (never skip) when Postgres is unreachable.

#![allow(clippy::unwrap_used)] // tests may panic on the unexpected

use std::time::Duration;

use pinned_store::conformance::database_url;
use pinned_store::{
    IndexState, InstanceKey, PlanChoice, PostgresOptions, PostgresStore, StateStore,
    SweepIndexBuild, SweepScan, TrayKey, ALARM_DUE_INDEX, MARKED_INDEX, RETIRED_ALARM_INDEX,
    TRAY_INDEX_FILLFACTOR,
};
use serde_json::Value;
use tokio_postgres::NoTls;

/// How long a build on a test table may take: it first waits for every older
/// transaction in the database, and other tests hold some for seconds.
const BUILD_PATIENCE: Duration = Duration::from_secs(60);

/// A schema of the test's own, dropped when this goes out of scope.
struct Schema {
    name: String,
    client: tokio_postgres::Client,
}

impl Schema {
    async fn new(prefix: &str) -> Self {
        let name = format!("pst_{prefix}_{}", std::process::id());
        let (client, conn) = tokio_postgres::connect(&database_url(), NoTls)
            .await
            .expect("Postgres must be reachable at PINNED_TEST_DATABASE_URL");
        tokio::spawn(conn);
        client
            .batch_execute(&format!(
                "SET client_min_messages = warning; \
                 DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}"
            ))
            .await
            .expect("create the schema");
        Self { name, client }
    }

    fn options(&self) -> PostgresOptions {
        PostgresOptions {
            transaction_sql: Some(format!("SET LOCAL search_path = {}", self.name)),
            ..PostgresOptions::default()
        }
    }

    /// A store on this schema (its tables created; its index build started).
    async fn store(&self) -> PostgresStore {
        PostgresStore::open(&database_url(), self.options())
            .await
            .expect("open the store")
    }

    async fn exec(&self, sql: &str) {
        self.client
            .batch_execute(&format!("SET search_path = {}; {sql}", self.name))
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// `(index name, valid)` of every index on the schema's tray table.
    async fn indexes(&self) -> Vec<(String, bool)> {
        self.client
            .query(
                "SELECT c.relname::text, i.indisvalid FROM pg_index i \
                 JOIN pg_class c ON c.oid = i.indexrelid \
                 WHERE i.indrelid = ($1 || '.pinned_tray_index')::regclass ORDER BY 1",
                &[&self.name],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name);
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async move {
                let (client, conn) = tokio_postgres::connect(&database_url(), NoTls)
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::spawn(conn);
                client.batch_execute(&sql).await.map_err(|e| e.to_string())
            })
        })
        .join();
        if let Ok(Err(err)) = dropped {
            eprintln!("dropping the test schema failed: {err}");
        }
    }
}

/// Waits until both indexes are built (by `setup`'s background build or any other).
async fn indexes_built(store: &PostgresStore) {
    test_support::eventually("the sweeper indexes", BUILD_PATIENCE, || async {
        store.sweep_indexes().await.unwrap().ready().then_some(())
    })
    .await;
}

/// `build_sweep_indexes`, once no other build holds the lock (`setup`'s may still be
/// letting go of it).
async fn build(store: &PostgresStore) -> Result<SweepIndexBuild, pinned_store::StoreError> {
    test_support::eventually("the build lock", BUILD_PATIENCE, || async {
        match store.build_sweep_indexes().await {
            Ok(SweepIndexBuild::Busy) => None,
            other => Some(other),
        }
    })
    .await
}

/// 20 000 instances of 10 rows (200 000 rows): nine `kv` rows each, `k0` marked on every
/// 50th instance and `k1` too (by another world) on every 100th; an alarm row on every
/// 4th, due (`at` = 1000 + i) on every 400th, the rest far in the future.
const FILL: &str = "\
INSERT INTO pinned_tray_index (ns, id, tray_ns, tray_id, marked, doc, hostname) \
SELECT '/sweep', 'i' || lpad(i::text, 6, '0'), 'kv', 'k' || k, \
  (k = 0 AND i % 50 = 0) OR (k = 1 AND i % 100 = 0), jsonb_build_object('v', i), \
  CASE WHEN k = 1 THEN 'shop.test' ELSE '*' END \
FROM generate_series(1, 20000) i, generate_series(0, 8) k; \
INSERT INTO pinned_tray_index (ns, id, tray_ns, tray_id, marked, doc) \
SELECT '/sweep', 'i' || lpad(i::text, 6, '0'), 'pinned', 'alarm', false, \
  jsonb_build_object('at', CASE WHEN i % 400 = 0 THEN 1000 + i ELSE 4000000000000 + i END, \
    'nonce', 'n' || i) \
FROM generate_series(4, 20000, 4) i; \
INSERT INTO pinned_tray_index (ns, id, tray_ns, tray_id, marked, doc) \
SELECT '/sweep', 'j' || i, 'kv', 'k', false, '{}' FROM generate_series(1, 5000) i;";

/// Alarm rows the scan must skip or read oddly, all due: a string, a fraction, numbers
/// beyond `bigint`, a non-string nonce, a negative time.
const ODD_ALARMS: &str = "\
INSERT INTO pinned_tray_index (ns, id, tray_ns, tray_id, marked, doc) VALUES \
('/sweep', 'odd-string', 'pinned', 'alarm', false, '{\"at\": \"soon\"}'), \
('/sweep', 'odd-fraction', 'pinned', 'alarm', false, '{\"at\": 1.5}'), \
('/sweep', 'odd-huge', 'pinned', 'alarm', false, '{\"at\": -1e30}'), \
('/sweep', 'odd-min', 'pinned', 'alarm', false, '{\"at\": -9223372036854775809}'), \
('/sweep', 'odd-nonce', 'pinned', 'alarm', false, '{\"at\": 7, \"nonce\": 7}'), \
('/sweep', 'odd-negative', 'pinned', 'alarm', false, '{\"at\": -5, \"nonce\": \"x\"}'), \
('/sweep', 'odd-missing', 'pinned', 'alarm', false, '{\"nonce\": \"x\"}');";

/// Every scan node of a JSON plan: `(node type, index name, rows read)`, rows read
/// being the rows it returned plus those its filter removed, over all its loops.
fn scans(plan: &Value) -> Vec<(String, String, f64)> {
    fn walk(node: &Value, out: &mut Vec<(String, String, f64)>) {
        let kind = node["Node Type"].as_str().unwrap_or_default();
        if kind.contains("Scan") {
            let num = |key: &str| node[key].as_f64().unwrap_or(0.0);
            let read =
                (num("Actual Rows") + num("Rows Removed by Filter")) * num("Actual Loops").max(1.0);
            let index = node["Index Name"].as_str().unwrap_or_default();
            out.push((kind.to_owned(), index.to_owned(), read));
        }
        for child in node["Plans"].as_array().into_iter().flatten() {
            walk(child, out);
        }
    }
    let mut out = Vec::new();
    walk(&plan[0]["Plan"], &mut out);
    out
}

/// Asserts `plan` reads `pinned_tray_index` through `index` only; returns the rows read.
fn reads_through(plan: &Value, index: &str, what: &str) -> f64 {
    let scans = scans(plan);
    assert!(
        !scans.is_empty() && scans.iter().all(|(_, name, _)| name == index),
        "{what} must read through {index} only; plan: {plan:#}"
    );
    scans.iter().map(|(_, _, read)| read).sum()
}

#[tokio::test]
async fn both_scans_read_only_through_their_indexes() -> anyhow::Result<()> {
    let schema = Schema::new("sweep_plan").await;
    let store = schema.store().await;
    indexes_built(&store).await;
    schema.exec(FILL).await;
    schema.exec(ODD_ALARMS).await;
    schema.exec("ANALYZE pinned_tray_index").await;

    let scans = [
        (
            SweepScan::DueAlarms {
                due_by_ms: 1_700_000_000_000,
                limit: 10,
            },
            ALARM_DUE_INDEX,
        ),
        (
            SweepScan::MarkedInstances {
                after: None,
                limit: 10,
            },
            MARKED_INDEX,
        ),
        (
            SweepScan::MarkedInstances {
                after: Some(("/sweep", "i010000")),
                limit: 10,
            },
            MARKED_INDEX,
        ),
    ];
    for (scan, index) in scans {
        for plan in [PlanChoice::Custom, PlanChoice::Generic] {
            let explained = store.explain(scan, plan, false).await?;
            reads_through(&explained, index, &format!("{scan:?} ({plan:?})"));
        }
        // Run: a page of 10 reads about 10 rows of the 205 007, however many are due or
        // marked (50 due, 400 marked instances with 600 marked rows).
        let analyzed = store.explain(scan, PlanChoice::Custom, true).await?;
        let read = reads_through(&analyzed, index, &format!("{scan:?}"));
        let bound = match scan {
            // The page, plus the due rows it must skip: the fraction, the one
            // below bigint; -1e30 and the string are outside the index's range.
            SweepScan::DueAlarms { limit, .. } => limit + 2,
            // Instances with two marked rows take two index entries.
            SweepScan::MarkedInstances { limit, .. } => 2 * limit + 1,
        };
        assert!(
            read <= bound as f64,
            "{scan:?} read {read} rows, more than {bound}; plan: {analyzed:#}"
        );
    }
    Ok(())
}

/// Every page of the marked scan, `limit` at a time, as the sweeper's cursor walks it.
async fn all_marked(store: &PostgresStore, limit: usize) -> Vec<pinned_store::MarkedInstance> {
    let mut out: Vec<pinned_store::MarkedInstance> = Vec::new();
    loop {
        let after = out.last().map(|m| (m.ns.as_str(), m.id.as_str()));
        let page = store.marked_instances(after, limit).await.unwrap();
        let short = page.len() < limit;
        out.extend(page);
        if short {
            return out;
        }
    }
}

#[tokio::test]
async fn the_scans_answer_the_same_with_and_without_the_indexes() -> anyhow::Result<()> {
    let schema = Schema::new("sweep_same").await;
    let store = schema.store().await;
    indexes_built(&store).await;
    schema.exec(FILL).await;
    schema.exec(ODD_ALARMS).await;
    schema.exec("ANALYZE pinned_tray_index").await;

    let due_by = 4_000_000_010_000;
    let indexed = (
        store.due_alarms(due_by, 10_000).await?,
        store.due_alarms(6_000, 7).await?,
        all_marked(&store, 7).await,
    );
    // 50 due, 2475 far ones up to `due_by`, and two of the odd ones.
    assert_eq!(indexed.0.len(), 50 + 2475 + 2);
    assert_eq!(indexed.0[0].id, "odd-negative");
    assert_eq!(indexed.0[1].nonce, None, "odd-nonce: a number is no nonce");
    assert_eq!(indexed.1.len(), 7);
    assert_eq!(indexed.2.len(), 400);
    let shop = indexed.2.iter().find(|m| m.id == "i000100").unwrap();
    assert_eq!(
        shop.world.hostname, "shop.test",
        "a named world wins over '*'"
    );

    schema
        .exec(&format!(
            "DROP INDEX {ALARM_DUE_INDEX}; DROP INDEX {MARKED_INDEX}"
        ))
        .await;
    let plain = (
        store.due_alarms(due_by, 10_000).await?,
        store.due_alarms(6_000, 7).await?,
        all_marked(&store, 7).await,
    );
    assert_eq!(indexed, plain);
    Ok(())
}

#[tokio::test]
async fn concurrent_starts_build_each_index_once() -> anyhow::Result<()> {
    let schema = Schema::new("sweep_race").await;
    // Tables first, so the stores below race on the build rather than on setup.
    let first = schema.store().await;
    indexes_built(&first).await;
    // Once this gets the lock, `setup`'s build has let go of it.
    assert_eq!(build(&first).await?, SweepIndexBuild::AlreadyReady);
    schema
        .exec(&format!(
            "DROP INDEX {ALARM_DUE_INDEX}; DROP INDEX {MARKED_INDEX}; {FILL}"
        ))
        .await;
    let options = schema.options();
    let builds = (0..4).map(|_| {
        let options = options.clone();
        async move {
            let store = PostgresStore::connect(&database_url(), options)?;
            store.build_sweep_indexes().await
        }
    });
    let outcomes = futures_util::future::try_join_all(builds).await?;
    let built = outcomes
        .iter()
        .filter(|o| matches!(o, SweepIndexBuild::Built { .. }))
        .count();
    assert_eq!(
        built, 1,
        "one builder, the others left it alone: {outcomes:?}"
    );
    indexes_built(&first).await;
    assert_eq!(
        schema.indexes().await,
        [
            (ALARM_DUE_INDEX.to_owned(), true),
            (MARKED_INDEX.to_owned(), true),
            ("pinned_tray_index_pkey".to_owned(), true),
        ]
    );
    Ok(())
}

#[tokio::test]
async fn an_index_a_failed_build_left_invalid_is_built_again() -> anyhow::Result<()> {
    let schema = Schema::new("sweep_repair").await;
    let store = schema.store().await;
    indexes_built(&store).await;
    // A unique index over duplicates fails after its catalog entry committed: what a
    // build cut off midway leaves, under the alarm index's name.
    schema
        .exec(&format!(
            "DROP INDEX {ALARM_DUE_INDEX}; \
             INSERT INTO pinned_tray_index (ns, id, tray_ns, tray_id, marked, doc) \
             VALUES ('/r', 'a', 't', 'x', false, '{{}}'), ('/r', 'b', 't', 'x', false, '{{}}')"
        ))
        .await;
    let failed = schema
        .client
        .batch_execute(&format!(
            "CREATE UNIQUE INDEX CONCURRENTLY {ALARM_DUE_INDEX} \
             ON {}.pinned_tray_index (tray_ns)",
            schema.name
        ))
        .await;
    assert!(failed.is_err(), "the duplicates fail the unique build");
    let before = store.sweep_indexes().await?;
    assert_eq!(before.alarm_due, IndexState::Invalid);
    assert_eq!(before.marked, IndexState::Ready);

    // This build or the store's own background builder (which may still be
    // retrying from setup) repairs it; the definition below tells a repair
    // from the leftover.
    let outcome = build(&store).await?;
    assert!(
        matches!(
            outcome,
            SweepIndexBuild::Built { .. } | SweepIndexBuild::AlreadyReady
        ),
        "{outcome:?}"
    );
    assert!(store.sweep_indexes().await?.ready());
    let definition: String = schema
        .client
        .query_one(
            "SELECT pg_get_indexdef(($1 || '.' || $2)::regclass)",
            &[&schema.name, &ALARM_DUE_INDEX],
        )
        .await?
        .get(0);
    assert!(
        definition.contains("alarm_at") && !definition.contains("UNIQUE"),
        "the leftover was replaced by the sweeper's index: {definition}"
    );
    assert_eq!(build(&store).await?, SweepIndexBuild::AlreadyReady);
    Ok(())
}

#[tokio::test]
async fn a_name_taken_by_another_relation_fails_the_build_with_its_reason() -> anyhow::Result<()> {
    let schema = Schema::new("sweep_taken").await;
    let store = schema.store().await;
    indexes_built(&store).await;
    schema
        .exec(&format!(
            "DROP INDEX {MARKED_INDEX}; CREATE TABLE {MARKED_INDEX} (x int)"
        ))
        .await;
    let err = build(&store).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("does another relation take the name"),
        "{err}"
    );
    assert_eq!(store.sweep_indexes().await?.marked, IndexState::Missing);
    Ok(())
}

/// The Python reference's row write (`pinned/durability/postgres.py`, `_apply_tray`),
/// verbatim but for the placeholders.
const PYTHON_UPSERT: &str = "INSERT INTO pinned_tray_index \
(ns, id, tray_ns, tray_id, marked, doc, env, hostname) \
VALUES ($1, $2, $3, $4, $5, $6::text::jsonb, '*', '*') \
ON CONFLICT (ns, id, tray_ns, tray_id) \
DO UPDATE SET marked = EXCLUDED.marked, doc = EXCLUDED.doc, \
env = EXCLUDED.env, hostname = EXCLUDED.hostname";

impl Schema {
    /// Writes a row as the Python reference does.
    async fn python_write(&self, id: &str, tray: (&str, &str), marked: bool, doc: &Value) {
        self.client
            .batch_execute(&format!("SET search_path = {}", self.name))
            .await
            .unwrap();
        self.client
            .execute(
                PYTHON_UPSERT,
                &[&"/mig", &id, &tray.0, &tray.1, &marked, &doc.to_string()],
            )
            .await
            .unwrap();
    }

    /// `(n_tup_upd, n_tup_hot_upd)` of the schema's tray table, as the statistics
    /// collector has them so far.
    async fn updates(&self) -> (i64, i64) {
        self.client
            .batch_execute("SELECT pg_stat_force_next_flush(); SELECT pg_stat_clear_snapshot()")
            .await
            .unwrap();
        let row = self
            .client
            .query_one(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables \
                 WHERE schemaname = $1 AND relname = 'pinned_tray_index'",
                &[&self.name],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    }

    /// The table's storage options (`reloptions`), as one string.
    async fn reloptions(&self) -> String {
        self.client
            .query_one(
                "SELECT coalesce(array_to_string(reloptions, ','), '') FROM pg_class \
                 WHERE oid = ($1 || '.pinned_tray_index')::regclass",
                &[&self.name],
            )
            .await
            .unwrap()
            .get(0)
    }
}

fn doc(value: Value) -> pinned_store::Doc {
    match value {
        Value::Object(doc) => doc,
        other => panic!("a doc is an object, not {other}"),
    }
}

#[tokio::test]
async fn tray_row_writes_are_hot_updates_the_stores_and_the_references_alike() -> anyhow::Result<()>
{
    let schema = Schema::new("sweep_hot").await;
    let store = schema.store().await;
    indexes_built(&store).await;
    assert_eq!(
        schema.reloptions().await,
        format!("fillfactor={TRAY_INDEX_FILLFACTOR}")
    );
    // A tray row written 200 times by the store, its doc growing, its mark kept (the
    // marked index reads `marked`, so a write moving the mark is never HOT).
    let instance = InstanceKey::new("/mig", "hot");
    let tray = TrayKey::singleton("jobs");
    let mut done = Vec::new();
    for n in 0..=200 {
        done.push(format!("job-{n}"));
        store
            .set_tray(
                instance,
                tray,
                true,
                doc(serde_json::json!({ "done": done })),
                1,
            )
            .await?;
    }
    // And 100 times by the Python reference's statement, on another row.
    for n in 0..=100 {
        schema
            .python_write("py", ("jobs", "~"), true, &serde_json::json!({ "n": n }))
            .await;
    }
    // The counters reach the collector when each backend next reports.
    let (updates, hot) =
        test_support::eventually("the 300 updates counted", BUILD_PATIENCE, || async {
            let (updates, hot) = schema.updates().await;
            (updates >= 300).then_some((updates, hot))
        })
        .await;
    assert_eq!(updates, 300);
    assert!(
        hot >= 270,
        "{hot} of {updates} updates were HOT: an index still reads a column the writes change"
    );
    Ok(())
}

#[tokio::test]
async fn a_table_of_the_earlier_layout_is_migrated_once_and_python_rows_are_swept(
) -> anyhow::Result<()> {
    let schema = Schema::new("sweep_migrate").await;
    // The table as the Python reference creates it, with the alarm index of the
    // earlier layout and alarm rows written before the migration.
    schema
        .exec(&format!(
            "CREATE TABLE pinned_tray_index (\
             ns TEXT NOT NULL, id TEXT NOT NULL, tray_ns TEXT NOT NULL, tray_id TEXT NOT NULL, \
             marked BOOLEAN NOT NULL, doc JSONB NOT NULL, \
             env TEXT NOT NULL DEFAULT '*', hostname TEXT NOT NULL DEFAULT '*', \
             PRIMARY KEY (ns, id, tray_ns, tray_id)); \
             CREATE INDEX {RETIRED_ALARM_INDEX} ON pinned_tray_index ((CASE WHEN \
             jsonb_typeof(doc->'at') = 'number' THEN (doc->>'at')::numeric END), \
             ns COLLATE \"C\", id COLLATE \"C\") WHERE tray_ns = 'pinned' AND tray_id = 'alarm'"
        ))
        .await;
    let alarm = ("pinned", "alarm");
    schema
        .python_write(
            "old-due",
            alarm,
            false,
            &serde_json::json!({"at": 1000, "nonce": "a"}),
        )
        .await;
    schema
        .python_write(
            "old-late",
            alarm,
            false,
            &serde_json::json!({"at": 9_000_000}),
        )
        .await;
    schema
        .python_write(
            "old-due",
            ("jobs", "~"),
            true,
            &serde_json::json!({"queue": [1]}),
        )
        .await;

    let store = schema.store().await;
    indexes_built(&store).await;
    let indexes = schema.indexes().await;
    assert_eq!(
        indexes,
        [
            (ALARM_DUE_INDEX.to_owned(), true),
            ("pinned_tray_index_marked".to_owned(), true),
            ("pinned_tray_index_pkey".to_owned(), true),
        ],
        "the retired alarm index dropped once its successor was built"
    );
    assert_eq!(
        schema.reloptions().await,
        format!("fillfactor={TRAY_INDEX_FILLFACTOR}")
    );
    let due: Vec<String> = store
        .due_alarms(5000, 10)
        .await?
        .into_iter()
        .map(|alarm| alarm.id)
        .collect();
    assert_eq!(
        due,
        ["old-due"],
        "a row written before the migration is found"
    );

    // Written by the reference after it: the trigger keeps the column.
    schema
        .python_write(
            "new-due",
            alarm,
            false,
            &serde_json::json!({"at": 2000, "nonce": "b"}),
        )
        .await;
    schema
        .python_write(
            "old-due",
            alarm,
            false,
            &serde_json::json!({"at": 8_000_000}),
        )
        .await;
    let due: Vec<(String, i64, Option<String>)> = store
        .due_alarms(5000, 10)
        .await?
        .into_iter()
        .map(|alarm| (alarm.id, alarm.at, alarm.nonce))
        .collect();
    assert_eq!(due, [("new-due".to_owned(), 2000, Some("b".to_owned()))]);
    // The reference's reads see its rows as before.
    let listed = schema
        .client
        .query(
            "SELECT tray_ns, tray_id, marked, doc FROM pinned_tray_index \
             WHERE ns = $1 AND id = $2 ORDER BY tray_ns, tray_id",
            &[&"/mig", &"old-due"],
        )
        .await?;
    assert_eq!(listed.len(), 2);
    let queued: Value = listed[0].get(3);
    assert_eq!(queued, serde_json::json!({"queue": [1]}));

    // Idempotent, and an operator's own fill factor stays.
    schema
        .exec("ALTER TABLE pinned_tray_index SET (fillfactor = 60)")
        .await;
    let again = schema.store().await;
    assert!(again.sweep_indexes().await?.ready());
    assert_eq!(schema.reloptions().await, "fillfactor=60");
    assert_eq!(again.due_alarms(5000, 10).await?.len(), 1);
    Ok(())
}
