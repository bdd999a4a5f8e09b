//! The idle sweep's cost, on tokio's paused clock: a pass looks only at the
//! instances that are due (and at those touched since they were queued,
//! once), a touched instance outlives an untouched one, and capacity
//! eviction takes the least recently used idle instance.
//!
//! The worker is driven through its router in process, so the clock moves
//! only when a test advances it.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use axum::body::Body;
use pinned::{HostOptions, Options, Worker};
use support::Counter;
use test_support::metrics;
use tower::ServiceExt;

/// Builds and starts a worker hosting `Counter` at `/c` with `options`,
/// its sweep's task running before the clock moves: an activation that
/// needs no wait ends on the requester's task, so requests alone never
/// yield to it, and a sweeper first polled after an advance would tick an
/// interval later than the test counts.
async fn worker(options: HostOptions) -> Worker {
    let worker = Options::new()
        .host_with::<Counter>("/c", options)
        .env_vars(Vec::<(String, String)>::new())
        .build()
        .expect("worker");
    worker.start();
    tokio::task::yield_now().await;
    worker
}

/// One request to instance `id`, answered 200.
async fn touch(worker: &Worker, id: &str) {
    let request = http::Request::post(format!("/c/{id}/increment"))
        .body(Body::empty())
        .expect("request");
    let response = worker.router().oneshot(request).await.expect("infallible");
    assert_eq!(response.status(), 200, "POST /c/{id}/increment");
}

/// The resident ids.
fn resident(worker: &Worker) -> BTreeSet<String> {
    worker.stats()["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .filter_map(|row| row["id"].as_str().map(str::to_owned))
        .collect()
}

/// Moves the paused clock on by `by` in steps of `step`, letting the
/// sweeper run its pass at each.
async fn advance(by: Duration, step: Duration) {
    let mut left = by;
    while !left.is_zero() {
        let now = step.min(left);
        tokio::time::advance(now).await;
        left -= now;
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }
}

/// The sweep passes `worker` has made.
fn passes(worker: &Worker) -> f64 {
    metrics::parse(&worker.metrics()).value("pinned_idle_sweep_passes")
}

/// Moves the paused clock on by `count` sweep intervals of `step`, waiting
/// after each for its pass: the sweeper's ticks are delayed, not skipped,
/// when its task is polled late, so a step that did not wait could leave a
/// pass for the next one.
async fn sweep_passes(worker: &Worker, count: usize, step: Duration) {
    for _ in 0..count {
        let before = passes(worker);
        tokio::time::advance(step).await;
        settle("a sweep pass", || passes(worker) > before).await;
    }
}

/// Lets spawned work (teardowns) run until `done` holds; fails after 10 000
/// yields, with no time passing.
async fn settle(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("{what}: not settled");
}

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test(start_paused = true)]
async fn a_pass_looks_only_at_what_is_due() {
    let w = worker(
        HostOptions::default()
            .idle_timeout(Duration::from_secs(10))
            .sweep_interval(SECOND),
    )
    .await;
    let ids: Vec<String> = (0..100).map(|i| format!("due-{i}")).collect();
    for id in &ids {
        touch(&w, id).await;
    }
    let start = metrics::parse(&w.metrics());
    // Passes at 1 s … 9 s: nothing is due, so nothing is looked at.
    sweep_passes(&w, 9, SECOND).await;
    tokio::time::advance(Duration::from_millis(500)).await;
    let quiet = metrics::parse(&w.metrics());
    assert_eq!(
        metrics::moved(&start, &quiet, "pinned_idle_sweep_passes"),
        9.0
    );
    assert_eq!(
        quiet.value("pinned_idle_sweep_visits"),
        start.value("pinned_idle_sweep_visits"),
        "a pass with nothing due looks at no record"
    );
    // One of them is used again at 9.5 s.
    touch(&w, "due-0").await;
    // The pass at 10 s: the 100 are due by the deadlines they were queued
    // at; the 99 untouched ones are evicted, the touched one is queued
    // again at its new deadline (19.5 s). The pass comes at 10.5 s, when
    // the clock gets there, and the next ones at 11.5 s, 12.5 s, …
    sweep_passes(&w, 1, SECOND).await;
    let due = metrics::parse(&w.metrics());
    assert_eq!(
        metrics::moved(&quiet, &due, "pinned_idle_sweep_visits"),
        100.0
    );
    assert!(metrics::moved(&quiet, &due, "pinned_idle_sweep_seconds") > 0.0);
    settle("the untouched 99 evicted", || resident(&w).len() == 1).await;
    assert_eq!(resident(&w), BTreeSet::from(["due-0".to_owned()]));
    // Nothing is due again until 19.5 s.
    sweep_passes(&w, 8, SECOND).await;
    let waiting = metrics::parse(&w.metrics());
    assert_eq!(
        waiting.value("pinned_idle_sweep_visits"),
        due.value("pinned_idle_sweep_visits"),
    );
    assert_eq!(
        resident(&w).len(),
        1,
        "touched at 9.5 s, idle 10 s at 19.5 s"
    );
    sweep_passes(&w, 2, SECOND).await;
    let last = metrics::parse(&w.metrics());
    assert_eq!(
        metrics::moved(&waiting, &last, "pinned_idle_sweep_visits"),
        1.0
    );
    settle("the touched one evicted in turn", || {
        resident(&w).is_empty()
    })
    .await;
    assert_eq!(w.stats()["namespaces"]["/c"]["evictions"], 100);
}

#[tokio::test(start_paused = true)]
async fn capacity_eviction_takes_the_least_recently_used() {
    let w = worker(
        HostOptions::default()
            .max_instances(3)
            .idle_timeout(Duration::from_secs(60))
            .sweep_interval(SECOND),
    )
    .await;
    // Activated a second apart: a, b, c; then a is used again.
    for id in ["a", "b", "c", "a"] {
        touch(&w, id).await;
        advance(SECOND, SECOND).await;
    }
    // Full: d takes b's room (b was last used at 1 s, c at 2 s, a at 3 s).
    touch(&w, "d").await;
    settle("b evicted", || !resident(&w).contains("b")).await;
    assert_eq!(resident(&w), ["a", "c", "d"].map(str::to_owned).into());
    advance(SECOND, SECOND).await;
    touch(&w, "c").await;
    advance(SECOND, SECOND).await;
    // a (3 s) is now the least recently used: d was used at 4 s, c at 5 s.
    touch(&w, "e").await;
    settle("a evicted", || !resident(&w).contains("a")).await;
    assert_eq!(resident(&w), ["c", "d", "e"].map(str::to_owned).into());
    assert_eq!(w.stats()["namespaces"]["/c"]["evictions"], 2);
}
