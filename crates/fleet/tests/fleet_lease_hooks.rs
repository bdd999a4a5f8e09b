//! The lease hooks on a real fleet: with pinboard frozen (SIGSTOP) the
//! worker's lease turns unhealthy and every live instance hears
//! `on_unhealthy`, while a new activation is refused with the in-band
//! "place me elsewhere" NACK (503 `Pinned-Refusal: lease-unhealthy`) and a
//! resident id is still served; once pinboard runs again an ack restores
//! it and they hear `on_restored`.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::{client, eventually, get_json, pinboard, rust_worker, wait_workers, Proc};
use test_support::metrics;

/// `GET <worker><path>` straight to the worker (not through pinboard),
/// attested for `session` as pinboard would.
async fn direct(
    c: &reqwest::Client,
    worker: &Proc,
    session: &str,
    path: &str,
) -> reqwest::Response {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    let token = pinned_wire::attestation::mint(worker.secret(), session, now, None, None);
    c.get(format!("{}{path}", worker.url))
        .header("pinboard-attestation", token)
        .send()
        .await
        .expect("direct request")
}

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
    let rows = wait_workers(&c, &pb.url, 1).await;
    let session = rows[0]["sessionId"].as_str().expect("session").to_owned();
    get_json(
        &c,
        &format!("{}/counter/h-1/hit", pb.url),
        Duration::from_secs(5),
    )
    .await;
    let healthy = metrics::scrape(&c, &worker.url).await;
    assert_eq!(healthy.value("pinned_lease_healthy"), 1.0, "{healthy}");
    pb.pause();
    wait_event(&c, &worker.url, "on_unhealthy h-1").await;
    let unhealthy = metrics::scrape(&c, &worker.url).await;
    assert_eq!(
        metrics::moved(&healthy, &unhealthy, "pinned_lease_healthy"),
        -1.0
    );
    // Unhealthy, not expired: a new id is refused so pinboard places it
    // elsewhere, the resident one keeps serving.
    let refused = direct(&c, &worker, &session, "/counter/h-new/hit").await;
    assert_eq!(refused.status(), 503);
    let header = |name: &str| {
        refused
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(header("pinned-refusal").as_deref(), Some("lease-unhealthy"));
    assert_eq!(header("retry-after").as_deref(), Some("1"));
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["detail"], "lease unhealthy; refusing new activations");
    let resident = direct(&c, &worker, &session, "/counter/h-1/hit").await;
    assert_eq!(resident.status(), 200, "the resident id is still served");
    pb.resume();
    wait_event(&c, &worker.url, "on_restored h-1").await;
    let restored = metrics::scrape(&c, &worker.url).await;
    assert_eq!(
        metrics::moved(&unhealthy, &restored, "pinned_lease_healthy"),
        1.0
    );
}
