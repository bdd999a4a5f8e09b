//! Cluster calls: a Python instance calls another instance through pinboard
//! and the target sees the attested caller; forged or too-deep cluster
//! headers are refused by pinboard.

mod support;

use std::time::Duration;

use support::{client, get_json, wait_workers, Pinboard, Worker};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_call_reaches_the_target_with_the_attested_caller() {
    let pb = Pinboard::start(&[]);
    let _a = Worker::start(&pb.url);
    let _b = Worker::start(&pb.url);
    let c = client();
    wait_workers(&c, &pb.url, 2).await;
    for i in 0..4 {
        let v = get_json(
            &c,
            &format!("{}/counter/caller-{i}/call/target-{i}", pb.url),
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(v["status"], 200, "{v}");
        assert_eq!(v["target"]["id"], format!("target-{i}"));
        assert_eq!(
            v["target"]["caller"],
            serde_json::json!({"ns": "/counter", "id": format!("caller-{i}"), "depth": 1}),
            "{v}"
        );
    }
    // A plain client request is anonymous.
    let v = get_json(
        &c,
        &format!("{}/counter/target-0/whoami", pb.url),
        Duration::from_secs(5),
    )
    .await;
    assert!(v["caller"].is_null(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_or_too_deep_cluster_calls_are_refused() {
    let pb = Pinboard::start(&[]);
    let c = client();
    let url = format!("{}/counter/x/whoami", pb.url);
    let res = c
        .get(&url)
        .header("pinboard-session", "nope")
        .header("pinboard-session-secret", "guess")
        .header("pinboard-from", "/counter/evil")
        .header("pinboard-subrequest-depth", "1")
        .send()
        .await
        .expect("send");
    assert_eq!(res.status(), 403);
    assert_eq!(
        res.text().await.expect("body"),
        r#"{"detail":"invalid cluster credentials"}"#
    );

    let res = c
        .get(&url)
        .header("pinboard-session", "nope")
        .header("pinboard-session-secret", "guess")
        .header("pinboard-from", "/counter/evil")
        .header("pinboard-subrequest-depth", "51")
        .send()
        .await
        .expect("send");
    assert_eq!(res.status(), 400);
    assert_eq!(
        res.text().await.expect("body"),
        r#"{"detail":"subrequest depth exceeds 50"}"#
    );

    let res = c
        .get(&url)
        .header("pinboard-from", "/counter/evil")
        .send()
        .await
        .expect("send");
    assert_eq!(
        res.status(),
        403,
        "a caller claim without session credentials"
    );
}
