//! pinboard defers a registration it cannot decide yet with 503 +
//! `Retry-After` (here its Redis does not answer: `CLIENT PAUSE`). The
//! Rust worker takes that as a deferral (wire.md §6.2): its backoff starts
//! from the `Retry-After` instead of its heartbeat interval, each one is
//! counted as `register/deferred` and not as a registration failure, and
//! it registers as soon as pinboard can decide.

mod support;

use std::time::Duration;

use support::{client, eventually, pinboard, rust_worker, wait_workers, RedisServer};
use test_support::metric;
use tokio::time::Instant;

const DEFERRED: &str =
    r#"pinned_control_plane_failures_total{operation="register",reason="deferred"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_registration_backs_off_from_the_retry_after() {
    let redis = RedisServer::start();
    let pb = pinboard()
        .args(&["--redis-url", &redis.url, "--redis-timeout-ms", "200"])
        .start();
    let c = client();
    // Up, with its store open, before the store stops answering.
    eventually("pinboard ready", Duration::from_secs(10), || async {
        let ready = c.get(format!("{}/readyz", pb.url)).send().await.ok()?;
        ready.status().is_success().then_some(())
    })
    .await;
    let pause = Duration::from_secs(3);
    redis.client_pause(pause).await;
    let paused = Instant::now();
    // A heartbeat interval of 10 s: backing off from it, the second attempt
    // would come 6 s or more after the first; from pinboard's
    // `Retry-After: 1`, within a second.
    let worker = rust_worker(&pb.url)
        .env("FLEET_HEARTBEAT_MS", "10000")
        .start();
    eventually("two deferred registrations", pause, || async {
        (metric(&c, &worker.url, DEFERRED).await >= 2).then_some(())
    })
    .await;
    let two_deferrals = paused.elapsed();
    assert!(
        two_deferrals < pause,
        "two deferrals took {two_deferrals:?}: the backoff did not start from Retry-After"
    );
    wait_workers(&c, &pb.url, 1).await;
    eprintln!(
        "deferral: two 503s within {two_deferrals:?}, registered {:?} after the pause began",
        paused.elapsed()
    );
    assert_eq!(
        metric(&c, &worker.url, "pinned_registration_failures_total").await,
        0,
        "a deferral is not a registration failure"
    );
}
