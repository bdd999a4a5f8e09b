//! The proxy's deadline toward workers: a frozen (SIGSTOPped) Python worker
//! or a worker that never answers yields 504 within `--upstream-timeout-ms`,
//! is never re-sent the request, and loses its ids once its lease lapses;
//! the idempotent re-send after a dropped worker connection still works;
//! a worker's answer body that pauses longer than
//! `--upstream-body-timeout-ms` is cut short and counted, on both upstream
//! paths, while an upgraded connection may stay silent.

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::raw::{connect, raw_worker, wait_closed, Act, Answer, Client, Ended, Gate, Seen};
use support::{
    client, eventually, get_json, id_on, pinboard, python_worker, wait_workers, LEASE_TTL_MS,
};
use test_support::metrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

    let before = metrics::scrape(&c, &pb.url).await;
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
    let after = metrics::scrape(&c, &pb.url).await;
    assert_eq!(
        metrics::moved(&before, &after, "pinboard_proxy_upstream_timeouts"),
        1.0
    );

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
    let before = metrics::scrape(&c, &pb2.url).await;
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
    let after = metrics::scrape(&c, &pb2.url).await;
    assert_eq!(
        metrics::moved(&before, &after, "pinboard_proxy_upstream_errors"),
        1.0
    );
}

/// The longest pause a worker's answer body may take in the two tests
/// below (`--upstream-body-timeout-ms`).
const BODY_PAUSE_MS: u64 = 600;

fn target(seen: &Seen) -> &str {
    seen.request_line.split_whitespace().nth(1).unwrap_or("")
}

/// `--upstream-body-timeout-ms` bounds each pause in a worker's answer
/// body, on both upstream paths (pinboard's own HTTP/1 client for a
/// buffered request, hyper's for a streamed one, whose client connection
/// hyper's server then serves): past it the client's answer is cut (no
/// last chunk, or a length never reached, the connection closed) and
/// counted; pauses under it, however many, pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_body_that_pauses_too_long_is_cut_short_and_counted() {
    let pb = pinboard()
        .args(&[
            "--lease-ttl-ms",
            "60000",
            "--upstream-body-timeout-ms",
            &BODY_PAUSE_MS.to_string(),
        ])
        .start();
    let never = Gate::new();
    let gates: Vec<Arc<Gate>> = (0..3).map(|_| Gate::new()).collect();
    let (n, g) = (never.clone(), gates.clone());
    raw_worker(&pb.url, "stall", move |seen, _| {
        let chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n";
        let head = match target(seen) {
            "/counter/s/length" => b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nfirst".to_vec(),
            "/counter/s/paced" => {
                return Answer::Script(vec![
                    Act::Write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\na".to_vec()),
                    Act::Wait(g[0].clone()),
                    Act::Write(b"b".to_vec()),
                    Act::Wait(g[1].clone()),
                    Act::Write(b"c".to_vec()),
                    Act::Wait(g[2].clone()),
                    Act::Write(b"d".to_vec()),
                ])
            }
            _ => chunked.to_vec(),
        };
        Answer::Script(vec![Act::Write(head), Act::Wait(n.clone())])
    })
    .await;

    let streamed = "POST /counter/s/streamed HTTP/1.1\r\nhost: pb\r\n\
                    transfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    let c = client();
    let before = metrics::scrape(&c, &pb.url).await;
    for (what, request) in [
        (
            "length",
            "GET /counter/s/length HTTP/1.1\r\nhost: pb\r\n\r\n",
        ),
        (
            "chunked",
            "GET /counter/s/chunked HTTP/1.1\r\nhost: pb\r\n\r\n",
        ),
        ("streamed request (hyper)", streamed),
    ] {
        let mut client = Client::connect(pb.addr()).await;
        let sent = Instant::now();
        client.send(request.as_bytes()).await;
        let f = client
            .read_until_or_end(false, Duration::from_secs(10), |f| f.complete)
            .await
            .unwrap_or_else(|| panic!("{what}: no head"));
        let took = sent.elapsed();
        assert_eq!(f.status, 200, "{what}");
        assert!(client.ended(), "{what}: the connection stays open");
        assert!(!f.complete, "{what}: a cut body relayed as complete");
        assert_eq!(f.body, b"first", "{what}");
        assert!(
            took >= Duration::from_millis(BODY_PAUSE_MS),
            "{what}: cut after {took:?}"
        );
    }
    let stalls = "pinboard_proxy_upstream_body_stalls";
    let cut = eventually("three stalls counted", Duration::from_secs(5), || async {
        let now = metrics::scrape(&c, &pb.url).await;
        (now.value(stalls) - before.value(stalls) >= 3.0).then_some(now)
    })
    .await;
    assert_eq!(
        metrics::moved(&before, &cut, "pinboard_proxy_upstream_body_stalls"),
        3.0
    );

    // Three pauses of half the bound: longer together than the bound, each
    // under it.
    let mut client = Client::connect(pb.addr()).await;
    client
        .send(b"GET /counter/s/paced HTTP/1.1\r\nhost: pb\r\n\r\n")
        .await;
    for (gate, so_far) in gates.iter().zip([&b"a"[..], b"ab", b"abc"]) {
        let f = client
            .read_until(false, Duration::from_secs(5), |f| {
                f.body.len() >= so_far.len()
            })
            .await;
        assert_eq!(f.body, so_far);
        // The pause itself: the stimulus, not a wait for a result.
        tokio::time::sleep(Duration::from_millis(BODY_PAUSE_MS / 2)).await;
        gate.open();
    }
    let f = client.response(false, Duration::from_secs(5)).await;
    assert!(f.complete && f.body == b"abcd", "{:?}", f.body);
    let paced = metrics::scrape(&c, &pb.url).await;
    assert_eq!(paced.value(stalls), cut.value(stalls), "{paced}");
}

/// An upgraded connection is spliced, not relayed as a body: it may stay
/// silent longer than `--upstream-body-timeout-ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_connection_may_stay_silent_past_the_body_pause_bound() {
    let pb = pinboard()
        .args(&[
            "--lease-ttl-ms",
            "60000",
            "--upstream-body-timeout-ms",
            &BODY_PAUSE_MS.to_string(),
        ])
        .start();
    raw_worker(&pb.url, "echo", |_, _| Answer::SwitchEcho).await;
    let mut s = connect(pb.addr()).await;
    s.write_all(
        b"GET /counter/ws/x HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
    )
    .await
    .expect("write");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut byte))
            .await
            .expect("a 101 in time")
            .expect("read");
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{head:?}");
    let (ended, _) = wait_closed(&mut s, Duration::from_millis(3 * BODY_PAUSE_MS)).await;
    assert_eq!(ended, Ended::Open, "the silent upgraded connection was cut");
    s.write_all(b"ping").await.expect("write");
    let mut echo = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut echo))
        .await
        .expect("echo in time")
        .expect("echo");
    assert_eq!(&echo, b"ping");
}
