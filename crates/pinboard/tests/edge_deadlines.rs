//! Deadlines of pinboard's own HTTP server, against the real process with
//! short configured timeouts: slow or silent clients are disconnected at
//! the header deadline, idle keep-alive connections at their own (longer)
//! deadline, a busy request is never cut, registry bodies are bounded in
//! size and time, and SIGTERM with a half-sent request open exits within
//! the shutdown deadline.

mod support;

use std::time::Duration;

use serde_json::json;
use support::raw::{connect, raw_worker, read_reply, wait_closed, Answer, Ended};
use support::{bearer, client, eventually, pinboard};
use test_support::metrics;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

const HEAD: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: pinboard\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_heads_and_silent_connections_are_closed_at_the_header_deadline() {
    let pb = pinboard()
        .args(&[
            "--header-read-timeout-ms",
            "500",
            "--keep-alive-timeout-ms",
            "60000",
        ])
        .start();
    let fresh = metrics::scrape(&client(), &pb.url).await;

    // A connection that never sends a byte.
    let mut silent = connect(pb.addr()).await;
    let started = Instant::now();
    let (ended, _) = wait_closed(&mut silent, Duration::from_secs(5)).await;
    assert_eq!(ended, Ended::Closed, "a silent connection stayed open");
    assert!(started.elapsed() >= Duration::from_millis(450));

    // Slowloris: one header line every 100 ms never completes the head.
    let slow = connect(pb.addr()).await;
    let (mut read, mut write) = slow.into_split();
    let started = Instant::now();
    let dribble = tokio::spawn(async move {
        let _ = write
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .await;
        for i in 0..100 {
            if write
                .write_all(format!("X-Slow-{i}: 1\r\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buf = [0u8; 64];
    let closed = loop {
        use tokio::io::AsyncReadExt;
        match tokio::time::timeout_at(deadline, read.read(&mut buf)).await {
            Err(_) => break false,
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(_)) => {}
        }
    };
    let took = started.elapsed();
    dribble.abort();
    assert!(closed, "a dribbling head kept its connection open");
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(3),
        "closed after {took:?}"
    );

    // A head that arrives in time is served; pinboard kept answering.
    let mut ok = connect(pb.addr()).await;
    ok.write_all(HEAD).await.expect("write");
    assert_eq!(
        read_reply(&mut ok, Duration::from_secs(5)).await.status,
        200
    );
    let timeouts = "pinboard_connections_header_timeouts";
    let patience = Duration::from_secs(5);
    let c = client();
    let counted = eventually("both header timeouts counted", patience, || async {
        let now = metrics::scrape(&c, &pb.url).await;
        (now.value(timeouts) >= 2.0).then_some(now)
    })
    .await;
    assert!(metrics::moved(&fresh, &counted, "pinboard_connections_header_timeouts") >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_outlives_the_header_deadline_and_busy_requests_are_never_cut() {
    let pb = pinboard()
        .args(&[
            "--lease-ttl-ms",
            "60000",
            "--header-read-timeout-ms",
            "300",
            "--keep-alive-timeout-ms",
            "1200",
        ])
        .start();
    // A request that takes longer than both deadlines.
    let (_slow, _) = raw_worker(&pb.url, "slow", |_, _| {
        Answer::After(Duration::from_millis(1500), 200, json!({"slow": true}))
    })
    .await;
    let mut s = connect(pb.addr()).await;
    s.write_all(b"GET /counter/long/hit HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let reply = read_reply(&mut s, Duration::from_secs(10)).await;
    assert_eq!(reply.status, 200, "{:?}", reply.json());
    assert_eq!(reply.json(), json!({"slow": true}));
    // Open now: this connection and the scrape's own.
    let c = client();
    let open = metrics::scrape(&c, &pb.url).await;
    assert!(open.value("pinboard_connections_open") >= 2.0, "{open}");

    // Idle after the answer: open past the header deadline, closed at the
    // keep-alive deadline.
    let answered = Instant::now();
    let (ended, _) = wait_closed(&mut s, Duration::from_secs(5)).await;
    let idle = answered.elapsed();
    assert_eq!(ended, Ended::Closed);
    assert!(
        idle >= Duration::from_millis(1100) && idle < Duration::from_secs(3),
        "idle connection closed after {idle:?}"
    );
    let patience = Duration::from_secs(5);
    metrics::wait_moved(
        &c,
        &pb.url,
        &open,
        "pinboard_connections_idle_timeouts",
        patience,
    )
    .await;
    // Left open: the scrape's own connection alone.
    let closed = eventually("the idle connection uncounted", patience, || async {
        let now = metrics::scrape(&c, &pb.url).await;
        (now.value("pinboard_connections_open") <= 1.0).then_some(now)
    })
    .await;
    assert!(metrics::moved(&open, &closed, "pinboard_connections_open") <= -1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_are_refused_431() {
    let pb = pinboard().args(&["--max-header-bytes", "4096"]).start();
    let mut s = connect(pb.addr()).await;
    let big = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(8192)
    );
    s.write_all(big.as_bytes()).await.expect("write");
    let reply = read_reply(&mut s, Duration::from_secs(5)).await;
    assert_eq!(reply.status, 431);
    let (ended, _) = wait_closed(&mut s, Duration::from_secs(5)).await;
    assert_eq!(ended, Ended::Closed);
    // A head under the limit still goes through.
    let mut s = connect(pb.addr()).await;
    s.write_all(HEAD).await.expect("write");
    assert_eq!(read_reply(&mut s, Duration::from_secs(5)).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_bodies_are_bounded_in_size_and_time() {
    let pb = pinboard().args(&["--body-timeout-ms", "500"]).start();
    let c = client();

    // 3 MB over the default 2 MiB: 413 with a detail, and the client gets it.
    let res = c
        .post(format!("{}/registry/register", pb.url))
        .header("authorization", bearer())
        .header("content-type", "application/json")
        .body(vec![b' '; 3_000_000])
        .send()
        .await
        .expect("send");
    assert_eq!(res.status(), 413);
    assert_eq!(
        res.json::<serde_json::Value>().await.expect("json"),
        json!({"detail": "request body exceeds 2097152 bytes"})
    );

    // Declared far too large: refused before any byte of it is read.
    let mut s = connect(pb.addr()).await;
    s.write_all(
        format!(
            "POST /registry/heartbeat HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\n\
             Content-Length: 100000000\r\n\r\n",
            bearer()
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    let reply = read_reply(&mut s, Duration::from_secs(5)).await;
    assert_eq!(reply.status, 413);
    assert_eq!(reply.header("connection"), Some("close"));

    // A body that stops arriving: 408 at the body deadline.
    let mut s = connect(pb.addr()).await;
    let started = Instant::now();
    s.write_all(
        format!(
            "POST /registry/heartbeat HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\n\
             Content-Length: 100\r\n\r\n{{\"sessionId\"",
            bearer()
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    let reply = read_reply(&mut s, Duration::from_secs(5)).await;
    let took = started.elapsed();
    assert_eq!(reply.status, 408);
    assert_eq!(
        reply.json(),
        json!({"detail": "request body not received in time"})
    );
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(3),
        "408 after {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_half_sent_request_open_exits_within_the_shutdown_deadline() {
    let mut pb = pinboard()
        .args(&[
            // Long enough that only the shutdown deadline can end it.
            "--header-read-timeout-ms",
            "60000",
            "--shutdown-timeout-ms",
            "500",
        ])
        .start();
    let mut half = connect(pb.addr()).await;
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Half")
        .await
        .expect("write");
    // The connection is up and served: a full request on another one works.
    let mut ok = connect(pb.addr()).await;
    ok.write_all(HEAD).await.expect("write");
    assert_eq!(
        read_reply(&mut ok, Duration::from_secs(5)).await.status,
        200
    );

    let signalled = Instant::now();
    pb.terminate();
    let status = pb.wait_exit(Duration::from_secs(5)).await;
    let took = signalled.elapsed();
    assert!(
        status.is_some_and(|s| s.success()),
        "pinboard did not exit cleanly within 5 s of SIGTERM: {status:?}"
    );
    assert!(took < Duration::from_secs(3), "exit took {took:?}");
    let (ended, _) = wait_closed(&mut half, Duration::from_secs(2)).await;
    assert_eq!(ended, Ended::Closed);
}
