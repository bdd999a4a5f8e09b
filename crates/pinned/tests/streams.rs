//! Streaming bodies and WebSockets keep their instance in flight past the
//! idle timeout, and a drain deadline closes them (a stream is cut with an
//! error, never ended as if complete).

mod support;

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, Sse};
use axum::routing::get;
use axum::Router;
use futures_util::{SinkExt, StreamExt};
use pinned::ws::{Message, WebSocketUpgrade};
use pinned::{BoxError, Context, HostOptions, Object, Options};
use support::start;
use tokio_tungstenite::tungstenite;

struct Streamer;

impl Object for Streamer {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Streamer)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route(
                "/sse",
                get(|| async {
                    // One event every 100 ms, forever.
                    let ticks = futures_util::stream::unfold(0u64, |n| async move {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Some((
                            Ok::<_, Infallible>(Event::default().data(n.to_string())),
                            n + 1,
                        ))
                    });
                    Sse::new(ticks)
                }),
            )
            .route(
                "/ws",
                get(|ws: WebSocketUpgrade| async move {
                    ws.on_upgrade(|mut socket| async move {
                        while let Some(Ok(message)) = socket.recv().await {
                            if let Message::Text(text) = message {
                                if socket.send(Message::Text(text)).await.is_err() {
                                    break;
                                }
                            }
                        }
                    })
                }),
            )
    }
}

fn quick() -> HostOptions {
    HostOptions::default()
        .idle_timeout(Duration::from_millis(200))
        .sweep_interval(Duration::from_millis(50))
}

#[tokio::test(start_paused = true)]
async fn a_streaming_body_holds_its_instance_until_a_drain_deadline() {
    let w = start(Options::new().host_with::<Streamer>("/s", quick())).await;
    let response = w.get("/s/sse-1/sse").await;
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    // Well past the idle timeout, the stream still flows.
    let mut received = 0;
    let started = tokio::time::Instant::now();
    while started.elapsed() < Duration::from_millis(700) {
        let chunk = body.next().await.expect("chunk").expect("bytes");
        assert!(!chunk.is_empty());
        received += 1;
    }
    assert!(received >= 4, "{received} events");
    let stats = w.stats().await;
    assert_eq!(stats["instances"][0]["id"], "sse-1");
    assert_eq!(stats["instances"][0]["connections"], 1);
    // The drain deadline ends the stream and the instance.
    let drain = {
        let worker = w.worker.clone();
        tokio::spawn(async move { worker.drain(Some(Duration::from_millis(300))).await })
    };
    // Cut, not ended: a clean end would make a truncated stream look whole.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match body.next().await {
                Some(Ok(_)) => continue,
                Some(Err(cut)) => return Ok(cut),
                None => return Err("the stream ended cleanly"),
            }
        }
    })
    .await
    .expect("stream ended by the drain deadline");
    assert!(ended.is_ok(), "{ended:?}");
    tokio::time::timeout(Duration::from_secs(5), drain)
        .await
        .expect("drain resolves")
        .expect("join");
    assert!(w.resident().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_dropped_stream_releases_its_instance() {
    let w = start(Options::new().host_with::<Streamer>("/s", quick())).await;
    let response = w.get("/s/sse-2/sse").await;
    let mut body = response.bytes_stream();
    body.next().await.expect("chunk").expect("bytes");
    drop(body);
    w.wait_for("eviction after the client left", |s| {
        s["instances"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_websocket_holds_its_instance_and_is_closed_1001_at_the_deadline() {
    let w = start(Options::new().host_with::<Streamer>("/s", quick())).await;
    let url = w.url("/s/ws-1/ws").replace("http://", "ws://");
    let (mut socket, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("connect");
    socket
        .send(tungstenite::Message::text("hello"))
        .await
        .expect("send");
    let echoed = socket.next().await.expect("echo").expect("message");
    assert_eq!(echoed.into_text().expect("text").as_str(), "hello");
    // Idle timeout passed three times over; the open socket holds it.
    let stats = w.wait_idle(600).await;
    assert_eq!(stats["instances"][0]["id"], "ws-1");
    assert_eq!(stats["instances"][0]["connections"], 1);
    socket
        .send(tungstenite::Message::text("still here"))
        .await
        .expect("send");
    assert!(socket.next().await.expect("echo").is_ok());
    let drain = {
        let worker = w.worker.clone();
        tokio::spawn(async move { worker.drain(Some(Duration::from_millis(200))).await })
    };
    let close = loop {
        match tokio::time::timeout(Duration::from_secs(5), socket.next())
            .await
            .expect("close within the deadline")
        {
            Some(Ok(tungstenite::Message::Close(frame))) => break frame,
            Some(Ok(_)) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    };
    let frame = close.expect("close frame");
    assert_eq!(u16::from(frame.code), 1001);
    assert_eq!(frame.reason.as_str(), "instance closed");
    tokio::time::timeout(Duration::from_secs(5), drain)
        .await
        .expect("drain resolves")
        .expect("join");
    assert!(w.resident().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_closed_websocket_lets_its_instance_go_idle() {
    let w = start(Options::new().host_with::<Streamer>("/s", quick())).await;
    let url = w.url("/s/ws-2/ws").replace("http://", "ws://");
    let (mut socket, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("connect");
    socket.close(None).await.expect("close");
    w.wait_for("eviction after the socket closed", |s| {
        s["instances"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
}
