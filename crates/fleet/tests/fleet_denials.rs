//! Requests that the object's `authorize` denies, behind a real pinboard on
//! Redis: a denial is no instance lifecycle event on the worker (no
//! eviction, no abort, no `aborted instance` line; counted as a denial),
//! and the claim each made is handed back with its placement row at once,
//! not after the row grace. An id that was denied is placed again at a
//! higher epoch when an authorized request comes.

mod support;

use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use support::{client, eventually, pinboard, rust_worker, wait_workers, RedisServer};
use test_support::metrics;

/// Unauthenticated requests sent, the count.
const DENIED: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_requests_leave_no_rows_and_count_no_evictions() {
    let redis = RedisServer::start();
    // The row grace of a one-minute lease (the default is six TTLs):
    // anything waiting for it would outlast the test's deadlines.
    let pb = pinboard()
        .redis(&redis.url)
        .args(&["--placement-grace-ms", "60000"])
        .start();
    let worker = rust_worker(&pb.url)
        .env("FLEET_GUARDED_NS", "/guarded")
        .start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    let fresh = metrics::scrape(&c, &worker.url).await;

    let answers: Vec<(u16, serde_json::Value)> = stream::iter(0..DENIED)
        .map(|i| {
            let request = c.get(format!("{}/guarded/d-{i}/hit", pb.url));
            async move {
                let answer = request.send().await.expect("send");
                let status = answer.status().as_u16();
                (status, answer.json().await.unwrap_or_default())
            }
        })
        .buffer_unordered(10)
        .collect()
        .await;
    for (status, body) in &answers {
        assert_eq!(*status, 401, "{body}");
        assert_eq!(body["message"], "who are you?", "{body}");
    }

    // Every claim is handed back and its row gone, well within the grace.
    eventually(
        "the denied ids' placement rows to go",
        Duration::from_secs(5),
        || async {
            redis
                .keys("pinboard:p:/guarded/*")
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
    assert!(redis.keys("pinboard:o:*").await.is_empty(), "owner indexes");

    // On the worker: denials, not evictions or aborts.
    let denied = metrics::scrape(&c, &worker.url).await;
    assert_eq!(
        metrics::moved(&fresh, &denied, "pinned_auth_denials"),
        DENIED as f64
    );
    for family in [
        "pinned_instance_evictions",
        "pinned_instance_aborts",
        "pinned_instance_activations",
    ] {
        assert_eq!(denied.value(family), 0.0, "{family}: {denied}");
    }
    let board = metrics::scrape(&c, &pb.url).await;
    let stats = support::stats(&c, &worker).await;
    assert_eq!(stats["namespaces"]["/guarded"]["evictions"], 0, "{stats}");
    assert_eq!(stats["instances"], serde_json::json!([]), "{stats}");
    let log = worker.log_text();
    assert!(!log.contains("aborted instance"), "{log}");

    // A caller who names themselves gets the id, freshly activated.
    let answer = c
        .get(format!("{}/guarded/d-0/hit", pb.url))
        .header("x-user", "ada")
        .send()
        .await
        .expect("send");
    assert_eq!(answer.status(), 200);
    let body: serde_json::Value = answer.json().await.expect("json");
    assert_eq!(body["count"], 1, "{body}");
    assert_eq!(redis.keys("pinboard:p:/guarded/*").await.len(), 1);
    let granted = metrics::scrape(&c, &worker.url).await;
    assert_eq!(
        metrics::moved(&denied, &granted, "pinned_instance_activations"),
        1.0
    );
    assert_eq!(
        metrics::moved(&denied, &granted, "pinned_active_instances"),
        1.0
    );
    let placed = metrics::scrape(&c, &pb.url).await;
    assert_eq!(metrics::moved(&board, &placed, "pinboard_placements"), 1.0);
    assert_eq!(
        metrics::moved(&board, &placed, "pinboard_proxy_requests"),
        1.0
    );
}
