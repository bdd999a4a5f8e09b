//! Operator pushes reaching Python workers: a drain stops new placements on
//! the drained worker while its resident instance keeps serving, and a
//! `wind_down` control message is delivered (and acked) through heartbeats.

mod support;

use std::time::Duration;

use serde_json::json;
use support::{bearer, client, get_json, id_on, wait_workers, workers, Pinboard, Worker};

async fn process_of(c: &reqwest::Client, w: &Worker) -> serde_json::Value {
    get_json(c, &format!("{}/process", w.url), Duration::from_secs(5)).await["process"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_stops_new_ids_keeps_resident_ones_and_moves_new_ids_elsewhere() {
    let pb = Pinboard::start(&[]);
    let a = Worker::start(&pb.url);
    let b = Worker::start(&pb.url);
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
    tokio::time::sleep(Duration::from_millis(200)).await;

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
    // Let the drain echo reach the worker (heartbeats every 0.5 s).
    tokio::time::sleep(Duration::from_millis(1200)).await;

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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    loop {
        let v = get_json(
            &c,
            &format!("{}/counter/{res_id}/peek", pb.url),
            Duration::from_secs(5),
        )
        .await;
        if v["process"] == pbp {
            assert_eq!(v["count"], 0, "fresh state on B: {v}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "drained worker never gave up {res_id}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Undrain: A takes placements again (eventually some new id lands there).
    let res = c
        .post(format!("{}/registry/push", pb.url))
        .header("authorization", bearer())
        .json(&json!({"sessionId": a_session, "type": "undrain"}))
        .send()
        .await
        .expect("push");
    assert_eq!(res.status(), 200);
    tokio::time::sleep(Duration::from_millis(1200)).await;
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
    let pb = Pinboard::start(&[]);
    let _w = Worker::start(&pb.url);
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

    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    loop {
        let v = get_json(
            &c,
            &format!("{}/counter/wd/peek", pb.url),
            Duration::from_secs(5),
        )
        .await;
        if v["instance"] != first["instance"] {
            assert_eq!(v["count"], 0, "{v}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "wind_down never applied"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Acked messages are not redelivered: the fresh instance survives.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let a = get_json(
        &c,
        &format!("{}/counter/wd/hit", pb.url),
        Duration::from_secs(5),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
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
