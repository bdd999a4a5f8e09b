//! The conformance suite on `PostgresStore` (real Postgres at `PINNED_TEST_DATABASE_URL`,
//! default `postgresql://postgres@127.0.0.1:5432/test`), plus the Postgres-only rules:
//! exact tables, env/hostname stamping, atomic batches, retry only on pooled
//! connections before commit, the transaction deadline, and cancellation.
//!
//! These tests fail (never skip) when Postgres is unreachable.

#![allow(clippy::unwrap_used)] // tests may panic on the unexpected

use std::sync::Arc;
use std::time::Duration;

use pinned_store::conformance::{database_url, doc, unique_ns, Fixture, PostgresCleanup};
use pinned_store::{
    BatchOp, InstanceKey, PostgresOptions, PostgresStore, StateStore, StoreError, TrayKey,
    WorldStamp,
};
use serde_json::json;
use tokio::time::Instant;
use tokio_postgres::NoTls;

async fn fixture() -> Fixture {
    let store = PostgresStore::open(&database_url(), PostgresOptions::default())
        .await
        .expect("Postgres must be reachable at PINNED_TEST_DATABASE_URL");
    let mut fixture = Fixture::new(Arc::new(store));
    fixture.keep = Some(Box::new(PostgresCleanup::new(&fixture.ns)));
    fixture
}

pinned_store::conformance_tests!(fixture);

/// A raw client for inspecting and interfering, outside the store.
async fn raw() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&database_url(), NoTls)
        .await
        .expect("Postgres must be reachable at PINNED_TEST_DATABASE_URL");
    tokio::spawn(conn);
    client
}

/// The test URL with an `application_name` so a test can find its own backends.
fn url_named(name: &str) -> String {
    let base = database_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}application_name={name}")
}

/// What [`lock_waiters`] does with the backends it finds waiting.
#[derive(Clone, Copy)]
enum Waiters {
    /// Only counts them.
    Count,
    /// Terminates them (a failure mid-transaction on a pooled connection).
    Kill,
}

/// Waits (at most 5 s) until a backend named `app` waits on a lock, then
/// answers as `waiters` says: the pids it terminated (none when counting).
async fn lock_waiters(
    client: &tokio_postgres::Client,
    app: &str,
    waiters: Waiters,
    what: &str,
) -> Vec<i32> {
    let sql = match waiters {
        Waiters::Count => {
            "SELECT pid FROM pg_stat_activity \
             WHERE application_name = $1 AND wait_event_type = 'Lock'"
        }
        Waiters::Kill => {
            // In the select list, so only the rows the filter kept are hit.
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = $1 AND wait_event_type = 'Lock'"
        }
    };
    let pids = test_support::eventually(what, Duration::from_secs(5), || async {
        let pids: Vec<i32> = client
            .query(sql, &[&app])
            .await
            .expect("pg_stat_activity")
            .iter()
            .map(|row| row.get(0))
            .collect();
        (!pids.is_empty()).then_some(pids)
    })
    .await;
    match waiters {
        Waiters::Count => Vec::new(),
        Waiters::Kill => pids,
    }
}

/// Terminates every backend named `app`; answers their pids.
async fn kill_backends(client: &tokio_postgres::Client, app: &str) -> Vec<i32> {
    client
        .query(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = $1",
            &[&app],
        )
        .await
        .expect("pg_terminate_backend")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Waits (at most 5 s) until the backends `pids` have exited:
/// `pg_terminate_backend` only signals them.
async fn backends_gone(client: &tokio_postgres::Client, pids: &[i32]) {
    test_support::eventually(
        "the terminated backends to exit",
        Duration::from_secs(5),
        || async {
            let left: i64 = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)",
                    &[&pids],
                )
                .await
                .expect("pg_stat_activity")
                .get(0);
            (left == 0).then_some(())
        },
    )
    .await;
}

async fn store_with(options: PostgresOptions) -> PostgresStore {
    PostgresStore::open(&database_url(), options)
        .await
        .expect("open postgres store")
}

#[tokio::test]
async fn setup_creates_the_reference_tables_exactly() -> anyhow::Result<()> {
    store_with(PostgresOptions::default()).await;
    let client = raw().await;
    let rows = client
        .query(
            "SELECT table_name::text, column_name::text, data_type::text, is_nullable::text, \
             coalesce(column_default::text, '') FROM information_schema.columns \
             WHERE table_name IN ('pinned_epoch', 'pinned_tray_index') \
             AND table_schema = current_schema() ORDER BY table_name, ordinal_position",
            &[],
        )
        .await?;
    let got: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{}.{} {} {} {}",
                r.get::<_, String>(0),
                r.get::<_, String>(1),
                r.get::<_, String>(2),
                r.get::<_, String>(3),
                r.get::<_, String>(4)
            )
        })
        .collect();
    let want = [
        "pinned_epoch.ns text NO ",
        "pinned_epoch.id text NO ",
        "pinned_epoch.epoch bigint NO ",
        "pinned_tray_index.ns text NO ",
        "pinned_tray_index.id text NO ",
        "pinned_tray_index.tray_ns text NO ",
        "pinned_tray_index.tray_id text NO ",
        "pinned_tray_index.marked boolean NO ",
        "pinned_tray_index.doc jsonb NO ",
        "pinned_tray_index.env text NO '*'::text",
        "pinned_tray_index.hostname text NO '*'::text",
        // The store's own, nullable and never named by the reference's statements:
        // the alarm index's key, kept by a trigger (see `ALARM_AT_COLUMN`).
        "pinned_tray_index.alarm_at numeric YES ",
    ];
    assert_eq!(got, want);
    let pk = client
        .query(
            "SELECT tc.table_name::text, string_agg(kcu.column_name::text, ',' \
             ORDER BY kcu.ordinal_position) FROM information_schema.table_constraints tc \
             JOIN information_schema.key_column_usage kcu \
             ON tc.constraint_name = kcu.constraint_name AND tc.table_schema = kcu.table_schema \
             WHERE tc.constraint_type = 'PRIMARY KEY' \
             AND tc.table_name IN ('pinned_epoch', 'pinned_tray_index') \
             AND tc.table_schema = current_schema() GROUP BY tc.table_name ORDER BY 1",
            &[],
        )
        .await?;
    let pk: Vec<(String, String)> = pk.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        pk,
        vec![
            ("pinned_epoch".to_owned(), "ns,id".to_owned()),
            (
                "pinned_tray_index".to_owned(),
                "ns,id,tray_ns,tray_id".to_owned()
            ),
        ]
    );
    Ok(())
}

#[tokio::test]
async fn concurrent_setup_is_safe() -> anyhow::Result<()> {
    let stores: Vec<PostgresStore> = (0..4)
        .map(|_| PostgresStore::connect(&database_url(), PostgresOptions::default()))
        .collect::<Result<_, _>>()?;
    let setups = stores.iter().map(|s| s.setup());
    for result in futures_util::future::join_all(setups).await {
        result?;
    }
    Ok(())
}

#[tokio::test]
async fn rows_are_stamped_with_env_and_hostname() -> anyhow::Result<()> {
    let ns = unique_ns("stamp");
    let _cleanup = PostgresCleanup::new(&ns);
    let plain = store_with(PostgresOptions::default()).await;
    let stamped = store_with(PostgresOptions {
        env: "prod".into(),
        hostname: "worker-1.example".into(),
        ..PostgresOptions::default()
    })
    .await;
    plain
        .set_tray(
            InstanceKey::new(&ns, "a"),
            TrayKey::new("t", "1"),
            false,
            doc(json!({})),
            1,
        )
        .await?;
    stamped
        .set_tray(
            InstanceKey::new(&ns, "a"),
            TrayKey::new("t", "2"),
            true,
            doc(json!({})),
            1,
        )
        .await?;
    let client = raw().await;
    let stamps = |client: tokio_postgres::Client, ns: String| async move {
        let rows = client
            .query(
                "SELECT tray_id, env, hostname FROM pinned_tray_index WHERE ns = $1 ORDER BY tray_id",
                &[&ns],
            )
            .await
            .expect("select stamps");
        let out: Vec<(String, String, String)> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        (client, out)
    };
    let (client, got) = stamps(client, ns.clone()).await;
    assert_eq!(
        got,
        vec![
            ("1".into(), "*".into(), "*".into()),
            ("2".into(), "prod".into(), "worker-1.example".into())
        ]
    );
    // An upsert overwrites the stamps.
    stamped
        .set_tray(
            InstanceKey::new(&ns, "a"),
            TrayKey::new("t", "1"),
            false,
            doc(json!({})),
            1,
        )
        .await?;
    let (_client, got) = stamps(client, ns.clone()).await;
    assert_eq!(
        got[0],
        ("1".into(), "prod".into(), "worker-1.example".into())
    );
    Ok(())
}

/// A marked row `(ns, id, "t", tray_id)` at epoch 1.
async fn marked(
    store: &PostgresStore,
    ns: &str,
    id: &str,
    tray_id: &str,
) -> Result<(), StoreError> {
    store
        .set_tray(
            InstanceKey::new(ns, id),
            TrayKey::new("t", tray_id),
            true,
            doc(json!({})),
            1,
        )
        .await
}

#[tokio::test]
async fn the_scans_report_the_world_that_wrote_each_row() -> anyhow::Result<()> {
    let ns = unique_ns("worlds");
    let _cleanup = PostgresCleanup::new(&ns);
    let plain = store_with(PostgresOptions::default()).await;
    let shop = store_with(PostgresOptions {
        env: "staging".into(),
        hostname: "shop.test".into(),
        ..PostgresOptions::default()
    })
    .await;
    marked(&plain, &ns, "hostless", "1").await?;
    marked(&shop, &ns, "shop", "1").await?;
    // Rows of both worlds: the one naming a hostname wins, whichever came first.
    marked(&plain, &ns, "both", "1").await?;
    marked(&shop, &ns, "both", "2").await?;
    let alarm = doc(json!({"at": -5_000_000_000_000_i64, "nonce": "n"}));
    shop.set_tray(
        InstanceKey::new(&ns, "shop"),
        pinned_store::ALARM_TRAY,
        false,
        alarm,
        1,
    )
    .await?;

    let got: Vec<(String, WorldStamp)> = plain
        .marked_instances(Some((&ns, "")), 100)
        .await?
        .into_iter()
        .filter(|m| m.ns == *ns)
        .map(|m| (m.id, m.world))
        .collect();
    let shop_world = WorldStamp::new("shop.test", "staging");
    assert_eq!(
        got,
        vec![
            ("both".to_owned(), shop_world.clone()),
            ("hostless".to_owned(), WorldStamp::any()),
            ("shop".to_owned(), shop_world.clone()),
        ]
    );
    assert_eq!(got[1].1.hostname(), None);
    assert_eq!(got[2].1.hostname(), Some("shop.test"));
    assert_eq!(got[2].1.env(), Some("staging"));
    let due = plain.due_alarms(-4_000_000_000_000, 1000).await?;
    let ours: Vec<_> = due.into_iter().filter(|a| a.ns == *ns).collect();
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert_eq!(ours[0].world, shop_world);
    Ok(())
}

#[tokio::test]
async fn a_failing_batch_applies_nothing_and_keeps_the_epoch() -> anyhow::Result<()> {
    let ns = unique_ns("atomic");
    let _cleanup = PostgresCleanup::new(&ns);
    let store = store_with(PostgresOptions::default()).await;
    store
        .set_tray(
            InstanceKey::new(&ns, "a"),
            TrayKey::new("t", "keep"),
            false,
            doc(json!({"v": 1})),
            2,
        )
        .await?;
    // Postgres TEXT cannot hold NUL: the second op fails after the first ran.
    let err = store
        .apply_batch(
            InstanceKey::new(&ns, "a"),
            vec![
                BatchOp::set("t", "first", true, doc(json!({}))),
                BatchOp::set("t", "bad\0id", true, doc(json!({}))),
            ],
            5,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Postgres { .. }), "{err:?}");
    assert!(!err.retryable());
    let client = raw().await;
    let epoch: i64 = client
        .query_one(
            "SELECT epoch FROM pinned_epoch WHERE ns = $1 AND id = 'a'",
            &[&ns],
        )
        .await?
        .get(0);
    assert_eq!(epoch, 2, "the epoch advance was rolled back with the batch");
    let rows = store
        .list(InstanceKey::new(&ns, "a"), 2, None, None)
        .await?;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].tray_id, "keep");
    Ok(())
}

#[tokio::test]
async fn killed_idle_connections_are_replaced_on_checkout() -> anyhow::Result<()> {
    let ns = unique_ns("retry");
    let _cleanup = PostgresCleanup::new(&ns);
    let app = format!("pst-retry-{}", std::process::id());
    let store = PostgresStore::open(
        &url_named(&app),
        PostgresOptions {
            pool_size: 2,
            ..PostgresOptions::default()
        },
    )
    .await?;
    store
        .set_tray(
            InstanceKey::new(&ns, "a"),
            TrayKey::singleton("t"),
            false,
            doc(json!({"v": 1})),
            1,
        )
        .await?;
    // Kill every backend of this store behind its back: the pool still holds them.
    let client = raw().await;
    let killed = kill_backends(&client, &app).await;
    assert!(!killed.is_empty());
    backends_gone(&client, &killed).await;
    // The pool's liveness check notices the dead connections and dials anew.
    store
        .set_tray(
            InstanceKey::new(&ns, "a"),
            TrayKey::singleton("t"),
            false,
            doc(json!({"v": 2})),
            1,
        )
        .await?;
    let tray = store
        .get_tray(InstanceKey::new(&ns, "a"), TrayKey::singleton("t"), 1)
        .await?;
    assert_eq!(tray.map(|t| t.doc), Some(doc(json!({"v": 2}))));
    Ok(())
}

#[tokio::test]
async fn a_pooled_connection_dying_mid_transaction_is_retried() -> anyhow::Result<()> {
    let ns = unique_ns("midtxn");
    let _cleanup = PostgresCleanup::new(&ns);
    let app = format!("pst-midtxn-{}", std::process::id());
    let store = Arc::new(
        PostgresStore::open(
            &url_named(&app),
            PostgresOptions {
                pool_size: 2,
                ..PostgresOptions::default()
            },
        )
        .await?,
    );
    // `open` left one pooled connection; the op below checks it out again.
    let mut holder = raw().await;
    let tx = hold_instance_lock(&mut holder, &ns, "a").await;
    let op = {
        let store = store.clone();
        let ns = ns.clone();
        tokio::spawn(async move {
            store
                .set_tray(
                    InstanceKey::new(&ns, "a"),
                    TrayKey::singleton("t"),
                    false,
                    doc(json!({"v": "survived"})),
                    1,
                )
                .await
        })
    };
    // Wait until the op is blocked on the row lock inside its transaction, then kill
    // its backend: a failure before commit on a pooled connection.
    let client = raw().await;
    let killed = lock_waiters(
        &client,
        &app,
        Waiters::Kill,
        "the op to block on the row lock",
    )
    .await;
    // Release the lock only once the kill landed: released first, the op
    // could commit on the connection the test meant to break.
    backends_gone(&client, &killed).await;
    tx.rollback().await?;
    op.await??;
    assert_eq!(
        store
            .get_tray(InstanceKey::new(&ns, "a"), TrayKey::singleton("t"), 1)
            .await?
            .map(|t| t.doc),
        Some(doc(json!({"v": "survived"})))
    );
    Ok(())
}

#[tokio::test]
async fn a_fresh_connection_failing_is_raised() {
    let store = PostgresStore::connect(
        "postgresql://postgres@127.0.0.1:1/test",
        PostgresOptions::default(),
    )
    .expect("config");
    let err = store
        .set_tray(
            InstanceKey::new("/n", "a"),
            TrayKey::singleton("t"),
            false,
            doc(json!({})),
            1,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    assert!(err.retryable());
}

/// Holds the `pinned_epoch` row lock of `(ns, id)` in an open transaction.
async fn hold_instance_lock<'c>(
    client: &'c mut tokio_postgres::Client,
    ns: &str,
    id: &str,
) -> tokio_postgres::Transaction<'c> {
    let tx = client.transaction().await.expect("begin");
    tx.execute(
        "INSERT INTO pinned_epoch (ns, id, epoch) VALUES ($1, $2, 0) ON CONFLICT DO NOTHING",
        &[&ns, &id],
    )
    .await
    .expect("insert");
    tx.query_one(
        "SELECT epoch FROM pinned_epoch WHERE ns = $1 AND id = $2 FOR UPDATE",
        &[&ns, &id],
    )
    .await
    .expect("lock");
    tx
}

#[tokio::test]
async fn lock_timeouts_retry_only_on_pooled_connections() -> anyhow::Result<()> {
    let ns = unique_ns("locked");
    let _cleanup = PostgresCleanup::new(&ns);
    let mut holder = raw().await;
    let lock_timeout = Duration::from_millis(300);
    let store = store_with(PostgresOptions {
        pool_size: 2,
        lock_timeout,
        ..PostgresOptions::default()
    })
    .await;
    // `open` ran setup on one connection, so that one is pooled; use a fresh store
    // whose very first op meets the lock.
    let fresh = PostgresStore::connect(
        &database_url(),
        PostgresOptions {
            pool_size: 1,
            lock_timeout,
            ..PostgresOptions::default()
        },
    )?;
    let tx = hold_instance_lock(&mut holder, &ns, "a").await;

    let started = Instant::now();
    let err = fresh
        .set_tray(
            InstanceKey::new(&ns, "a"),
            TrayKey::singleton("t"),
            false,
            doc(json!({})),
            1,
        )
        .await
        .unwrap_err();
    let fresh_took = started.elapsed();
    match &err {
        StoreError::Postgres { source } => {
            assert_eq!(source.code().map(|c| c.code()), Some("55P03"), "{err}")
        }
        other => panic!("expected a lock timeout, got {other:?}"),
    }
    assert!(err.retryable());
    assert!(
        fresh_took < lock_timeout * 5 / 2,
        "fresh connection was retried: {fresh_took:?}"
    );

    // Warm both pool slots on another instance, then meet the lock on pooled ones:
    // one attempt plus `pool_size` retries.
    let (a, b) = tokio::join!(
        store.set_tray(
            InstanceKey::new(&ns, "warm1"),
            TrayKey::singleton("t"),
            false,
            doc(json!({})),
            1
        ),
        store.set_tray(
            InstanceKey::new(&ns, "warm2"),
            TrayKey::singleton("t"),
            false,
            doc(json!({})),
            1
        )
    );
    a?;
    b?;
    let started = Instant::now();
    let err = store
        .set_tray(
            InstanceKey::new(&ns, "a"),
            TrayKey::singleton("t"),
            false,
            doc(json!({})),
            1,
        )
        .await
        .unwrap_err();
    let pooled_took = started.elapsed();
    assert!(matches!(err, StoreError::Postgres { .. }), "{err:?}");
    assert!(
        pooled_took >= lock_timeout * 3,
        "pooled failure not retried: {pooled_took:?}"
    );
    drop(tx);

    // Once the lock is gone the instance works again.
    store
        .set_tray(
            InstanceKey::new(&ns, "a"),
            TrayKey::singleton("t"),
            false,
            doc(json!({"ok": true})),
            1,
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn the_deadline_bounds_a_transaction() -> anyhow::Result<()> {
    let ns = unique_ns("deadline");
    let _cleanup = PostgresCleanup::new(&ns);
    let mut holder = raw().await;
    let fresh = PostgresStore::connect(
        &database_url(),
        PostgresOptions {
            pool_size: 1,
            txn_deadline: Duration::from_millis(300),
            ..PostgresOptions::default()
        },
    )?;
    let tx = hold_instance_lock(&mut holder, &ns, "a").await;
    let started = Instant::now();
    let err = fresh
        .get_tray(InstanceKey::new(&ns, "a"), TrayKey::singleton("t"), 1)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Deadline { .. }), "{err:?}");
    assert!(err.retryable());
    assert!(started.elapsed() < Duration::from_secs(2));
    tx.rollback().await?;
    // The killed connection was not returned to the pool; a new one serves the next op.
    fresh
        .set_tray(
            InstanceKey::new(&ns, "a"),
            TrayKey::singleton("t"),
            false,
            doc(json!({})),
            1,
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_cancelled_operation_does_not_leak_its_transaction() -> anyhow::Result<()> {
    let ns = unique_ns("cancel");
    let _cleanup = PostgresCleanup::new(&ns);
    let mut holder = raw().await;
    let store = store_with(PostgresOptions {
        pool_size: 1,
        ..PostgresOptions::default()
    })
    .await;
    let tx = hold_instance_lock(&mut holder, &ns, "a").await;
    // The caller gives up while the op waits for the row lock inside its transaction.
    let cancelled = tokio::time::timeout(
        Duration::from_millis(200),
        store.set_tray(
            InstanceKey::new(&ns, "a"),
            TrayKey::singleton("t"),
            false,
            doc(json!({"v": "cancelled"})),
            3,
        ),
    )
    .await;
    assert!(cancelled.is_err());
    tx.commit().await?;
    // The only pool slot must come back clean: this op runs in a fresh transaction.
    let started = Instant::now();
    store
        .set_tray(
            InstanceKey::new(&ns, "b"),
            TrayKey::singleton("t"),
            false,
            doc(json!({})),
            1,
        )
        .await?;
    store
        .set_tray(
            InstanceKey::new(&ns, "a"),
            TrayKey::singleton("t"),
            false,
            doc(json!({"v": 1})),
            1,
        )
        .await?;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        store
            .get_tray(InstanceKey::new(&ns, "a"), TrayKey::singleton("t"), 1)
            .await?
            .map(|t| t.doc),
        Some(doc(json!({"v": 1}))),
        "the cancelled write (epoch 3) never committed"
    );
    Ok(())
}

#[tokio::test]
async fn transaction_sql_runs_in_every_transaction() -> anyhow::Result<()> {
    // The hook puts the tables in a private schema; setup and every op see it.
    let schema = format!("pst_hook_{}", std::process::id());
    let client = raw().await;
    client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        ))
        .await?;
    let store = store_with(PostgresOptions {
        transaction_sql: Some(format!("SET LOCAL search_path = {schema}")),
        ..PostgresOptions::default()
    })
    .await;
    store
        .set_tray(
            InstanceKey::new("/hook", "a"),
            TrayKey::singleton("t"),
            true,
            doc(json!({"v": 1})),
            2,
        )
        .await?;
    let count: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM {schema}.pinned_tray_index WHERE ns = '/hook'"),
            &[],
        )
        .await?
        .get(0);
    assert_eq!(count, 1);
    assert!(store
        .get_tray(InstanceKey::new("/hook", "a"), TrayKey::singleton("t"), 1)
        .await
        .unwrap_err()
        .is_fence_lost());
    // The sweeper indexes `setup` started building there are built before the schema
    // goes: a build still waiting for older transactions could deadlock with the drop.
    test_support::eventually("the sweeper indexes", Duration::from_secs(60), || async {
        store.sweep_indexes().await.unwrap().ready().then_some(())
    })
    .await;
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await?;
    Ok(())
}

/// The one-round-trip write meets an acquirer that holds the epoch row and raises the
/// epoch: it waits, sees the new epoch once the acquirer commits, and writes nothing.
#[tokio::test]
async fn a_write_racing_an_acquirer_is_refused_after_it_commits() -> anyhow::Result<()> {
    let ns = unique_ns("race");
    let _cleanup = PostgresCleanup::new(&ns);
    let app = format!("pst-race-{}", std::process::id());
    let store = Arc::new(PostgresStore::open(&url_named(&app), PostgresOptions::default()).await?);
    store
        .set_tray(
            InstanceKey::new(&ns, "a"),
            TrayKey::singleton("t"),
            false,
            doc(json!({"v": "epoch 4"})),
            4,
        )
        .await?;
    // An acquirer (another worker taking the id over) locks the row and raises it.
    let mut holder = raw().await;
    let tx = holder.transaction().await?;
    tx.query_one(
        "SELECT epoch FROM pinned_epoch WHERE ns = $1 AND id = 'a' FOR UPDATE",
        &[&ns],
    )
    .await?;
    tx.execute(
        "UPDATE pinned_epoch SET epoch = 9 WHERE ns = $1 AND id = 'a'",
        &[&ns],
    )
    .await?;
    let write = {
        let (store, ns) = (store.clone(), ns.clone());
        tokio::spawn(async move {
            store
                .set_tray(
                    InstanceKey::new(&ns, "a"),
                    TrayKey::singleton("t"),
                    false,
                    doc(json!({"v": "late"})),
                    4,
                )
                .await
        })
    };
    // Commit the takeover only once the write waits on its row lock.
    let client = raw().await;
    lock_waiters(
        &client,
        &app,
        Waiters::Count,
        "the write to wait on its row lock",
    )
    .await;
    tx.commit().await?;
    let err = write.await?.unwrap_err();
    assert!(matches!(err, StoreError::FenceLost { .. }), "{err:?}");
    assert_eq!(
        store
            .get_tray(InstanceKey::new(&ns, "a"), TrayKey::singleton("t"), 9)
            .await?
            .map(|t| t.doc),
        Some(doc(json!({"v": "epoch 4"}))),
        "the refused write left no trace"
    );
    Ok(())
}

/// Writes of many instances waiting together leave as one group statement (one
/// flusher here, so every write queued behind the first is grouped); a write the
/// server refuses fails alone, a fenced-out one gets its full transaction (and its
/// `FenceLost`), and every other lands.
#[tokio::test]
async fn a_group_write_fails_only_for_its_own_fault() -> anyhow::Result<()> {
    let ns = unique_ns("group");
    let _cleanup = PostgresCleanup::new(&ns);
    let store = Arc::new(
        store_with(PostgresOptions {
            pool_size: 2,
            ..PostgresOptions::default()
        })
        .await,
    );
    let ids: Vec<String> = (0..40).map(|i| format!("g{i}")).collect();
    for id in ids.iter().chain([&"bad".to_owned(), &"stale".to_owned()]) {
        store
            .set_tray(
                InstanceKey::new(&ns, id),
                TrayKey::singleton("t"),
                true,
                doc(json!({"v": 0})),
                1,
            )
            .await?;
    }
    // A newer owner took "stale": its writer at epoch 1 is fenced out.
    store
        .set_tray(
            InstanceKey::new(&ns, "stale"),
            TrayKey::singleton("t"),
            true,
            doc(json!({"v": "new"})),
            2,
        )
        .await?;

    let mut writes = Vec::new();
    for (n, id) in ids.iter().enumerate() {
        let (store, ns, id) = (store.clone(), ns.clone(), id.clone());
        writes.push(tokio::spawn(async move {
            store
                .set_tray(
                    InstanceKey::new(&ns, &id),
                    TrayKey::singleton("t"),
                    false,
                    doc(json!({ "v": n })),
                    1,
                )
                .await
        }));
    }
    let (s, n) = (store.clone(), ns.clone());
    // jsonb holds no NUL character: the server refuses this document.
    let bad = tokio::spawn(async move {
        s.set_tray(
            InstanceKey::new(&n, "bad"),
            TrayKey::singleton("t"),
            true,
            doc(json!({"v": "\u{0}"})),
            1,
        )
        .await
    });
    let (s, n) = (store.clone(), ns.clone());
    let stale = tokio::spawn(async move {
        s.set_tray(
            InstanceKey::new(&n, "stale"),
            TrayKey::singleton("t"),
            true,
            doc(json!({"v": "old"})),
            1,
        )
        .await
    });
    for write in writes {
        write.await??;
    }
    let bad = bad.await?.unwrap_err();
    assert!(matches!(bad, StoreError::Postgres { .. }), "{bad:?}");
    let stale = stale.await?.unwrap_err();
    assert!(stale.is_fence_lost(), "{stale:?}");

    for (n, id) in ids.iter().enumerate() {
        let tray = store
            .get_tray(InstanceKey::new(&ns, id), TrayKey::singleton("t"), 1)
            .await?
            .unwrap();
        assert_eq!(
            (tray.marked, tray.doc),
            (false, doc(json!({ "v": n }))),
            "{id}"
        );
    }
    let bad = store
        .get_tray(InstanceKey::new(&ns, "bad"), TrayKey::singleton("t"), 1)
        .await?
        .unwrap();
    assert_eq!(
        bad.doc,
        doc(json!({"v": 0})),
        "the refused write left nothing"
    );
    let stale = store
        .get_tray(InstanceKey::new(&ns, "stale"), TrayKey::singleton("t"), 2)
        .await?
        .unwrap();
    assert_eq!(stale.doc, doc(json!({"v": "new"})));
    Ok(())
}

/// One group stuck on a lock (an acquirer elsewhere holds an instance's epoch row) must
/// not hold up the writes of other instances: past the stall bound the next group
/// leaves beside it.
#[tokio::test]
async fn a_stuck_group_does_not_hold_up_other_instances() -> anyhow::Result<()> {
    let ns = unique_ns("stuck");
    let _cleanup = PostgresCleanup::new(&ns);
    let app = format!("stuck-{}", std::process::id());
    let store = Arc::new(PostgresStore::open(&url_named(&app), PostgresOptions::default()).await?);
    let write = |id: &'static str, n: u64| {
        let store = store.clone();
        let ns = ns.clone();
        async move {
            let ops = vec![BatchOp::set("t", "~", true, doc(json!({ "n": n })))];
            store.apply_batch(InstanceKey::new(&ns, id), ops, 1).await
        }
    };
    // Both instances at epoch 1: their next writes take the grouped path.
    write("a", 0).await?;
    write("b", 0).await?;

    let mut holder = raw().await;
    let tx = hold_instance_lock(&mut holder, &ns, "a").await;
    let stuck = tokio::spawn(write("a", 1));
    let watcher = raw().await;
    lock_waiters(
        &watcher,
        &app,
        Waiters::Count,
        "a's group waits on the lock",
    )
    .await;

    // b's write lands while a's group still waits (the lock is held until after).
    tokio::time::timeout(Duration::from_secs(10), write("b", 1))
        .await
        .expect("b's write is not held up by a's stuck group")?;
    assert!(!stuck.is_finished(), "a still waits on the lock");
    tx.rollback().await?;
    stuck.await??;
    for (id, n) in [("a", 1), ("b", 1)] {
        let row = store
            .get_tray(InstanceKey::new(&ns, id), TrayKey::singleton("t"), 1)
            .await?
            .expect("row");
        assert_eq!(row.doc["n"], n, "{id}");
    }
    Ok(())
}

/// Where the server offers lz4, large docs the store writes are stored with it, and
/// read back as written; the column itself keeps the reference's default.
#[tokio::test]
async fn large_docs_are_stored_lz4_compressed_where_offered() -> anyhow::Result<()> {
    let ns = unique_ns("lz4");
    let _cleanup = PostgresCleanup::new(&ns);
    let client = raw().await;
    let offered = client
        .query_opt(
            "SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' \
             AND 'lz4' = ANY(enumvals)",
            &[],
        )
        .await?
        .is_some();
    let store = store_with(PostgresOptions::default()).await;
    let done: Vec<String> = (0..5_000).map(|n| format!("job-{n}")).collect();
    let big = doc(json!({ "done": done }));
    // Both write paths: the full transaction (a first write) and the group (the next).
    for (tray, writes) in [("full", 1), ("grouped", 2)] {
        for _ in 0..writes {
            let ops = vec![BatchOp::set(tray, "~", false, big.clone())];
            store
                .apply_batch(InstanceKey::new(&ns, "a"), ops, 1)
                .await?;
        }
    }
    let rows = client
        .query(
            "SELECT tray_ns, pg_column_compression(doc) FROM pinned_tray_index \
             WHERE ns = $1 ORDER BY tray_ns",
            &[&ns],
        )
        .await?;
    let expected = if offered { "lz4" } else { "pglz" };
    for row in rows {
        let (tray, method): (String, Option<String>) = (row.get(0), row.get(1));
        assert_eq!(method.as_deref(), Some(expected), "{tray}");
    }
    let read = store
        .get_tray(InstanceKey::new(&ns, "a"), TrayKey::singleton("grouped"), 1)
        .await?
        .expect("row");
    assert_eq!(read.doc, big);
    let column: String = client
        .query_one(
            "SELECT attcompression::text FROM pg_attribute \
             WHERE attrelid = 'pinned_tray_index'::regclass AND attname = 'doc'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(column, "", "the schema is untouched");
    Ok(())
}

/// The reclaim spans every namespace: its case runs in a schema of its own.
#[tokio::test]
async fn reclaim_fences_spares_written_and_recent_instances() -> anyhow::Result<()> {
    let schema = format!("pst_reclaim_{}", std::process::id());
    let client = raw().await;
    client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        ))
        .await?;
    let store = Arc::new(
        store_with(PostgresOptions {
            transaction_sql: Some(format!("SET LOCAL search_path = {schema}")),
            ..PostgresOptions::default()
        })
        .await,
    );
    pinned_store::conformance::reclaim_fences_spares_written_and_recent_instances(
        store.clone(),
        &unique_ns("reclaim"),
    )
    .await;
    test_support::eventually("the sweeper indexes", Duration::from_secs(60), || async {
        store.sweep_indexes().await.unwrap().ready().then_some(())
    })
    .await;
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await?;
    Ok(())
}
