//! The proxy's deadline toward workers: a frozen (SIGSTOPped) Python worker
//! or a worker that never answers yields 504 within `--upstream-timeout-ms`,
//! is never re-sent the request, and loses its ids once its lease lapses;
//! the idempotent re-send after a dropped worker connection still works.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};
use support::raw::{metric, raw_worker, Answer};
use support::{
    client, eventually, get_json, id_on, pinboard, python_worker, wait_workers, LEASE_TTL_MS,
};
use tokio::time::Instant;

const DETAIL: &str = "worker did not answer in time";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_worker_answers_504_in_time_and_its_ids_move_once_its_lease_lapses() {
    let pb = pinboard().args(&["--upstream-timeout-ms", "800"]).start();
    let a = python_worker(&pb.url).start();
    let b = python_worker(&pb.url).start();
    let c = client();
    wait_workers(&c, &pb.url, 2).await;
    let pa = get_json(&c, &format!("{}/process", a.url), Duration::from_secs(5)).await["process"]
        .clone();
    let pb_proc = get_json(&c, &format!("{}/process", b.url), Duration::from_secs(5)).await
        ["process"]
        .clone();

    // An id that lives on `a`.
    let (id, _) = id_on(&c, &pb.url, &pa, "frozen-", 64)
        .await
        .expect("an id placed on worker a");

    a.pause();
    let frozen = Instant::now();
    let res = c
        .get(format!("{}/counter/{id}/hit", pb.url))
        .send()
        .await
        .expect("send");
    let took = frozen.elapsed();
    assert_eq!(res.status(), 504);
    assert_eq!(
        res.json::<Value>().await.expect("json"),
        json!({ "detail": DETAIL })
    );
    assert!(
        took >= Duration::from_millis(750) && took < Duration::from_secs(3),
        "504 after {took:?}"
    );
    assert!(metric(&pb.url, "pinboard_proxy_upstream_timeouts_total").await >= 1.0);

    // Once a's lease lapses the id is placed on b, with fresh state.
    let budget = Duration::from_millis(LEASE_TTL_MS) + Duration::from_secs(5);
    let moved = eventually(
        &format!("{id} to move off the frozen worker"),
        budget,
        || async {
            let res = c
                .get(format!("{}/counter/{id}/hit", pb.url))
                .send()
                .await
                .expect("send");
            match res.status().as_u16() {
                200 => Some(res.json::<Value>().await.expect("json")),
                503 | 504 => None,
                other => panic!("unexpected {other}: {:?}", res.text().await),
            }
        },
    )
    .await;
    assert_eq!(moved["process"], pb_proc);
    assert_eq!(moved["count"], 1);
    a.resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_never_answers_is_timed_out_and_never_sent_the_request_twice() {
    let pb = pinboard()
        .args(&["--lease-ttl-ms", "60000", "--upstream-timeout-ms", "500"])
        .start();
    let (hang, _) = raw_worker(&pb.url, "hang", |_, _| Answer::Hang).await;
    let c = client();
    let cases: [(&str, Option<reqwest::Body>); 3] = [
        ("GET", None),
        ("POST", Some(reqwest::Body::from("{\"n\": 1}"))),
        // A streamed body (no length): the deadline runs from its end.
        (
            "POST",
            Some(reqwest::Body::wrap_stream(futures_util::stream::iter([
                Ok::<_, std::io::Error>("{\"n\": "),
                Ok("2}"),
            ]))),
        ),
    ];
    for (n, (method, body)) in cases.into_iter().enumerate() {
        let before = hang.hits.load(Ordering::SeqCst);
        let mut req = c.request(
            method.parse().expect("method"),
            format!("{}/counter/h-{n}/hit", pb.url),
        );
        if let Some(body) = body {
            req = req.body(body);
        }
        let started = Instant::now();
        let res = req.send().await.expect("send");
        let took = started.elapsed();
        assert_eq!(res.status(), 504, "{method} #{n}");
        assert_eq!(
            res.json::<Value>().await.expect("json"),
            json!({ "detail": DETAIL })
        );
        assert!(
            took >= Duration::from_millis(450) && took < Duration::from_secs(3),
            "{method} #{n}: 504 after {took:?}"
        );
        assert_eq!(
            hang.hits.load(Ordering::SeqCst) - before,
            1,
            "{method} #{n} was re-sent"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_worker_connection_re_sends_idempotent_requests_only() {
    let pb = pinboard().args(&["--lease-ttl-ms", "60000"]).start();
    // The first request each connection brings is dropped unanswered.
    let (flaky, _) = raw_worker(&pb.url, "flaky", |_, hit| {
        if hit == 1 {
            Answer::Close
        } else {
            Answer::Json(200, json!({"ok": true}))
        }
    })
    .await;
    let c = client();
    let res = c
        .get(format!("{}/counter/i/hit", pb.url))
        .send()
        .await
        .expect("send");
    assert_eq!(res.status(), 200);
    assert_eq!(flaky.hits.load(Ordering::SeqCst), 2, "GET re-sent once");

    let pb2 = pinboard().args(&["--lease-ttl-ms", "60000"]).start();
    let (once, _) = raw_worker(&pb2.url, "once", |_, hit| {
        if hit == 1 {
            Answer::Close
        } else {
            Answer::Json(200, json!({"ok": true}))
        }
    })
    .await;
    let res = c
        .post(format!("{}/counter/p/hit", pb2.url))
        .body("{}")
        .send()
        .await
        .expect("send");
    assert_eq!(res.status(), 502);
    assert_eq!(
        res.json::<Value>().await.expect("json"),
        json!({ "detail": "worker connection failed mid-request" })
    );
    assert_eq!(
        once.hits.load(Ordering::SeqCst),
        1,
        "a POST is never re-sent"
    );
}
