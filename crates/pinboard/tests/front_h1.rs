//! pinboard's own HTTP/1.1 server for proxied requests (`front`) end to
//! end: a real pinboard, a raw client that writes exact bytes, and a
//! scripted worker. What the front serves itself (pipelined and keep-alive
//! requests, buffered bodies however they arrive, `HEAD`, `Connection:
//! close`, a graceful stop mid-request) and what it hands to hyper in the
//! middle of a connection (pinboard's own paths, chunked bodies, HTTP/1.0)
//! must all come out right on one connection.

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use support::raw::{raw_worker, Act, Answer, Client, Gate, Raw, Seen};
use support::{pinboard, Proc};
use test_support::PATIENCE;

fn target(seen: &Seen) -> &str {
    seen.request_line.split_whitespace().nth(1).unwrap_or("")
}

/// The body the worker read with the request for `path`.
fn body_of(worker: &Raw, path: &str) -> String {
    let seen = worker.seen.lock();
    let s = seen
        .iter()
        .find(|s| target(s) == path)
        .unwrap_or_else(|| panic!("the worker never saw {path}"));
    String::from_utf8_lossy(&s.body).into_owned()
}

/// A worker that answers each request with its method and target, as
/// `<method> <target>` (the body it read is in [`Raw::seen`]).
fn echo(seen: &Seen, _: u32) -> Answer {
    let method = seen.request_line.split_whitespace().next().unwrap_or("");
    let text = format!("{method} {}", target(seen));
    Answer::Script(vec![Act::Write(
        format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nx-worker: raw\r\n\r\n{text}",
            text.len()
        )
        .into_bytes(),
    )])
}

async fn setup(
    extra: &[&str],
    script: impl Fn(&Seen, u32) -> Answer + Send + Sync + 'static,
) -> (Proc, Arc<Raw>, Client) {
    let mut args = vec!["--lease-ttl-ms", "60000", "--io-threads", "1"];
    args.extend_from_slice(extra);
    let pb = pinboard().args(&args).start();
    let (worker, _) = raw_worker(&pb.url, "front", script).await;
    let client = Client::connect(pb.addr()).await;
    (pb, worker, client)
}

fn get(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nhost: pb\r\n{extra}\r\n")
}

fn post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: pb\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let (pb, worker, mut client) = setup(&[], echo).await;
    let mut burst = get("/counter/p/one", "");
    burst.push_str(&post("/counter/p/two", "second body"));
    burst.push_str(&get("/counter/p/three?x=1", ""));
    client.send(burst.as_bytes()).await;
    for expected in [
        "GET /counter/p/one",
        "POST /counter/p/two",
        "GET /counter/p/three?x=1",
    ] {
        let f = client.response(false, PATIENCE).await;
        assert_eq!(f.status, 200);
        assert_eq!(String::from_utf8_lossy(&f.body), expected);
        assert_eq!(f.header("x-worker"), Some("raw"));
        assert!(
            f.header("date").is_some(),
            "the worker's answer has no date"
        );
    }
    assert!(!client.ended());
    assert_eq!(body_of(&worker, "/counter/p/two"), "second body");
    assert_eq!(worker.hits.load(Ordering::Relaxed), 3);
    drop(pb);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_handed_to_hyper_mid_way_keeps_serving_every_kind_of_request() {
    let (pb, worker, mut client) = setup(&[], echo).await;
    client.send(get("/counter/h/first", "").as_bytes()).await;
    let f = client.response(false, PATIENCE).await;
    assert_eq!(String::from_utf8_lossy(&f.body), "GET /counter/h/first");

    // pinboard's own path: hyper serves it, and the rest of the connection.
    client.send(get("/healthz", "").as_bytes()).await;
    let f = client.response(false, PATIENCE).await;
    assert_eq!(f.status, 200);
    assert_eq!(f.json()["ok"], true);

    client.send(get("/counter/h/after", "").as_bytes()).await;
    let f = client.response(false, PATIENCE).await;
    assert_eq!(String::from_utf8_lossy(&f.body), "GET /counter/h/after");

    // A chunked body, on a fresh connection whose first request it is.
    let mut chunked = Client::connect(pb.addr()).await;
    chunked
        .send(
            b"POST /counter/h/chunks HTTP/1.1\r\nhost: pb\r\ntransfer-encoding: chunked\r\n\r\n\
              5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        )
        .await;
    let f = chunked.response(false, PATIENCE).await;
    assert_eq!(f.status, 200);
    assert_eq!(String::from_utf8_lossy(&f.body), "POST /counter/h/chunks");
    // As it came on the wire: hyper streamed it on, chunked.
    let body = body_of(&worker, "/counter/h/chunks");
    assert!(
        body.contains("hello") && body.contains(" world"),
        "{body:?}"
    );
    chunked.send(get("/counter/h/next", "").as_bytes()).await;
    let f = chunked.response(false, PATIENCE).await;
    assert_eq!(String::from_utf8_lossy(&f.body), "GET /counter/h/next");

    // HTTP/1.0: hyper's, answered and closed.
    let mut old = Client::connect(pb.addr()).await;
    old.send(b"GET /counter/h/old HTTP/1.0\r\nhost: pb\r\n\r\n")
        .await;
    let f = old.response(false, PATIENCE).await;
    assert_eq!(f.status, 200);
    assert_eq!(String::from_utf8_lossy(&f.body), "GET /counter/h/old");
    drop(pb);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_arrive_whole_however_they_are_sent_and_a_stalled_one_is_408() {
    let (pb, worker, mut client) = setup(&["--body-timeout-ms", "300"], echo).await;
    // The head alone, then the body a byte at a time.
    client
        .send(b"PUT /counter/b/slow HTTP/1.1\r\nhost: pb\r\ncontent-length: 5\r\n\r\n")
        .await;
    for byte in b"bytes" {
        client.send(&[*byte]).await;
    }
    let f = client.response(false, PATIENCE).await;
    assert_eq!(String::from_utf8_lossy(&f.body), "PUT /counter/b/slow");
    assert_eq!(body_of(&worker, "/counter/b/slow"), "bytes");

    // Three bytes of ten, then nothing: the client's fault, on the clock.
    client
        .send(b"POST /counter/b/stall HTTP/1.1\r\nhost: pb\r\ncontent-length: 10\r\n\r\nabc")
        .await;
    let f = client.response(false, PATIENCE).await;
    assert_eq!(f.status, 408);
    assert_eq!(f.json()["detail"], "request body not received in time");
    assert_eq!(f.header("connection"), Some("close"));
    let _ = client.read_until_or_end(false, PATIENCE, |_| false).await;
    assert!(client.ended(), "the connection outlived its broken body");
    drop(pb);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_answers_keep_the_workers_length_and_close_ends_the_connection() {
    let (pb, _worker, mut client) = setup(&[], |seen, _| {
        if seen.request_line.starts_with("HEAD") {
            Answer::Script(vec![Act::Write(
                b"HTTP/1.1 200 OK\r\ncontent-length: 42\r\n\r\n".to_vec(),
            )])
        } else {
            echo(seen, 0)
        }
    })
    .await;
    client
        .send(b"HEAD /counter/c/x HTTP/1.1\r\nhost: pb\r\n\r\n")
        .await;
    let f = client.response(true, PATIENCE).await;
    assert_eq!(f.status, 200);
    assert_eq!(f.header("content-length"), Some("42"));
    // Nothing followed the head: the next answer starts right after it.
    client
        .send(get("/counter/c/close", "connection: close\r\n").as_bytes())
        .await;
    let f = client.response(false, PATIENCE).await;
    assert_eq!(String::from_utf8_lossy(&f.body), "GET /counter/c/close");
    assert_eq!(f.header("connection"), Some("close"));
    let _ = client.read_until_or_end(false, PATIENCE, |_| false).await;
    assert!(client.ended(), "still open after Connection: close");
    assert!(client.buffered().is_empty());
    drop(pb);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_request_in_flight_with_close_and_ends_idle_connections() {
    let gate = Gate::new();
    let held = gate.clone();
    let (mut pb, worker, mut busy) =
        setup(
            &["--shutdown-timeout-ms", "5000"],
            move |seen, _| match target(seen) {
                "/counter/s/held" => Answer::Script(vec![
                    Act::Wait(held.clone()),
                    Act::Write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nlate".to_vec()),
                ]),
                _ => echo(seen, 0),
            },
        )
        .await;
    let mut idle = Client::connect(pb.addr()).await;
    idle.send(get("/counter/s/idle", "").as_bytes()).await;
    assert_eq!(idle.response(false, PATIENCE).await.status, 200);

    busy.send(get("/counter/s/held", "").as_bytes()).await;
    // The worker holds the request: wait until it has it.
    test_support::until("the worker has the held request", PATIENCE, || {
        worker
            .seen
            .lock()
            .iter()
            .any(|s| target(s) == "/counter/s/held")
    })
    .await;
    pb.terminate();
    let _ = idle.read_until_or_end(false, PATIENCE, |_| false).await;
    assert!(idle.ended(), "an idle connection outlived the stop");
    gate.open();
    let f = busy.response(false, PATIENCE).await;
    assert_eq!(f.status, 200);
    assert_eq!(f.body, b"late");
    assert_eq!(f.header("connection"), Some("close"));
    let status = pb.wait_exit(PATIENCE).await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_over_the_limit_are_431_whether_they_arrive_whole_or_in_pieces() {
    let (pb, worker, _) = setup(&["--max-header-bytes", "4096"], echo).await;
    // Under one read (8 KiB) and over the limit.
    let big = get("/counter/o/x", &format!("x-big: {}\r\n", "a".repeat(5000)));
    // In one write: the front may see it complete at once.
    let mut whole = Client::connect(pb.addr()).await;
    whole.send(big.as_bytes()).await;
    assert_eq!(whole.response(false, PATIENCE).await.status, 431);
    // In pieces: it grows past the limit before it is complete.
    let mut pieces = Client::connect(pb.addr()).await;
    for piece in big.as_bytes().chunks(1000) {
        pieces.send(piece).await;
    }
    assert_eq!(pieces.response(false, PATIENCE).await.status, 431);
    assert_eq!(worker.hits.load(Ordering::Relaxed), 0);
    // Under the limit, on a fresh connection, it goes through.
    let mut small = Client::connect(pb.addr()).await;
    small.send(get("/counter/o/small", "").as_bytes()).await;
    assert_eq!(small.response(false, PATIENCE).await.status, 200);
    drop(pb);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_dripped_a_byte_at_a_time_is_served_once_whole() {
    let (pb, worker, mut client) = setup(&[], echo).await;
    let head = get("/counter/d/drip", "x-a: 1\r\n");
    for byte in head.as_bytes() {
        client.send(&[*byte]).await;
    }
    let f = client.response(false, PATIENCE).await;
    assert_eq!(String::from_utf8_lossy(&f.body), "GET /counter/d/drip");
    // The next one, in two pieces split inside its last line break.
    let next = get("/counter/d/next", "");
    let (a, b) = next.as_bytes().split_at(next.len() - 1);
    client.send(a).await;
    client.send(b).await;
    let f = client.response(false, PATIENCE).await;
    assert_eq!(String::from_utf8_lossy(&f.body), "GET /counter/d/next");
    assert_eq!(worker.hits.load(Ordering::Relaxed), 2);
    drop(pb);
}

/// RFC 9112 §2.3: a request of a higher minor version is read as HTTP/1.1
/// (httparse, and hyper with it, refuse anything but 1.0 and 1.1); §3.2:
/// an HTTP/1.1 request without `Host`, or any request with two, is a 400
/// and never reaches a worker, whether the front or hyper (a chunked body
/// or HTTP/1.0 hands the connection over) reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minor_versions_above_1_1_are_served_and_host_lines_are_checked() {
    let (pb, worker, mut client) = setup(&[], echo).await;
    client
        .send(b"GET /counter/v/minor HTTP/1.2\r\nhost: pb\r\n\r\n")
        .await;
    let f = client.response(false, PATIENCE).await;
    assert_eq!(f.status, 200, "{:?}", String::from_utf8_lossy(&f.body));
    assert_eq!(String::from_utf8_lossy(&f.body), "GET /counter/v/minor");
    // The version in a write of its own, after the rest of the line.
    client.send(b"GET /counter/v/split HTTP/1.").await;
    client.send(b"9\r\nhost: pb\r\n\r\n").await;
    let f = client.response(false, PATIENCE).await;
    assert_eq!(String::from_utf8_lossy(&f.body), "GET /counter/v/split");
    for seen in worker.seen.lock().iter() {
        assert!(
            seen.request_line.ends_with(" HTTP/1.1"),
            "{}",
            seen.request_line
        );
    }

    for (what, request, detail) in [
        (
            "missing",
            "GET /counter/v/no-host HTTP/1.1\r\n\r\n",
            "missing Host header",
        ),
        (
            "repeated",
            "GET /counter/v/two-hosts HTTP/1.1\r\nhost: pb\r\nhost: other\r\n\r\n",
            "more than one Host header",
        ),
        (
            "missing, with a chunked body (hyper)",
            "POST /counter/v/no-host-chunked HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n\
             3\r\nabc\r\n0\r\n\r\n",
            "missing Host header",
        ),
        (
            "repeated, HTTP/1.0 (hyper)",
            "GET /counter/v/two-hosts-1.0 HTTP/1.0\r\nhost: pb\r\nhost: other\r\n\r\n",
            "more than one Host header",
        ),
    ] {
        let mut client = Client::connect(pb.addr()).await;
        client.send(request.as_bytes()).await;
        let f = client.response(false, PATIENCE).await;
        assert_eq!(
            f.status,
            400,
            "{what}: {:?}",
            String::from_utf8_lossy(&f.body)
        );
        assert_eq!(f.json()["detail"], detail, "{what}");
    }
    // HTTP/1.0 needs no Host.
    let mut old = Client::connect(pb.addr()).await;
    old.send(b"GET /counter/v/old HTTP/1.0\r\n\r\n").await;
    let f = old.response(false, PATIENCE).await;
    assert_eq!(f.status, 200);
    assert_eq!(String::from_utf8_lossy(&f.body), "GET /counter/v/old");
    let targets: Vec<String> = worker
        .seen
        .lock()
        .iter()
        .map(|s| target(s).to_owned())
        .collect();
    assert_eq!(
        targets,
        ["/counter/v/minor", "/counter/v/split", "/counter/v/old"],
        "a refused request reached the worker"
    );
    drop(pb);
}
