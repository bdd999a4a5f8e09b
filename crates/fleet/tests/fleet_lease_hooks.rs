//! The lease hooks on a real fleet: with pinboard frozen (SIGSTOP) the
//! worker's lease turns unhealthy and every live instance hears
//! `on_unhealthy`; once pinboard runs again an ack restores it and they
//! hear `on_restored`.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::{client, eventually, get_json, pinboard, rust_worker, wait_workers};

async fn wait_event(c: &reqwest::Client, worker: &str, event: &str) {
    eventually(event, Duration::from_secs(15), || async {
        let events: Value = c
            .get(format!("{worker}/fleet/lease-events"))
            .send()
            .await
            .expect("events")
            .json()
            .await
            .expect("json");
        events
            .as_array()
            .is_some_and(|events| events.iter().any(|e| e == event))
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_pinboard_makes_the_lease_unhealthy_then_restored() {
    // A 6 s lease, healthy until 5 s before its end: a pause of about a
    // second makes it unhealthy, far from expiring.
    let pb = pinboard().args(&["--lease-ttl-ms", "6000"]).start();
    let worker = rust_worker(&pb.url)
        .env("FLEET_LEASE_BUFFER_MS", "5000")
        .start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    get_json(
        &c,
        &format!("{}/counter/h-1/hit", pb.url),
        Duration::from_secs(5),
    )
    .await;
    pb.pause();
    wait_event(&c, &worker.url, "on_unhealthy h-1").await;
    pb.resume();
    wait_event(&c, &worker.url, "on_restored h-1").await;
}
