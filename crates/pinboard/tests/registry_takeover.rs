//! Hostname bindings with real Python workers: a newer deployment epoch of
//! the same hostname supersedes the older session (which stops for good),
//! and `takeover: "deny"` keeps the incumbent (and reaches no other env).

mod support;

use std::time::Duration;

use serde_json::Value;
use test_support::metrics;

use support::{
    client, eventually, get_json, metric, pinboard, python_worker, wait_workers, workers,
};

/// GET `url` in the `app` hostname world until it answers 200; its body.
async fn get_app(c: &reqwest::Client, url: &str) -> Value {
    let world = [("pinboard-hostname", "app")];
    test_support::get_json_with(c, url, &world, Duration::from_secs(10)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_deployment_supersedes_the_old_session() {
    let pb = pinboard().start();
    let c = client();
    let fresh = metrics::scrape(&c, &pb.url).await;
    let old = python_worker(&pb.url)
        .envs(&[("PINNED_HOSTNAME", "app"), ("PINNED_EPOCH", "1")])
        .start();
    wait_workers(&c, &pb.url, 1).await;
    let one = metrics::scrape(&c, &pb.url).await;
    assert_eq!(metrics::moved(&fresh, &one, "pinboard_registrations"), 1.0);
    assert_eq!(metrics::moved(&fresh, &one, "pinboard_live_workers"), 1.0);
    let before = get_app(&c, &format!("{}/counter/t/hit", pb.url)).await;
    let old_proc = get_json(&c, &format!("{}/process", old.url), Duration::from_secs(5)).await
        ["process"]
        .clone();
    assert_eq!(before["process"], old_proc);

    let new = python_worker(&pb.url)
        .envs(&[("PINNED_HOSTNAME", "app"), ("PINNED_EPOCH", "2")])
        .start();
    let new_proc = get_json(&c, &format!("{}/process", new.url), Duration::from_secs(10)).await
        ["process"]
        .clone();
    // Only the new session remains; the old one never comes back.
    let rows = eventually("the new session alone", Duration::from_secs(10), || async {
        let rows = workers(&c, &pb.url).await;
        (rows.len() == 1 && rows[0]["advertiseUrl"] == new.url.as_str()).then_some(rows)
    })
    .await;
    assert_eq!(rows[0]["epoch"], 2);
    let after = get_app(&c, &format!("{}/counter/t/hit", pb.url)).await;
    assert_eq!(after["process"], new_proc);
    assert_eq!(after["count"], 1);
    let superseded = metrics::scrape(&c, &pb.url).await;
    assert!(metrics::moved(&one, &superseded, "pinboard_registrations") >= 1.0);
    assert_eq!(superseded.value("pinboard_live_workers"), 1.0);
    // Heartbeats go on (the new worker's); the old one never registers again.
    let beats = "pinboard_heartbeats_total";
    test_support::metric_grows(&c, &[&pb.url], beats, 3, Duration::from_secs(10)).await;
    assert_eq!(
        workers(&c, &pb.url).await.len(),
        1,
        "the superseded worker re-registered"
    );
    let later = metrics::scrape(&c, &pb.url).await;
    assert!(metrics::moved(&superseded, &later, "pinboard_heartbeats") >= 3.0);
    assert_eq!(
        later.value("pinboard_registrations"),
        superseded.value("pinboard_registrations")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_keeps_the_incumbent() {
    let pb = pinboard().start();
    let old = python_worker(&pb.url)
        .envs(&[
            ("PINNED_HOSTNAME", "app"),
            ("PINNED_EPOCH", "1"),
            ("PINNED_TAKEOVER", "deny"),
        ])
        .start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    let before = metric(&c, &pb, "pinboard_registry_errors_total").await;
    let _new = python_worker(&pb.url)
        .envs(&[("PINNED_HOSTNAME", "app"), ("PINNED_EPOCH", "2")])
        .start();
    // The newcomer is refused, backs off, and is refused again.
    eventually(
        "two refused registrations",
        Duration::from_secs(20),
        || async {
            (metric(&c, &pb, "pinboard_registry_errors_total").await >= before + 2).then_some(())
        },
    )
    .await;
    let rows = workers(&c, &pb.url).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["advertiseUrl"], old.url.as_str());
    // Another env of the same hostname is another deployment: the deny
    // does not reach it, and it supersedes nobody.
    let staging = python_worker(&pb.url)
        .envs(&[
            ("PINNED_HOSTNAME", "app"),
            ("PINNED_ENV", "staging"),
            ("PINNED_EPOCH", "3"),
        ])
        .start();
    let rows = wait_workers(&c, &pb.url, 2).await;
    for url in [&old.url, &staging.url] {
        assert!(
            rows.iter().any(|r| r["advertiseUrl"] == url.as_str()),
            "{url} missing from {rows:?}"
        );
    }
}
