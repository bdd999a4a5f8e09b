//! A store that loses its data is noticed (the generation key), a store
//! that holds state spares a joining node the cold-start quarantine, and
//! `/readyz` says both, plus whether the store answers. Each test runs its
//! own `redis-server`, so `FLUSHALL` and `SIGSTOP` touch nothing else.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use serde_json::Value;
use support::fake::{fake, Mode};
use support::RedisServer;
use support::{client, eventually, pinboard, python_worker, wait_workers};
use test_support::metrics;

/// `GET /readyz`: status and body.
async fn readyz(c: &reqwest::Client, pb: &str) -> (u16, Value) {
    let res = c.get(format!("{pb}/readyz")).send().await.expect("readyz");
    let status = res.status().as_u16();
    (status, res.json().await.expect("readyz json"))
}

async fn hit(c: &reqwest::Client, pb: &str, id: &str) -> (u16, Value) {
    let res = c
        .get(format!("{pb}/counter/{id}/hit"))
        .send()
        .await
        .expect("hit");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_with_two_live_workers_never_moves_an_id_to_the_other() {
    let redis = RedisServer::start();
    // A real quarantine (the suites' default is none): one lease TTL. Two
    // nodes: `pb` places the ids (and keeps routes to them), `cold` has
    // never routed them, so after the wipe it must ask the store.
    let args = ["--lease-ttl-ms", "3000", "--quarantine-ms", "3000"];
    let pb = pinboard().redis(&redis.url).args(&args).start();
    let cold = pinboard().redis(&redis.url).args(&args).start();
    let c = client();
    let (status, body) = readyz(&c, &pb.url).await;
    assert_eq!(status, 503, "a fresh store starts in quarantine: {body}");
    assert!(
        body["quarantineMs"].as_u64().is_some_and(|ms| ms > 0),
        "{body}"
    );
    // A beats every 0.5 s, B every 1.5 s: after the wipe A is back well
    // before B, and B's ids are up for grabs in between.
    let _a = python_worker(&pb.url).start();
    let _b = python_worker(&pb.url).env("HEARTBEAT_S", "1.5").start();
    wait_workers(&c, &pb.url, 2).await;
    eventually(
        "the cold-start quarantine to end",
        Duration::from_secs(10),
        || async { (readyz(&c, &pb.url).await.0 == 200).then_some(()) },
    )
    .await;

    // 40 ids over the two workers: who holds which, with which instance.
    let ids: Vec<String> = (0..40).map(|i| format!("live-{i}")).collect();
    let mut owner: HashMap<String, (Value, Value, u64)> = HashMap::new();
    for id in &ids {
        let (status, v) = hit(&c, &pb.url, id).await;
        assert_eq!(status, 200, "{id}: {v}");
        owner.insert(id.clone(), (v["process"].clone(), v["instance"].clone(), 1));
    }
    let processes: std::collections::HashSet<String> =
        owner.values().map(|(p, _, _)| p.to_string()).collect();
    assert_eq!(processes.len(), 2, "both workers hold ids");

    let intact = [
        metrics::scrape(&c, &pb.url).await,
        metrics::scrape(&c, &cold.url).await,
    ];
    redis.flushall().await;
    // Hammer every id while the workers find out (their heartbeats answer
    // `reregister`) and re-register one after the other. An answer is a
    // 503 (quarantine, or the owner not back yet) or comes from the
    // process and instance that held the id, with its count going on.
    let started = tokio::time::Instant::now();
    let mut saw_quarantine = false;
    let mut round = 0;
    while started.elapsed() < Duration::from_secs(6) {
        round += 1;
        let answers: Vec<(String, u16, Value)> = stream::iter(ids.clone())
            .enumerate()
            .map(|(i, id)| {
                let c = c.clone();
                let url = if (i + round) % 2 == 0 {
                    pb.url.clone()
                } else {
                    cold.url.clone()
                };
                async move {
                    let (status, v) = hit(&c, &url, &id).await;
                    (id, status, v)
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        for (id, status, v) in answers {
            let entry = owner.get_mut(&id).expect("known id");
            match status {
                200 => {
                    assert_eq!(
                        v["process"], entry.0,
                        "{id} answered by another worker: {v}"
                    );
                    assert_eq!(v["instance"], entry.1, "{id} lost its instance: {v}");
                    entry.2 += 1;
                    assert_eq!(v["count"], entry.2, "{id}: {v}");
                }
                503 => saw_quarantine |= v["detail"] == "pinboard is starting; retry",
                other => panic!("{id}: {other} {v}"),
            }
        }
        // A lookup may meet the emptied worker list before the generation
        // check (a 503 of its own): the quarantine also shows on /readyz.
        for node in [&pb, &cold] {
            let (status, body) = readyz(&c, &node.url).await;
            saw_quarantine |=
                status == 503 && body["quarantineMs"].as_u64().is_some_and(|ms| ms > 0);
        }
    }
    assert!(
        saw_quarantine,
        "the loss was never answered with the quarantine"
    );
    for (node, intact) in [&pb, &cold].into_iter().zip(&intact) {
        let noticed = metrics::scrape(&c, &node.url).await;
        assert!(metrics::moved(intact, &noticed, "pinboard_store_losses") >= 1.0);
    }
    // Every id comes back on its own worker, with its state.
    for id in &ids {
        let entry = owner.get_mut(id).expect("known id");
        let v = eventually(
            &format!("{id} to answer again"),
            Duration::from_secs(10),
            || async {
                let (status, v) = hit(&c, &pb.url, id).await;
                (status == 200).then_some(v)
            },
        )
        .await;
        entry.2 += 1;
        assert_eq!(v["process"], entry.0, "{id}: {v}");
        assert_eq!(v["count"], entry.2, "{id}: {v}");
    }
    for node in [&pb, &cold] {
        assert_eq!(readyz(&c, &node.url).await.0, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joining_a_store_that_holds_state_places_at_once() {
    let redis = RedisServer::start();
    let first = pinboard()
        .redis(&redis.url)
        .args(&["--quarantine-ms", "500", "--lease-ttl-ms", "60000"])
        .start();
    let c = client();
    let (_w, _) = fake(&first.url, "w", Mode::Serve).await;
    eventually(
        "the first node's quarantine to end",
        Duration::from_secs(10),
        || async { (readyz(&c, &first.url).await.0 == 200).then_some(()) },
    )
    .await;
    assert_eq!(hit(&c, &first.url, "before").await.0, 200);

    // A rolling restart: a new node joins the same store with a quarantine
    // it will never need.
    let joined = pinboard()
        .redis(&redis.url)
        .args(&["--quarantine-ms", "600000", "--lease-ttl-ms", "60000"])
        .start();
    let (status, body) = readyz(&c, &joined.url).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(hit(&c, &joined.url, "after").await.0, 200);

    // A node on an empty store (another prefix of the same Redis) does wait.
    let fresh = pinboard()
        .redis(&redis.url)
        .args(&[
            "--redis-prefix",
            "other:",
            "--quarantine-ms",
            "600000",
            "--lease-ttl-ms",
            "60000",
        ])
        .start();
    let (_w2, _) = fake(&fresh.url, "w2", Mode::Serve).await;
    let (status, body) = readyz(&c, &fresh.url).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["store"], true, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("quarantine")),
        "{body}"
    );
    let (status, v) = hit(&c, &fresh.url, "new").await;
    assert_eq!(
        (status, v["detail"].as_str()),
        (503, Some("pinboard is starting; retry"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_store_and_healthz_stays_liveness() {
    let redis = RedisServer::start();
    let pb = pinboard().redis(&redis.url).start();
    let c = client();
    assert_eq!(
        readyz(&c, &pb.url).await,
        (200, serde_json::json!({"ok": true}))
    );

    redis.pause();
    let (status, body) = readyz(&c, &pb.url).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["store"], false, "{body}");
    assert_eq!(
        body["detail"], "placement store unreachable: no answer within 1000 ms",
        "{body}"
    );
    let health = c
        .get(format!("{}/healthz", pb.url))
        .send()
        .await
        .expect("healthz");
    assert_eq!(
        health.status(),
        200,
        "liveness does not depend on the store"
    );

    redis.resume();
    eventually(
        "readiness to come back",
        Duration::from_secs(10),
        || async { (readyz(&c, &pb.url).await.0 == 200).then_some(()) },
    )
    .await;
}
