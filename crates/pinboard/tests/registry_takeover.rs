//! Hostname bindings with real Python workers: a newer deployment epoch of
//! the same hostname supersedes the older session (which stops for good),
//! and `takeover: "deny"` keeps the incumbent.

mod support;

use std::time::Duration;

use support::{client, get_json, wait_workers, workers, Pinboard, Worker};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_deployment_supersedes_the_old_session() {
    let pb = Pinboard::start(&[]);
    let old = Worker::start_with(
        &pb.url,
        &[("PINNED_HOSTNAME", "app"), ("PINNED_EPOCH", "1")],
    );
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    let before = get_json(
        &c,
        &format!("{}/counter/t/hit", pb.url),
        Duration::from_secs(10),
    )
    .await;
    let old_proc = get_json(&c, &format!("{}/process", old.url), Duration::from_secs(5)).await
        ["process"]
        .clone();
    assert_eq!(before["process"], old_proc);

    let new = Worker::start_with(
        &pb.url,
        &[("PINNED_HOSTNAME", "app"), ("PINNED_EPOCH", "2")],
    );
    let new_proc = get_json(&c, &format!("{}/process", new.url), Duration::from_secs(10)).await
        ["process"]
        .clone();
    // Only the new session remains; the old one never comes back.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let rows = workers(&c, &pb.url).await;
        if rows.len() == 1 && rows[0]["advertiseUrl"] == new.url.as_str() {
            assert_eq!(rows[0]["epoch"], 2);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{rows:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = get_json(
        &c,
        &format!("{}/counter/t/hit", pb.url),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(after["process"], new_proc);
    assert_eq!(after["count"], 1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        workers(&c, &pb.url).await.len(),
        1,
        "the superseded worker re-registered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_keeps_the_incumbent() {
    let pb = Pinboard::start(&[]);
    let old = Worker::start_with(
        &pb.url,
        &[
            ("PINNED_HOSTNAME", "app"),
            ("PINNED_EPOCH", "1"),
            ("PINNED_TAKEOVER", "deny"),
        ],
    );
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    let _new = Worker::start_with(
        &pb.url,
        &[("PINNED_HOSTNAME", "app"), ("PINNED_EPOCH", "2")],
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rows = workers(&c, &pb.url).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["advertiseUrl"], old.url.as_str());
}
