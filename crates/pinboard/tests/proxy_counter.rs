//! Data plane on the memory store with one Python worker: one instance per
//! id across 1 000 requests, header hygiene, bodies, streaming, WebSockets.

mod support;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use support::{client, get_json, pinboard, python_worker, wait_workers};
use test_support::metrics;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_keeps_one_instance_across_1000_requests_on_the_memory_store() {
    let pb = pinboard().start();
    let _w = python_worker(&pb.url).start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    let url = format!("{}/counter/thousand/hit", pb.url);
    let first = get_json(&c, &url, Duration::from_secs(10)).await;
    let instance = first["instance"].clone();
    for i in 2..=1000 {
        let v: serde_json::Value = c
            .get(&url)
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("json");
        assert_eq!(
            v["instance"], instance,
            "request {i} reached another instance: {v}"
        );
        assert_eq!(v["count"], i, "request {i}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_requests_carry_pinboard_headers_and_never_the_clients() {
    let pb = pinboard().start();
    let w = python_worker(&pb.url).start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    let url = format!("{}/counter/hdr/headers?x=1&y=two", pb.url);
    get_json(&c, &url, Duration::from_secs(10)).await;
    let v: serde_json::Value = c
        .get(&url)
        .header("pinboard-attestation", "forged")
        .header("pinboard-epoch", "999999999999999999")
        .header("pinboard-proxy-secret", "guess")
        .header("x-custom", "kept")
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let h = &v["headers"];
    assert_eq!(v["query"], "x=1&y=two");
    assert_eq!(h["x-custom"], "kept");
    assert_ne!(h["pinboard-attestation"], "forged");
    assert!(h["pinboard-attestation"]
        .as_str()
        .is_some_and(|t| t.split('.').count() == 3));
    assert_ne!(h["pinboard-epoch"], "999999999999999999");
    assert!(
        h.get("pinboard-proxy-secret").is_none(),
        "secret forwarded: {h}"
    );
    assert_eq!(h["host"], w.url.trim_start_matches("http://"));

    // A body both ways.
    let echo: serde_json::Value = c
        .post(format!("{}/counter/hdr/echo", pb.url))
        .body("x".repeat(200_000))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(echo["len"], 200_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_response_and_websocket_echo_pass_through() {
    let pb = pinboard().start();
    let _w = python_worker(&pb.url).start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    get_json(
        &c,
        &format!("{}/counter/s/peek", pb.url),
        Duration::from_secs(10),
    )
    .await;

    let res = c
        .get(format!("{}/counter/s/stream?n=4", pb.url))
        .send()
        .await
        .expect("stream");
    assert_eq!(res.status(), 200);
    let mut chunks = res.bytes_stream();
    let mut text = String::new();
    let mut pieces = 0;
    while let Some(chunk) = chunks.next().await {
        text.push_str(std::str::from_utf8(&chunk.expect("chunk")).expect("utf8"));
        pieces += 1;
    }
    assert_eq!(text, "chunk-0\nchunk-1\nchunk-2\nchunk-3\n");
    assert!(
        pieces >= 2,
        "the body arrived in {pieces} piece(s): not streamed"
    );

    let before = metrics::scrape(&c, &pb.url).await;
    let ws_url = format!("{}/counter/s/ws", pb.url.replacen("http", "ws", 1));
    let (mut ws, resp) = tokio_tungstenite::connect_async(ws_url)
        .await
        .expect("ws connect");
    assert_eq!(resp.status(), 101);
    let upgraded = metrics::scrape(&c, &pb.url).await;
    assert_eq!(
        metrics::moved(&before, &upgraded, "pinboard_proxy_upgrades"),
        1.0
    );
    // pinboard offered to hold the socket (every WebSocket handshake is
    // offered); the Python reference worker does not know the offer and
    // switched protocols itself: spliced byte-for-byte, not held.
    assert_eq!(upgraded.value("pinboard_held_sockets"), 0.0);
    for word in ["one", "two", "three"] {
        ws.send(Message::text(word)).await.expect("send");
        let got = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("echo in time")
            .expect("frame")
            .expect("ok frame");
        assert_eq!(
            got.into_text().expect("text").as_str(),
            format!("echo:{word}")
        );
    }
    ws.close(None).await.expect("close");
}
