//! Durable alarms across a fleet (issue 5): an evicted instance's alarm
//! fires through pinboard's sweeper, a killed owner's alarm fires on
//! another worker, two sweeping pinboards fire each alarm once, and a
//! stale-epoch write after a re-placement is refused while the new owner's
//! state survives.

mod support;

use std::time::Duration;

use pinned_store::conformance::{database_url, unique_ns, PostgresCleanup};
use serde_json::Value;
use support::{client, eventually, get_json, pinboard, redis_prefix, rust_worker, wait_workers};

const SWEEP: &str = "200";

fn sweeping(extra: &[&'static str]) -> Vec<String> {
    let mut args = vec![
        "--database-url".to_owned(),
        database_url(),
        "--sweep-interval-ms".to_owned(),
        SWEEP.to_owned(),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

fn worker_env<'a>(
    ns: &'a str,
    url: &'a str,
    extra: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![("FLEET_NS", ns), ("FLEET_DATABASE_URL", url)];
    env.extend_from_slice(extra);
    env
}

async fn fired(c: &reqwest::Client, base: &str, ns: &str, id: &str) -> Value {
    get_json(
        c,
        &format!("{base}{ns}/{id}/fired"),
        Duration::from_secs(10),
    )
    .await
}

/// Waits until the pinboards at `urls` ran `n` more sweeper laps between
/// them: the window in which an alarm that should not fire again would.
async fn more_laps(c: &reqwest::Client, urls: &[&str], n: u64) {
    let laps = "pinboard_sweep_laps_total";
    test_support::metric_grows(c, urls, laps, n, Duration::from_secs(15)).await;
}

async fn post_ok(c: &reqwest::Client, url: &str) {
    eventually(
        &format!("POST {url} to succeed"),
        Duration::from_secs(10),
        || async {
            let response = c.post(url).send().await.expect("post");
            response.status().is_success().then_some(())
        },
    )
    .await;
}

async fn wait_count(c: &reqwest::Client, base: &str, ns: &str, id: &str, count: u64) -> Value {
    let what = format!("{ns}/{id} to fire {count} times");
    eventually(&what, Duration::from_secs(15), || async {
        let body = fired(c, base, ns, id).await;
        (body["count"].as_u64() >= Some(count)).then_some(body)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_instances_alarm_fires_through_the_sweeper() {
    let ns = unique_ns("alarm-evicted");
    let _cleanup = PostgresCleanup::new(&ns);
    let url = database_url();
    let args = sweeping(&[]);
    let pb = pinboard()
        .args(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .start();
    let w = rust_worker(&pb.url)
        .envs(&worker_env(
            &ns,
            &url,
            &[("FLEET_IDLE_MS", "200"), ("FLEET_SWEEP_MS", "100")],
        ))
        .start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    post_ok(&c, &format!("{}{ns}/e/alarm?ms=1500", pb.url)).await;
    // The instance goes idle and is evicted before the alarm is due.
    eventually(
        "the instance evicted before its alarm is due",
        Duration::from_millis(1_400),
        || async {
            let stats = support::stats(&c, &w).await;
            stats["instances"]
                .as_array()
                .is_some_and(Vec::is_empty)
                .then_some(())
        },
    )
    .await;
    let body = wait_count(&c, &pb.url, &ns, "e", 1).await;
    assert_eq!(body["count"], 1);
    // And it does not fire again, however many laps the sweeper runs.
    more_laps(&c, &[&pb.url], 5).await;
    assert_eq!(fired(&c, &pb.url, &ns, "e").await["count"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owners_alarm_fires_on_another_worker() {
    let ns = unique_ns("alarm-killed");
    let _cleanup = PostgresCleanup::new(&ns);
    let url = database_url();
    let args = sweeping(&[]);
    let pb = pinboard()
        .args(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .start();
    let mut a = rust_worker(&pb.url)
        .envs(&worker_env(&ns, &url, &[]))
        .start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    post_ok(&c, &format!("{}{ns}/k/alarm?ms=1500", pb.url)).await;
    let owner = get_json(
        &c,
        &format!("{}{ns}/k/whoami", pb.url),
        Duration::from_secs(5),
    )
    .await["process"]
        .clone();
    let _b = rust_worker(&pb.url)
        .envs(&worker_env(&ns, &url, &[]))
        .start();
    wait_workers(&c, &pb.url, 2).await;
    a.kill();
    let body = wait_count(&c, &pb.url, &ns, "k", 1).await;
    assert_eq!(body["count"], 1);
    assert_ne!(body["process"], owner, "fired by the killed owner?");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sweeping_pinboards_fire_each_alarm_once() {
    let ns = unique_ns("alarm-two");
    let _cleanup = PostgresCleanup::new(&ns);
    let url = database_url();
    let prefix = redis_prefix("alarm-two");
    let args = sweeping(&[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let one = pinboard().shared_redis(&prefix).args(&args).start();
    let two = pinboard().shared_redis(&prefix).args(&args).start();
    // Short idle timeouts: most alarms find their instance evicted, so the
    // sweepers (not the owner's timer) deliver them.
    let _w1 = rust_worker(&one.url)
        .envs(&worker_env(
            &ns,
            &url,
            &[("FLEET_IDLE_MS", "300"), ("FLEET_SWEEP_MS", "100")],
        ))
        .start();
    let _w2 = rust_worker(&two.url)
        .envs(&worker_env(
            &ns,
            &url,
            &[("FLEET_IDLE_MS", "300"), ("FLEET_SWEEP_MS", "100")],
        ))
        .start();
    let c = client();
    wait_workers(&c, &one.url, 2).await;
    for i in 0..20 {
        let base = if i % 2 == 0 { &one.url } else { &two.url };
        post_ok(&c, &format!("{base}{ns}/t-{i}/alarm?ms={}", 500 + 100 * i)).await;
    }
    for i in 0..20 {
        wait_count(&c, &one.url, &ns, &format!("t-{i}"), 1).await;
    }
    // Every alarm fired; a few laps of both sweepers later, still once each.
    more_laps(&c, &[&one.url, &two.url], 5).await;
    for i in 0..20 {
        let body = fired(&c, &one.url, &ns, &format!("t-{i}")).await;
        assert_eq!(body["count"], 1, "t-{i} fired {} times", body["count"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_epoch_write_is_refused_and_the_new_owners_state_survives() {
    let ns = unique_ns("stale-write");
    let _cleanup = PostgresCleanup::new(&ns);
    let url = database_url();
    let pb = pinboard().start();
    let a = rust_worker(&pb.url)
        .envs(&worker_env(&ns, &url, &[]))
        .start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    post_ok(&c, &format!("{}{ns}/x/write", pb.url)).await;
    // A schedules a write for later, then freezes past its lease.
    post_ok(&c, &format!("{}{ns}/x/write?later_ms=3000", pb.url)).await;
    let _b = rust_worker(&pb.url)
        .envs(&worker_env(&ns, &url, &[]))
        .start();
    wait_workers(&c, &pb.url, 2).await;
    a.pause();
    // Its lease lapses: pinboard lists B alone.
    wait_workers(&c, &pb.url, 1).await;
    // The id moves to B (a higher epoch), which writes.
    post_ok(&c, &format!("{}{ns}/x/write", pb.url)).await;
    let b_state = get_json(
        &c,
        &format!("{}{ns}/x/state", pb.url),
        Duration::from_secs(5),
    )
    .await;
    a.resume();
    // A's late write, at its old epoch, is fenced out.
    let outcome = eventually("A's late write", Duration::from_secs(10), || async {
        let writes: Vec<String> = c
            .get(format!("{}/fleet/writes", a.url))
            .send()
            .await
            .expect("writes")
            .json()
            .await
            .expect("json");
        writes.into_iter().filter(|w| w.starts_with("x ")).nth(1)
    })
    .await;
    assert!(outcome.contains("fence lost"), "A's stale write: {outcome}");
    let state = get_json(
        &c,
        &format!("{}{ns}/x/state", pb.url),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(state, b_state, "the new owner's state was overwritten");
}
