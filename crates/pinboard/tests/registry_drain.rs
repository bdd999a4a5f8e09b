//! Operator pushes reaching Python workers: a drain stops new placements on
//! the drained worker while its resident instance keeps serving, and a
//! `wind_down` control message is delivered (and acked) through heartbeats.

mod support;

use std::time::Duration;

use serde_json::json;
use support::{
    bearer, client, eventually, get_json, id_on, pinboard, python_worker, wait_workers, workers,
    Proc,
};

async fn process_of(c: &reqwest::Client, w: &Proc) -> serde_json::Value {
    get_json(c, &format!("{}/process", w.url), Duration::from_secs(5)).await["process"].clone()
}

/// Waits until the worker's host reports `draining` as `want`.
async fn until_draining(c: &reqwest::Client, w: &Proc, want: bool) {
    eventually(
        &format!("the worker's draining to be {want}"),
        Duration::from_secs(10),
        || async {
            let v = get_json(c, &format!("{}/process", w.url), Duration::from_secs(5)).await;
            (v["draining"] == want).then_some(())
        },
    )
    .await;
}

/// Waits until pinboard counted `n` more heartbeats: each would have carried
/// a control message again had it not been acked.
async fn more_heartbeats(c: &reqwest::Client, pb: &Proc, n: u64) {
    let beats = "pinboard_heartbeats_total";
    test_support::metric_grows(c, &[&pb.url], beats, n, Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_stops_new_ids_keeps_resident_ones_and_moves_new_ids_elsewhere() {
    let pb = pinboard().start();
    let a = python_worker(&pb.url).start();
    let b = python_worker(&pb.url).start();
    let c = client();
    wait_workers(&c, &pb.url, 2).await;
    let (pa, pbp) = (process_of(&c, &a).await, process_of(&c, &b).await);
    let rows = workers(&c, &pb.url).await;
    let a_session = rows
        .iter()
        .find(|r| r["advertiseUrl"] == a.url.as_str())
        .expect("a registered")["sessionId"]
        .clone();

    // An id resident on A.
    let (res_id, first) = id_on(&c, &pb.url, &pa, "res-", 40)
        .await
        .expect("some id landed on A");

    // Keep it busy so the drain cannot evict it as idle.
    let proxied = test_support::metric(&c, &pb.url, "pinboard_proxy_requests_total").await;
    let slow = {
        let c = c.clone();
        let url = format!("{}/counter/{res_id}/slow?ms=4000", pb.url);
        tokio::spawn(async move {
            c.get(url)
                .send()
                .await
                .expect("slow")
                .json::<serde_json::Value>()
                .await
        })
    };
    eventually(
        "the slow request to be proxied",
        Duration::from_secs(5),
        || async {
            (test_support::metric(&c, &pb.url, "pinboard_proxy_requests_total").await > proxied)
                .then_some(())
        },
    )
    .await;

    let res = c
        .post(format!("{}/registry/push", pb.url))
        .header("authorization", bearer())
        .json(&json!({"sessionId": a_session, "type": "drain", "deadline": null}))
        .send()
        .await
        .expect("push");
    assert_eq!(res.status(), 200);
    let row = workers(&c, &pb.url)
        .await
        .into_iter()
        .find(|r| r["sessionId"] == a_session)
        .expect("a still listed");
    assert_eq!(row["draining"], true);
    // The drain echo reaches the worker on a heartbeat.
    until_draining(&c, &a, true).await;

    // The resident instance keeps serving on A.
    let v = get_json(
        &c,
        &format!("{}/counter/{res_id}/hit", pb.url),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(v["process"], pa);
    assert_eq!(v["instance"], first["instance"]);
    assert_eq!(v["count"], 2);

    // New ids land on B only.
    for i in 0..10 {
        let v = get_json(
            &c,
            &format!("{}/counter/new-{i}/hit", pb.url),
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(
            v["process"], pbp,
            "new id placed on the drained worker: {v}"
        );
    }

    // The in-flight request finished on A; then the drained worker evicts and
    // releases the idle instance, and the id comes back fresh on B.
    let done = slow.await.expect("join").expect("slow json");
    assert_eq!(done["process"], pa);
    let v = eventually(
        &format!("the drained worker to give up {res_id}"),
        Duration::from_secs(8),
        || async {
            let v = get_json(
                &c,
                &format!("{}/counter/{res_id}/peek", pb.url),
                Duration::from_secs(5),
            )
            .await;
            (v["process"] == pbp).then_some(v)
        },
    )
    .await;
    assert_eq!(v["count"], 0, "fresh state on B: {v}");

    // Undrain: A takes placements again (eventually some new id lands there).
    let res = c
        .post(format!("{}/registry/push", pb.url))
        .header("authorization", bearer())
        .json(&json!({"sessionId": a_session, "type": "undrain"}))
        .send()
        .await
        .expect("push");
    assert_eq!(res.status(), 200);
    until_draining(&c, &a, false).await;
    let mut on_a = false;
    for i in 0..40 {
        let v = get_json(
            &c,
            &format!("{}/counter/after-{i}/peek", pb.url),
            Duration::from_secs(5),
        )
        .await;
        if v["process"] == pa {
            on_a = true;
            break;
        }
    }
    assert!(on_a, "undrained worker never took a new id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wind_down_message_is_delivered_and_the_instance_restarts_fresh() {
    let pb = pinboard().start();
    let _w = python_worker(&pb.url).start();
    let c = client();
    let rows = wait_workers(&c, &pb.url, 1).await;
    let session = rows[0]["sessionId"].clone();
    let url = format!("{}/counter/wd/hit", pb.url);
    let first = get_json(&c, &url, Duration::from_secs(10)).await;
    get_json(&c, &url, Duration::from_secs(5)).await;

    let res = c
        .post(format!("{}/registry/push", pb.url))
        .header("authorization", bearer())
        .json(&json!({"sessionId": session, "type": "wind_down", "ns": "/counter", "id": "wd", "deadline": 0}))
        .send()
        .await
        .expect("push");
    assert_eq!(res.status(), 200);
    let body: serde_json::Value = res.json().await.expect("json");
    assert!(body["msgId"].is_string(), "{body}");

    let v = eventually("the wind_down to apply", Duration::from_secs(6), || async {
        let v = get_json(
            &c,
            &format!("{}/counter/wd/peek", pb.url),
            Duration::from_secs(5),
        )
        .await;
        (v["instance"] != first["instance"]).then_some(v)
    })
    .await;
    assert_eq!(v["count"], 0, "{v}");
    // Acked messages are not redelivered: the fresh instance survives.
    more_heartbeats(&c, &pb, 3).await;
    let a = get_json(
        &c,
        &format!("{}/counter/wd/hit", pb.url),
        Duration::from_secs(5),
    )
    .await;
    more_heartbeats(&c, &pb, 2).await;
    let b = get_json(
        &c,
        &format!("{}/counter/wd/hit", pb.url),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(
        a["instance"], b["instance"],
        "instance wound down again: message redelivered after ack"
    );
}
