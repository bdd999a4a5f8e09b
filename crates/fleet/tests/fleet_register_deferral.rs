//! pinboard defers a registration it cannot decide yet with 503 +
//! `Retry-After` (here its Redis does not answer: `CLIENT PAUSE`). The
//! Rust worker takes that as a deferral (wire.md §6.2): its backoff starts
//! from the `Retry-After` instead of its heartbeat interval, each one is
//! counted as `register/deferred` and not as a registration failure, and
//! it registers as soon as pinboard can decide. A refused registration
//! (the wrong token), by contrast, is a registration failure.

mod support;

use std::time::Duration;

use support::{client, eventually, pinboard, rust_worker, wait_workers, RedisServer};
use test_support::metrics;
use tokio::time::Instant;

const DEFERRED: &str = r#"pinned_control_plane_failures{operation="register",reason="deferred"}"#;

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
    let deferred = eventually("two deferred registrations", pause, || async {
        let scrape = metrics::try_scrape(&c, &worker.url).await?;
        (scrape.value(DEFERRED) >= 2.0).then_some(scrape)
    })
    .await;
    let two_deferrals = paused.elapsed();
    assert!(
        two_deferrals < pause,
        "two deferrals took {two_deferrals:?}: the backoff did not start from Retry-After"
    );
    assert_eq!(deferred.value("pinned_registered"), 0.0, "{deferred}");
    wait_workers(&c, &pb.url, 1).await;
    eprintln!(
        "deferral: two 503s within {two_deferrals:?}, registered {:?} after the pause began",
        paused.elapsed()
    );
    let patience = Duration::from_secs(5);
    let registered =
        metrics::wait_moved(&c, &worker.url, &deferred, "pinned_registered", patience).await;
    assert_eq!(
        registered.value("pinned_registration_failures"),
        0.0,
        "a deferral is not a registration failure"
    );
}

/// A registration pinboard refuses (the wrong deployment token) is a
/// registration failure, on the worker and on pinboard, and leaves the
/// worker unregistered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_is_counted_as_a_failure() {
    let pb = pinboard().start();
    let c = client();
    let board = metrics::scrape(&c, &pb.url).await;
    let worker = rust_worker(&pb.url)
        .env("PINBOARD_TOKEN", "not-the-deployment-token")
        .start();
    // Its first attempt goes out before a scrape can: the next ones, on
    // its backoff, must each count.
    let patience = Duration::from_secs(10);
    let first = eventually("a refused registration", patience, || async {
        let scrape = metrics::try_scrape(&c, &worker.url).await?;
        (scrape.value("pinned_registration_failures") > 0.0).then_some(scrape)
    })
    .await;
    let again = metrics::wait_moved(
        &c,
        &worker.url,
        &first,
        "pinned_registration_failures",
        patience,
    )
    .await;
    let unauthorized = metrics::moved(
        &first,
        &again,
        r#"pinned_control_plane_failures{operation="register",reason="unauthorized"}"#,
    );
    assert!(unauthorized >= 1.0);
    assert_eq!(again.value("pinned_registered"), 0.0, "{again}");
    let refused = metrics::scrape(&c, &pb.url).await;
    assert!(metrics::moved(&board, &refused, "pinboard_registry_errors") >= 2.0);
    assert_eq!(refused.value("pinboard_registrations"), 0.0, "{refused}");
}
