//! The conformance suite on `SqliteStore`, plus what only a file store has to show:
//! state survives closing and reopening the file.

#![allow(clippy::unwrap_used)] // tests may panic on the unexpected

use std::sync::Arc;

use pinned_store::conformance::{doc, Fixture};
use pinned_store::{
    InstanceKey, SqliteOptions, SqliteStore, StateStore, StoreError, SyncMode, TrayKey,
};
use serde_json::json;

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("state.db"), SqliteOptions::default())
        .await
        .expect("open sqlite store");
    let mut fixture = Fixture::new(Arc::new(store));
    fixture.keep = Some(Box::new(dir));
    fixture
}

pinned_store::conformance_tests!(fixture);

#[tokio::test]
async fn survives_reopen() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("state.db");
    let store = SqliteStore::open(&path, SqliteOptions::default()).await?;
    store
        .set_tray(
            InstanceKey::new("/n", "a"),
            TrayKey::singleton("t"),
            true,
            doc(json!({"v": 1})),
            4,
        )
        .await?;
    store
        .apply_batch(
            InstanceKey::new("/n", "a"),
            vec![pinned_store::BatchOp::set(
                "t",
                "k",
                false,
                doc(json!({"v": 2})),
            )],
            4,
        )
        .await?;
    store.close().await;

    let store = SqliteStore::open(&path, SqliteOptions::default()).await?;
    let rows = store
        .list(InstanceKey::new("/n", "a"), 4, None, None)
        .await?;
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].tray_id, "k");
    assert_eq!(rows[1].doc, doc(json!({"v": 1})));
    assert!(rows[1].marked);
    // The epoch survived too.
    let err = store
        .get_tray(InstanceKey::new("/n", "a"), TrayKey::singleton("t"), 3)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::FenceLost { epoch: 3, .. }));
    store.close().await;
    Ok(())
}

#[tokio::test]
async fn survives_drop_without_close() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("state.db");
    {
        let store = SqliteStore::open(&path, SqliteOptions::default()).await?;
        store
            .set_tray(
                InstanceKey::new("/n", "a"),
                TrayKey::singleton("t"),
                false,
                doc(json!({"v": 1})),
                1,
            )
            .await?;
    }
    let store = SqliteStore::open(
        &path,
        SqliteOptions {
            sync: SyncMode::Normal,
            ..SqliteOptions::default()
        },
    )
    .await?;
    let tray = store
        .get_tray(InstanceKey::new("/n", "a"), TrayKey::singleton("t"), 1)
        .await?;
    assert_eq!(tray.map(|t| t.doc), Some(doc(json!({"v": 1}))));
    Ok(())
}

#[tokio::test]
async fn two_stores_share_one_file() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("state.db");
    let a = SqliteStore::open(&path, SqliteOptions::default()).await?;
    let b = SqliteStore::open(&path, SqliteOptions::default()).await?;
    a.set_tray(
        InstanceKey::new("/n", "x"),
        TrayKey::singleton("t"),
        false,
        doc(json!({})),
        2,
    )
    .await?;
    let err = b
        .set_tray(
            InstanceKey::new("/n", "x"),
            TrayKey::singleton("t"),
            false,
            doc(json!({})),
            1,
        )
        .await
        .unwrap_err();
    assert!(err.is_fence_lost());
    Ok(())
}

#[tokio::test]
async fn rows_are_stamped_and_shaped_like_postgres() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("state.db");
    let store = SqliteStore::open(
        &path,
        SqliteOptions {
            env: "prod".into(),
            hostname: "w1".into(),
            ..SqliteOptions::default()
        },
    )
    .await?;
    store
        .set_tray(
            InstanceKey::new("/n", "a"),
            TrayKey::singleton("t"),
            true,
            doc(json!({"v": 1})),
            7,
        )
        .await?;
    store.close().await;
    let conn = rusqlite::Connection::open(&path)?;
    let (marked, text, env, host): (bool, String, String, String) = conn.query_row(
        "SELECT marked, doc, env, hostname FROM pinned_tray_index WHERE ns='/n' AND id='a'",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )?;
    assert!(marked);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&text)?,
        json!({"v": 1})
    );
    assert_eq!((env.as_str(), host.as_str()), ("prod", "w1"));
    let epoch: i64 = conn.query_row(
        "SELECT epoch FROM pinned_epoch WHERE ns='/n' AND id='a'",
        [],
        |r| r.get(0),
    )?;
    assert_eq!(epoch, 7);
    Ok(())
}

#[tokio::test]
async fn the_scans_report_the_world_that_wrote_each_row() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let options = SqliteOptions {
        env: "staging".into(),
        hostname: "shop.test".into(),
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open(dir.path().join("state.db"), options).await?;
    let a = InstanceKey::new("/n", "a");
    store
        .set_tray(a, TrayKey::singleton("t"), true, doc(json!({})), 1)
        .await?;
    store
        .set_tray(a, pinned_store::ALARM_TRAY, false, doc(json!({"at": 1})), 1)
        .await?;
    let world = pinned_store::WorldStamp::new("shop.test", "staging");
    let marked = store.marked_instances(None, 10).await?;
    assert_eq!(marked.len(), 1);
    assert_eq!(marked[0].world, world);
    let due = store.due_alarms(10, 10).await?;
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].world, world);
    Ok(())
}

#[tokio::test]
async fn reclaim_fences_spares_written_and_recent_instances() {
    let fixture = fixture().await;
    pinned_store::conformance::reclaim_fences_spares_written_and_recent_instances(
        fixture.store.clone(),
        &fixture.ns,
    )
    .await;
}
