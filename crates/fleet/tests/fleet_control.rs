//! pinboard's control of a Rust worker, through a real pinboard: an
//! operator drain reaches the worker with the whole deadline the operator
//! asked for (counted from its delivery, not from the push), is applied
//! once (a deadline that passed is not re-applied on every heartbeat: no
//! lease flap, no second abort), and lifts with `undrain`; a `wind_down`
//! control message reaches the worker, is applied, and once acked is not
//! delivered again.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{client, eventually, get_json, pinboard, rust_worker, wait_workers, Proc, TOKEN};
use test_support::metric_grows;

/// The lease-hook events the worker heard (`GET /fleet/lease-events`).
async fn lease_events(c: &reqwest::Client, worker: &Proc) -> Vec<String> {
    let events: Value = c
        .get(format!("{}/fleet/lease-events", worker.url))
        .send()
        .await
        .expect("events")
        .json()
        .await
        .expect("events json");
    events
        .as_array()
        .map(|events| {
            events
                .iter()
                .filter_map(|e| e.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

async fn push(c: &reqwest::Client, pb: &Proc, body: Value) -> Value {
    let answer = c
        .post(format!("{}/registry/push", pb.url))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .expect("push");
    assert_eq!(answer.status(), 200);
    answer.json().await.expect("push json")
}

/// Waits until pinboard counted `n` more heartbeats.
async fn heartbeats(c: &reqwest::Client, pb: &Proc, n: u64) {
    let beats = "pinboard_heartbeats_total";
    metric_grows(c, &[&pb.url], beats, n, Duration::from_secs(15)).await;
}

/// How often `needle` appears in the worker's log.
fn log_count(worker: &Proc, needle: &str) -> usize {
    worker.log_text().matches(needle).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_deadline_counts_from_its_delivery_and_is_applied_once() {
    // Heartbeats a second apart: a deadline counted from the push would
    // arrive up to a second short.
    let pb = pinboard().args(&["--lease-ttl-ms", "6000"]).start();
    let worker = rust_worker(&pb.url)
        .envs(&[
            ("FLEET_HEARTBEAT_MS", "1000"),
            ("FLEET_LEASE_BUFFER_MS", "1000"),
        ])
        .start();
    let c = client();
    let session = wait_workers(&c, &pb.url, 1).await[0]["sessionId"].clone();

    // An instance kept busy past the deadline: the drain must abort it.
    let slow = {
        let (c, url) = (c.clone(), format!("{}/counter/busy/slow?ms=30000", pb.url));
        tokio::spawn(async move { c.get(url).send().await.expect("slow").status().as_u16() })
    };
    eventually(
        "the slow request to run",
        Duration::from_secs(10),
        || async {
            let stats = support::stats(&c, &worker).await;
            (stats["instances"][0]["tasks"].as_u64() >= Some(1)).then_some(())
        },
    )
    .await;

    // Pushed just after a heartbeat: the next one, which delivers it, is
    // about a second away.
    heartbeats(&c, &pb, 1).await;
    push(
        &c,
        &pb,
        json!({"sessionId": session, "type": "drain", "deadline": 3}),
    )
    .await;
    let left_ms: u64 = eventually(
        "the drain to reach the instance",
        Duration::from_secs(10),
        || async {
            lease_events(&c, &worker).await.iter().find_map(|e| {
                e.strip_prefix("on_wind_down busy ")
                    .and_then(|ms| ms.parse().ok())
            })
        },
    )
    .await;
    assert!(
        (2_800..=3_000).contains(&left_ms),
        "the worker got {left_ms} ms of a 3 s deadline"
    );

    // The deadline aborts the busy instance.
    let status = tokio::time::timeout(Duration::from_secs(10), slow)
        .await
        .expect("the slow request ends at the deadline")
        .expect("join");
    assert_eq!(status, 503, "aborted at the drain deadline");

    // Past the deadline the acks keep saying `drainDeadline: 0`; the
    // worker applied the drain once and does not again: no lease flap and
    // no abort on each heartbeat.
    heartbeats(&c, &pb, 2).await;
    let flaps = support::stats(&c, &worker).await["leaseFlaps"].clone();
    heartbeats(&c, &pb, 4).await;
    let stats = support::stats(&c, &worker).await;
    assert_eq!(stats["leaseFlaps"], flaps, "the lease flaps: {stats}");
    assert_eq!(stats["draining"], true, "{stats}");
    assert_eq!(
        log_count(&worker, "control plane drain: refusing new activations"),
        1,
        "{}",
        worker.log_text()
    );
    assert_eq!(log_count(&worker, "drain deadline reached"), 1);
    assert_eq!(log_count(&worker, "lease restored"), 0);

    // Undrained, the worker takes ids again.
    push(&c, &pb, json!({"sessionId": session, "type": "undrain"})).await;
    let answer = get_json(
        &c,
        &format!("{}/counter/after/hit", pb.url),
        Duration::from_secs(15),
    )
    .await;
    assert_eq!(answer["count"], 1, "{answer}");
    assert_eq!(log_count(&worker, "control plane drain revoked"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wind_down_message_reaches_a_rust_worker_and_is_not_redelivered_once_acked() {
    let pb = pinboard().start();
    let worker = rust_worker(&pb.url).start();
    let c = client();
    let session = wait_workers(&c, &pb.url, 1).await[0]["sessionId"].clone();
    let url = format!("{}/counter/wd/hit", pb.url);
    let first = get_json(&c, &url, Duration::from_secs(10)).await;
    get_json(&c, &url, Duration::from_secs(5)).await;

    let answer = push(
        &c,
        &pb,
        json!({"sessionId": session, "type": "wind_down", "ns": "/counter", "id": "wd", "deadline": 0}),
    )
    .await;
    assert!(answer["msgId"].is_string(), "{answer}");
    // Applied: the instance winds down at once and the id comes back fresh.
    let fresh = eventually(
        "the wind_down to apply",
        Duration::from_secs(10),
        || async {
            let v = get_json(
                &c,
                &format!("{}/counter/wd/peek", pb.url),
                Duration::from_secs(5),
            )
            .await;
            (v["instance"] != first["instance"]).then_some(v)
        },
    )
    .await;
    assert_eq!(fresh["count"], 0, "{fresh}");
    assert!(
        lease_events(&c, &worker)
            .await
            .iter()
            .any(|e| e.starts_with("on_wind_down wd ")),
        "the instance heard its deadline"
    );
    // Acked on the next heartbeat, so later heartbeats do not carry it:
    // the fresh instance is left alone.
    heartbeats(&c, &pb, 4).await;
    let later = get_json(&c, &url, Duration::from_secs(5)).await;
    assert_eq!(later["instance"], fresh["instance"], "wound down again");
    assert_eq!(later["count"], 1, "{later}");
    assert_eq!(log_count(&worker, "winding down instance"), 1);
}
