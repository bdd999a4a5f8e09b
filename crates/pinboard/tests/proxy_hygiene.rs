//! Proxy hygiene (RFC 9110 §7.6.1, RFC 7239) against the real process and
//! a scripted worker that records what reaches it: hop-by-hop headers (and
//! those `Connection` names) never cross pinboard in either direction, the
//! forwarding headers carry the client's address, a `traceparent` passes
//! untouched while no traces are exported, and a body the client
//! broke is the client's fault: 400 / 408, the cached route kept, no worker
//! failure counted.

mod support;

use std::time::Duration;

use serde_json::json;
use support::pinboard;
use support::raw::{connect, raw_worker, read_reply, Answer};
use test_support::metrics;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_stay_behind_and_forwarding_headers_carry_the_client() {
    let pb = pinboard().args(&["--lease-ttl-ms", "60000"]).start();
    let (worker, _) = raw_worker(&pb.url, "seen", |_, _| {
        Answer::JsonWith(
            200,
            vec![
                ("connection", "x-resp-hop"),
                ("x-resp-hop", "1"),
                ("keep-alive", "timeout=5"),
                ("proxy-authenticate", "Basic realm=\"w\""),
                ("x-resp-keep", "1"),
            ],
            json!({"ok": true}),
        )
    })
    .await;
    let mut s = connect(pb.addr()).await;
    s.write_all(
        b"GET /counter/h/hit HTTP/1.1\r\n\
          Host: client.example\r\n\
          Connection: keep-alive, X-Hop-A\r\n\
          Connection: x-hop-b\r\n\
          X-Hop-A: 1\r\n\
          X-Hop-B: 1\r\n\
          Keep-Alive: timeout=5\r\n\
          Proxy-Authorization: Basic Zm9vOmJhcg==\r\n\
          Proxy-Connection: keep-alive\r\n\
          TE: trailers\r\n\
          X-Forwarded-For: 203.0.113.7\r\n\
          Forwarded: for=203.0.113.7;proto=https\r\n\
          Pinboard-Epoch: 999\r\n\
          Traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n\
          Tracestate: congo=t61rcWkgMzE\r\n\
          X-Keep: yes\r\n\r\n",
    )
    .await
    .expect("write");
    let reply = read_reply(&mut s, Duration::from_secs(5)).await;
    assert_eq!(reply.status, 200, "{:?}", reply.json());
    for gone in ["x-resp-hop", "keep-alive", "proxy-authenticate"] {
        assert!(reply.header(gone).is_none(), "{gone} reached the client");
    }
    assert_eq!(reply.header("x-resp-keep"), Some("1"));

    let seen = worker.seen.lock()[0].clone();
    for gone in [
        "x-hop-a",
        "x-hop-b",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
    ] {
        assert!(
            seen.all(gone).is_empty(),
            "{gone} reached the worker: {:?}",
            seen.headers
        );
    }
    assert!(
        seen.all("connection").iter().all(|v| !v.contains("hop")),
        "{:?}",
        seen.headers
    );
    assert_eq!(seen.all("x-keep"), ["yes"]);
    // No OTLP export configured: the trace context passes through as is,
    // even with pinboard's debug spans on.
    assert_eq!(
        seen.all("traceparent"),
        ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"]
    );
    assert_eq!(seen.all("tracestate"), ["congo=t61rcWkgMzE"]);
    assert_eq!(seen.all("x-forwarded-for"), ["203.0.113.7, 127.0.0.1"]);
    assert_eq!(
        seen.all("forwarded"),
        ["for=203.0.113.7;proto=https, for=127.0.0.1;proto=http"]
    );
    assert_eq!(seen.all("x-forwarded-proto"), ["http"]);
    assert_ne!(seen.all("pinboard-epoch"), ["999"]);
    assert_ne!(seen.all("host"), ["client.example"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_the_client_broke_is_the_clients_fault_and_keeps_the_route() {
    let pb = pinboard()
        .args(&["--lease-ttl-ms", "60000", "--body-timeout-ms", "500"])
        .start();
    let (worker, _) = raw_worker(&pb.url, "body", |_, _| {
        Answer::Json(200, json!({"ok": true}))
    })
    .await;
    let c = support::client();
    let fresh = metrics::scrape(&c, &pb.url).await;

    // Place and cache the route.
    let mut s = connect(pb.addr()).await;
    s.write_all(b"GET /counter/b/hit HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(read_reply(&mut s, Duration::from_secs(5)).await.status, 200);
    let placed = metrics::scrape(&c, &pb.url).await;
    assert_eq!(
        metrics::moved(&fresh, &placed, "pinboard_cached_routes"),
        1.0
    );

    // A malformed chunk: 400, and the connection is closed.
    let mut s = connect(pb.addr()).await;
    s.write_all(
        b"POST /counter/b/hit HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
          5\r\nhello\r\nZZ\r\n",
    )
    .await
    .expect("write");
    let reply = read_reply(&mut s, Duration::from_secs(5)).await;
    assert_eq!(reply.status, 400);
    assert_eq!(
        reply.json(),
        json!({"detail": "request body could not be read"})
    );
    assert_eq!(reply.header("connection"), Some("close"));

    // A streamed body (beyond the retry buffer) that stops: 408.
    for (length, what) in [(100_000, "streamed"), (100, "buffered")] {
        let mut s = connect(pb.addr()).await;
        let started = Instant::now();
        s.write_all(
            format!(
                "POST /counter/b/hit HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n0123456789"
            )
            .as_bytes(),
        )
        .await
        .expect("write");
        let reply = read_reply(&mut s, Duration::from_secs(5)).await;
        let took = started.elapsed();
        assert_eq!(reply.status, 408, "{what}: {:?}", reply.json());
        assert_eq!(
            reply.json(),
            json!({"detail": "request body not received in time"}),
            "{what}"
        );
        assert!(
            took >= Duration::from_millis(450) && took < Duration::from_secs(3),
            "{what}: 408 after {took:?}"
        );
    }

    // None of it was held against the worker or the route.
    let broken = metrics::scrape(&c, &pb.url).await;
    assert_eq!(
        metrics::moved(&placed, &broken, "pinboard_proxy_client_body_errors"),
        3.0
    );
    for family in [
        "pinboard_proxy_upstream_errors",
        "pinboard_proxy_upstream_timeouts",
    ] {
        assert_eq!(broken.value(family), 0.0, "{family}: {broken}");
    }
    assert_eq!(broken.value("pinboard_cached_routes"), 1.0, "{broken}");
    let before = worker.hits.load(std::sync::atomic::Ordering::SeqCst);
    let mut s = connect(pb.addr()).await;
    s.write_all(b"GET /counter/b/hit HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(read_reply(&mut s, Duration::from_secs(5)).await.status, 200);
    assert_eq!(
        worker.hits.load(std::sync::atomic::Ordering::SeqCst),
        before + 1
    );
}
