//! The state store failing during writes: every server connection of the
//! scenario's own database killed (`pg_terminate_backend`), five times
//! under load. What a Postgres restart looks like from the workers,
//! without restarting the cluster other suites share. A write that failed
//! was never acknowledged; every acknowledged one survives, and the workers'
//! pools reconnect by themselves.

use std::time::Duration;

use super::support::{client, pinboard, wait_workers};
use super::{Scene, LEASE, PINBOARD_ARGS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connections_killed_during_writes_lose_no_acknowledged_write() {
    let scene = Scene::new("pgkill", 12).await;
    let pb = pinboard().args(&PINBOARD_ARGS).start();
    let _a = scene.worker(&pb.url, &[]);
    let _b = scene.worker(&pb.url, &[]);
    wait_workers(&client(), &pb.url, 2).await;
    let (load, _) = scene.load(&[&pb.url]);
    load.warm(Duration::from_secs(10)).await;

    let mut killed = 0;
    for _ in 0..5 {
        load.rounds(2, LEASE * 4).await;
        killed += scene.db.terminate_backends().await;
    }
    assert!(killed > 0, "no worker connection was ever open");
    load.rounds(5, LEASE * 4).await;
    let summary = scene.finish("postgres-restart", load).await;
    assert_eq!(summary.moved_ids, 0, "{summary:?}");
}
