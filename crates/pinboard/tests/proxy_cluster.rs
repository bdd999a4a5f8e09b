//! Cluster calls: a Python instance calls another instance through pinboard
//! and the target sees the attested caller; forged or too-deep cluster
//! headers are refused by pinboard.

mod support;

use std::time::Duration;

use support::{client, get_json, pinboard, python_worker, wait_workers};
use test_support::metrics;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_call_reaches_the_target_with_the_attested_caller() {
    let pb = pinboard().start();
    let _a = python_worker(&pb.url).start();
    let _b = python_worker(&pb.url).start();
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
    let pb = pinboard().start();
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

/// Sends `n` cluster calls, `concurrency` at a time, with the forged
/// session `session(i)`; every one must be refused 403.
async fn forged_flood(
    c: &reqwest::Client,
    pb: &str,
    n: usize,
    concurrency: usize,
    session: impl Fn(usize) -> String,
) {
    use futures_util::stream::{self, StreamExt};
    let url = format!("{pb}/counter/x/whoami");
    let statuses: Vec<u16> = stream::iter(0..n)
        .map(|i| {
            let req = c
                .get(&url)
                .header("pinboard-session", session(i))
                .header("pinboard-session-secret", "guess")
                .header("pinboard-from", "/counter/evil");
            async move { req.send().await.expect("send").status().as_u16() }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    assert!(statuses.iter().all(|s| *s == 403), "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_cluster_sessions_cost_a_bounded_number_of_store_reads() {
    let redis = support::RedisServer::start();
    let node = pinboard().redis(&redis.url).start();
    let other = pinboard().redis(&redis.url).start();
    let c = client();
    // A real worker, registered through the *other* node.
    let (_w, _) = support::fake::fake(&other.url, "w", support::fake::Mode::Serve).await;

    let scripts = || redis.calls("evalsha");
    let (reads_before, scripts_before) = (metrics::scrape(&c, &node.url).await, scripts().await);
    let started = tokio::time::Instant::now();
    // 2 000 distinct forged sessions, then 2 000 of one forged session.
    forged_flood(&c, &node.url, 2000, 50, |i| format!("bogus{i}")).await;
    forged_flood(&c, &node.url, 2000, 50, |_| "bogus".to_owned()).await;
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let (reads_after, scripts_after) = (metrics::scrape(&c, &node.url).await, scripts().await);
    // At most one forced re-read per 100 ms (the default interval) plus the
    // regular refresh every 500 ms, plus slack for the scrapes.
    let bound = elapsed_ms / 100 + elapsed_ms / 500 + 5;
    // A forged session forces a re-read: at least one.
    let reads = metrics::moved(&reads_before, &reads_after, "pinboard_store_worker_reads") as u64;
    assert!(
        reads <= bound,
        "{reads} worker-list reads for 4 000 forged calls in {elapsed_ms} ms (bound {bound})"
    );
    assert!(reads < 400, "{reads} reads");
    // The same, counted by Redis itself (every store call is a script).
    let scripts = scripts_after - scripts_before;
    assert!(
        scripts <= bound + 10,
        "{scripts} Redis script calls for 4 000 forged calls in {elapsed_ms} ms"
    );

    // A session that has just registered through the other node is
    // recognised at once, and its call goes through.
    let (w, session) = support::fake::fake(&other.url, "w2", support::fake::Mode::Serve).await;
    let res = c
        .get(format!("{}/counter/callee/hit", node.url))
        .header("pinboard-session", &session)
        .header("pinboard-session-secret", &w.identity.secret)
        .header("pinboard-from", "/counter/caller")
        .send()
        .await
        .expect("send");
    assert_eq!(
        res.status(),
        200,
        "{}",
        res.text().await.unwrap_or_default()
    );
    // A session longer than any pinboard mints is refused unread.
    forged_flood(&c, &node.url, 1, 1, |_| "x".repeat(65)).await;
}
