//! A worker adapts to the lease it is granted: with a 3 s lease and the
//! worker's defaults (3 s heartbeat, 5 s lease buffer) it used to be never
//! healthy and every new id answered 503. Now the buffer shrinks to half
//! the lease and the heartbeat to a third, and ids are placed and served.

mod support;

use std::time::Duration;

use support::{client, get_json, pinboard, rust_worker, wait_workers};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_with_default_worker_timing_serves() {
    let pb = pinboard().args(&["--lease-ttl-ms", "3000"]).start();
    let _worker = rust_worker(&pb.url)
        .envs(&[
            ("FLEET_HEARTBEAT_MS", "3000"),
            ("FLEET_LEASE_BUFFER_MS", "5000"),
        ])
        .start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    for i in 0..5 {
        let body = get_json(
            &c,
            &format!("{}/counter/short-{i}/hit", pb.url),
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(body["count"], 1, "short-{i}: {body}");
    }
    // For longer than the lease, every request finds the same live
    // instance: the worker's heartbeats keep up with the short lease.
    let mut pace = tokio::time::interval(Duration::from_millis(200));
    for expected in 2..22 {
        pace.tick().await;
        let answer = c
            .get(format!("{}/counter/short-0/hit", pb.url))
            .send()
            .await
            .expect("hit");
        assert_eq!(answer.status(), 200, "lost the instance at hit {expected}");
        let body: serde_json::Value = answer.json().await.expect("json");
        assert_eq!(body["count"], expected, "short-0 kept its state: {body}");
    }
}
