//! Retry behaviour against scripted Rust workers (registered by the test
//! itself, so it knows their secrets): refusals are re-placed, tokens verify
//! with the owner's secret and session, and the raw secret is never sent on
//! the data plane.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};
use support::fake::{fake, Mode};
use support::raw::Raw;
use support::{bearer, client, eventually, pinboard, wait_workers};
use test_support::metrics;

fn check_headers(f: &Raw, session: &str) {
    for h in f.seen.lock().iter() {
        assert!(
            h.header("pinboard-proxy-secret").is_none(),
            "raw secret on the data plane"
        );
        let token = h.header("pinboard-attestation").expect("token");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("time")
            .as_secs_f64();
        let claims =
            pinned_wire::attestation::verify(token, &f.identity.secret, |aud| aud == session, now)
                .expect("token verifies with the owner's secret and session");
        assert!(claims.caller.is_none());
        assert!(h
            .header("pinboard-epoch")
            .expect("epoch")
            .parse::<u64>()
            .is_ok());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusing_workers_are_routed_around() {
    let pb = pinboard().args(&["--lease-ttl-ms", "60000"]).start();
    let (good, good_session) = fake(&pb.url, "good", Mode::Serve).await;
    let (draining, draining_session) = fake(&pb.url, "draining", Mode::Draining).await;
    let (unhealthy, unhealthy_session) = fake(&pb.url, "unhealthy", Mode::Unhealthy).await;
    let c = client();
    for i in 0..30 {
        let res = c
            .get(format!("{}/counter/r-{i}/hit", pb.url))
            .header("pinboard-attestation", "forged")
            .send()
            .await
            .expect("send");
        assert_eq!(res.status(), 200, "r-{i}");
        assert_eq!(res.json::<Value>().await.expect("json")["worker"], "good");
    }
    assert_eq!(good.hits.load(Ordering::SeqCst), 30);
    assert!(
        draining.hits.load(Ordering::SeqCst) + unhealthy.hits.load(Ordering::SeqCst) > 0,
        "placement never tried the refusing workers"
    );
    check_headers(&good, &good_session);
    check_headers(&draining, &draining_session);
    check_headers(&unhealthy, &unhealthy_session);

    // Overview: every id ended on the good worker.
    let o: Value = c
        .get(format!("{}/registry/overview", pb.url))
        .header("authorization", bearer())
        .send()
        .await
        .expect("overview")
        .json()
        .await
        .expect("json");
    let placements = o["placements"].as_array().expect("rows");
    assert_eq!(placements.len(), 30);
    assert!(placements
        .iter()
        .all(|p| p["sessionId"] == good_session.as_str()));

    // An owner tag filters the overview; a tag from a non-owner is ignored.
    for (session, expect) in [(&good_session, true), (&draining_session, false)] {
        let res: Value = c
            .post(format!("{}/registry/tag", pb.url))
            .header("authorization", bearer())
            .json(
                &json!({"sessionId": session, "namespace": "/counter", "id": "r-0", "tag": "blue"}),
            )
            .send()
            .await
            .expect("tag")
            .json()
            .await
            .expect("json");
        assert_eq!(res["tagged"], expect);
    }
    let o: Value = c
        .get(format!("{}/registry/overview?tag=blue", pb.url))
        .header("authorization", bearer())
        .send()
        .await
        .expect("overview")
        .json()
        .await
        .expect("json");
    let rows = o["placements"].as_array().expect("rows");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["id"], "r-0");
    assert_eq!(rows[0]["tag"], "blue");
    let w = o["workers"].as_array().expect("workers");
    let good_row = w
        .iter()
        .find(|r| r["sessionId"] == good_session.as_str())
        .expect("good");
    assert_eq!(good_row["instances"], 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_refusals_and_dead_owners_end_in_a_retryable_503() {
    let pb = pinboard()
        .args(&["--lease-ttl-ms", "60000", "--proxy-retries", "2"])
        .start();
    let (forbidden, _) = fake(&pb.url, "forbidden", Mode::Forbidden).await;
    let c = client();
    let before = metrics::scrape(&c, &pb.url).await;
    let res = c
        .get(format!("{}/counter/f/hit", pb.url))
        .send()
        .await
        .expect("send");
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(
        forbidden.hits.load(Ordering::SeqCst),
        3,
        "one try plus two retries"
    );
    let after = metrics::scrape(&c, &pb.url).await;
    assert_eq!(
        metrics::moved(&before, &after, "pinboard_proxy_retries"),
        2.0
    );

    // A draining-only fleet: nowhere to place, 503 + Retry-After, bounded work.
    let pb2 = pinboard().args(&["--lease-ttl-ms", "60000"]).start();
    let (d, _) = fake(&pb2.url, "d", Mode::Draining).await;
    let before = metrics::scrape(&c, &pb2.url).await;
    let started = tokio::time::Instant::now();
    let res = c
        .get(format!("{}/counter/z/hit", pb2.url))
        .send()
        .await
        .expect("send");
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["retry-after"], "1");
    assert!(d.hits.load(Ordering::SeqCst) <= 1);
    assert!(started.elapsed() < Duration::from_secs(2));
    let after = metrics::scrape(&c, &pb2.url).await;
    assert_eq!(
        metrics::moved(&before, &after, "pinboard_proxy_unavailable"),
        1.0
    );

    let rows: Value = c
        .get(format!("{}/registry/workers", pb2.url))
        .header("authorization", bearer())
        .send()
        .await
        .expect("workers")
        .json()
        .await
        .expect("json");
    assert_eq!(rows["workers"][0]["clientId"], "d");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_full_workers_answers_capacity_not_absence() {
    let pb = pinboard().args(&["--lease-ttl-ms", "60000"]).start();
    let (a, _) = fake(&pb.url, "full-a", Mode::Full).await;
    let (b, _) = fake(&pb.url, "full-b", Mode::Full).await;
    let c = client();
    wait_workers(&c, &pb.url, 2).await;
    let res = c
        .get(format!("{}/counter/crowded/hit", pb.url))
        .send()
        .await
        .expect("send");
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(
        res.json::<Value>().await.expect("json"),
        serde_json::json!({ "detail": "instance capacity reached; retry" })
    );
    // Each full worker was asked once, then excluded.
    assert_eq!(
        a.hits.load(Ordering::SeqCst) + b.hits.load(Ordering::SeqCst),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_start_quarantine_defers_new_placements() {
    // The stopwatch starts before the process does, so the quarantine (which
    // starts with the process) cannot have begun before it: the elapsed time at
    // the first placement is then a true lower bound. The quarantine is long
    // enough that a loaded machine still registers the worker and asks inside it.
    let started = tokio::time::Instant::now();
    let pb = pinboard()
        .args(&["--lease-ttl-ms", "60000", "--quarantine-ms", "4000"])
        .start();
    let (good, _) = fake(&pb.url, "good", Mode::Serve).await;
    let c = client();
    let res = c
        .get(format!("{}/counter/q/hit", pb.url))
        .send()
        .await
        .expect("send");
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(
        res.json::<Value>().await.expect("json"),
        json!({"detail": "pinboard is starting; retry"})
    );
    assert_eq!(good.hits.load(Ordering::SeqCst), 0);
    // Once the quarantine is over (not before 4 s), the id is placed.
    let status = eventually("the quarantine to end", Duration::from_secs(10), || async {
        let res = c
            .get(format!("{}/counter/q/hit", pb.url))
            .send()
            .await
            .expect("send");
        (res.status() != 503).then_some(res.status())
    })
    .await;
    assert_eq!(status, 200);
    assert!(
        started.elapsed() >= Duration::from_millis(4_000),
        "placed before the quarantine ended: {:?}",
        started.elapsed()
    );
}
