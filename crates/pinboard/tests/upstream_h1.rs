//! pinboard's own HTTP/1.1 client (`upstream::h1`) end to end: a real
//! pinboard in front of a scripted worker that writes exact bytes, paced
//! by the test, so each framing and connection case is played byte for
//! byte and what the client receives is checked as framed.
//!
//! Every pinboard here runs with `--proxy-retries 0` (a failed exchange is
//! not hidden by a re-send) and one I/O thread (one idle list per worker,
//! so connection counts are exact). The worker counts the connections that
//! carried requests; the challenge comes on connections of its own.

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::json;
use support::raw::{raw_worker, Act, Answer, Client, Framed, Gate, Raw, Seen};
use support::{pinboard, Proc};
use test_support::sockets::kernel_socket;
use test_support::{until, PATIENCE};

/// pinboard with one scripted worker `name`; `script` answers by request.
async fn setup(
    name: &'static str,
    script: impl Fn(&Seen, u32) -> Answer + Send + Sync + 'static,
) -> (Proc, Arc<Raw>, Client) {
    let pb = pinboard()
        .args(&[
            "--lease-ttl-ms",
            "60000",
            "--proxy-retries",
            "0",
            "--io-threads",
            "1",
        ])
        .start();
    let (worker, _) = raw_worker(&pb.url, name, script).await;
    let client = Client::connect(pb.addr()).await;
    (pb, worker, client)
}

/// The request target the worker saw.
fn target(seen: &Seen) -> &str {
    seen.request_line.split_whitespace().nth(1).unwrap_or("")
}

/// A script of writes.
fn writes<const N: usize>(parts: [&[u8]; N]) -> Answer {
    Answer::Script(parts.iter().map(|p| Act::Write(p.to_vec())).collect())
}

/// `200` with a `Content-Length` body.
fn ok(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A request without a body.
fn request(method: &str, path: &str, extra: &str) -> Vec<u8> {
    format!("{method} {path} HTTP/1.1\r\nhost: pb\r\n{extra}\r\n").into_bytes()
}

/// `GET path` on `client`: its whole response.
async fn get(client: &mut Client, path: &str) -> Framed {
    client.send(&request("GET", path, "")).await;
    client.response(false, PATIENCE).await
}

/// `/proc/net/tcp`'s code for an established connection.
const ESTABLISHED: &str = "01";

/// The ends (pinboard's, the worker's) of the worker's latest connection.
fn last_peer(worker: &Raw) -> (std::net::SocketAddr, std::net::SocketAddr) {
    *worker.peers.lock().last().expect("a connection")
}

fn conns(worker: &Raw) -> u32 {
    worker.conns.load(Ordering::SeqCst)
}

/// Asserts a whole `200` with `body`.
fn assert_ok(f: &Framed, body: &[u8], what: &str) {
    assert_eq!(
        f.status,
        200,
        "{what}: {:?}",
        String::from_utf8_lossy(&f.body)
    );
    assert!(f.complete, "{what}: incomplete");
    assert_eq!(f.body, body, "{what}");
}

/// `len` bytes that are not all alike (a shifted or dropped run shows).
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_bodies_arrive_exactly_however_they_are_written() {
    const LEN: usize = 200_000;
    let body = pattern(LEN);
    let (g1, g2) = (Gate::new(), Gate::new());
    let (script_body, s1, s2) = (body.clone(), g1.clone(), g2.clone());
    let (pb, worker, mut client) = setup("cl", move |seen, _| match target(seen) {
        "/counter/a/paced" => {
            let mut head = format!("HTTP/1.1 200 OK\r\ncontent-length: {LEN}\r\n\r\n").into_bytes();
            head.extend_from_slice(&script_body[..1000]);
            Answer::Script(vec![
                Act::Write(head),
                Act::Wait(s1.clone()),
                Act::Write(script_body[1000..101_000].to_vec()),
                Act::Wait(s2.clone()),
                Act::Write(script_body[101_000..].to_vec()),
            ])
        }
        _ => writes([&ok("hello, whole")]),
    })
    .await;

    let f = get(&mut client, "/counter/a/with-head").await;
    assert_ok(&f, b"hello, whole", "with its head");
    assert_eq!(f.all("content-length"), ["12"]);

    // Each part reaches the client before the next is written: the body
    // is relayed as it comes, across reads, past 64 KiB.
    client.send(&request("GET", "/counter/a/paced", "")).await;
    let f = client
        .read_until(false, PATIENCE, |f| f.body.len() >= 1000)
        .await;
    assert_eq!(f.all("content-length"), [LEN.to_string()]);
    assert_eq!(f.body, body[..1000], "first part");
    g1.open();
    let f = client
        .read_until(false, PATIENCE, |f| f.body.len() >= 101_000)
        .await;
    assert_eq!(f.body, body[..101_000], "second part");
    g2.open();
    let f = client.response(false, PATIENCE).await;
    assert_ok(&f, &body, "paced");

    let f = get(&mut client, "/counter/a/again").await;
    assert_ok(&f, b"hello, whole", "after");
    assert_eq!(
        conns(&worker),
        1,
        "every response ended cleanly: one connection"
    );
    drop(pb);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_bodies_split_at_awkward_places_arrive_whole() {
    let gates: Vec<Arc<Gate>> = (0..4).map(|_| Gate::new()).collect();
    let g = gates.clone();
    let (pb, worker, mut client) = setup("chunks", move |seen, _| match target(seen) {
        "/counter/c/split" => Answer::Script(vec![
            // Between a chunk's data and its CRLF.
            Act::Write(
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhello".to_vec(),
            ),
            Act::Wait(g[0].clone()),
            // Between the CR and the LF after data.
            Act::Write(b"\r\n7 ; name=\"quoted;value\"\r\n, world\r".to_vec()),
            Act::Wait(g[1].clone()),
            // Inside a size line (`1|a`).
            Act::Write(b"\n3\r\n!!!\r\n1".to_vec()),
            Act::Wait(g[2].clone()),
            // Inside the last-chunk line.
            Act::Write(b"A;x=y\r\nabcdefghijklmnopqrstuvwxyz\r\n0".to_vec()),
            Act::Wait(g[3].clone()),
            Act::Write(b"\r\n\r\n".to_vec()),
        ]),
        _ => {
            writes([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"])
        }
    })
    .await;

    client.send(&request("GET", "/counter/c/split", "")).await;
    for (gate, so_far) in gates.iter().zip([
        &b"hello"[..],
        b"hello, world",
        b"hello, world!!!",
        b"hello, world!!!abcdefghijklmnopqrstuvwxyz",
    ]) {
        let f = client
            .read_until(false, PATIENCE, |f| f.body.len() >= so_far.len())
            .await;
        assert_eq!(f.body, so_far);
        assert!(!f.complete, "complete before its last chunk");
        gate.open();
    }
    let f = client.response(false, PATIENCE).await;
    assert_ok(&f, b"hello, world!!!abcdefghijklmnopqrstuvwxyz", "split");

    let f = get(&mut client, "/counter/c/plain").await;
    assert_ok(&f, b"abc", "plain");
    assert_eq!(conns(&worker), 1, "chunked bodies ended cleanly");
    drop(pb);
}

/// hyper's server writes trailers only to a client that sent
/// `TE: trailers`, and only the fields the response's `Trailer` names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_reach_a_client_that_asked_and_the_body_is_intact_for_one_that_did_not() {
    let (pb, worker, mut client) = setup("trailers", |_, _| {
        writes([
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum\r\n\r\n\
              4\r\nbody\r\n6\r\n, more\r\n0\r\nx-checksum: abc\r\n\r\n",
        ])
    })
    .await;

    client
        .send(&request("GET", "/counter/t/x", "te: trailers\r\n"))
        .await;
    let f = client.response(false, PATIENCE).await;
    assert_ok(&f, b"body, more", "asked for trailers");
    assert_eq!(f.trailers, [("x-checksum".to_owned(), "abc".to_owned())]);

    let f = get(&mut client, "/counter/t/y").await;
    assert_ok(&f, b"body, more", "did not ask");
    assert!(f.trailers.is_empty(), "{:?}", f.trailers);
    assert_eq!(conns(&worker), 1, "the trailer section ended each body");
    drop(pb);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_ended_by_close_is_whole_and_the_next_request_dials_again() {
    let gate = Gate::new();
    let g = gate.clone();
    let (pb, worker, mut client) = setup("eof", move |seen, _| match target(seen) {
        "/counter/u/x" => Answer::Script(vec![
            Act::Write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil ".to_vec()),
            Act::Wait(g.clone()),
            Act::Write(b"the end".to_vec()),
            Act::Close,
        ]),
        _ => writes([&ok("next")]),
    })
    .await;

    client.send(&request("GET", "/counter/u/x", "")).await;
    let f = client
        .read_until(false, PATIENCE, |f| f.body == b"until ")
        .await;
    assert!(!f.complete);
    gate.open();
    let f = client.response(false, PATIENCE).await;
    assert_ok(&f, b"until the end", "until close");
    assert!(!client.ended(), "pinboard keeps the client's connection");

    let f = get(&mut client, "/counter/u/next").await;
    assert_ok(&f, b"next", "after the close");
    assert_eq!(conns(&worker), 2, "the closed connection was not reused");
    drop(pb);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodiless_answers_end_at_their_head_and_keep_the_connection() {
    let (pb, worker, mut client) = setup("bodiless", |seen, _| match target(seen) {
        "/counter/h/head" => {
            writes([b"HTTP/1.1 200 OK\r\ncontent-length: 1234\r\ncontent-type: text/plain\r\n\r\n"])
        }
        "/counter/h/204" => writes([b"HTTP/1.1 204 No Content\r\nx-a: 1\r\n\r\n"]),
        // A 304 may carry the length of the representation it stands for.
        "/counter/h/304" => {
            writes([b"HTTP/1.1 304 Not Modified\r\netag: \"v1\"\r\ncontent-length: 50\r\n\r\n"])
        }
        _ => writes([&ok("after")]),
    })
    .await;

    for round in 0..2 {
        client.send(&request("HEAD", "/counter/h/head", "")).await;
        let f = client.response(true, PATIENCE).await;
        assert_eq!(f.status, 200, "round {round}");
        assert_eq!(f.all("content-length"), ["1234"], "round {round}");

        let f = get(&mut client, "/counter/h/204").await;
        assert_eq!(f.status, 204, "round {round}");
        assert_eq!(f.header("x-a"), Some("1"));

        let f = get(&mut client, "/counter/h/304").await;
        assert_eq!(f.status, 304, "round {round}");
        assert_eq!(f.header("etag"), Some("\"v1\""));

        // Nothing of a body was waited for or relayed: the next answer
        // on the same client connection starts clean.
        let f = get(&mut client, "/counter/h/after").await;
        assert_ok(&f, b"after", "after the bodiless ones");
    }
    assert!(
        client.buffered().is_empty(),
        "stray bytes after the answers"
    );
    assert_eq!(conns(&worker), 1, "eight requests, one connection");
    drop(pb);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_reuses_one_connection_and_survives_the_worker_closing_it() {
    let (idle, later, written) = (Gate::new(), Gate::new(), Gate::new());
    let (i, l, w) = (idle.clone(), later.clone(), written.clone());
    let (pb, worker, mut client) = setup("keepalive", move |seen, _| match target(seen) {
        "/counter/k/close" => Answer::Script(vec![
            Act::Write(
                b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 3\r\n\r\nbye".to_vec(),
            ),
            Act::Close,
        ]),
        "/counter/k/idle" => Answer::Script(vec![
            Act::Write(ok("idle")),
            Act::Wait(i.clone()),
            Act::Close,
        ]),
        // The answer with bytes nobody asked for right behind it.
        "/counter/k/stray" => {
            let mut bytes = ok("stray");
            bytes.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
            Answer::Script(vec![Act::Write(bytes)])
        }
        // The answer, and later (the connection idle) unasked bytes.
        "/counter/k/stray-later" => Answer::Script(vec![
            Act::Write(ok("stray")),
            Act::Wait(l.clone()),
            Act::Write(b"HTTP/1.1 200 OK\r\n".to_vec()),
            Act::Open(w.clone()),
        ]),
        _ => writes([&ok("ok")]),
    })
    .await;

    for n in 0..10 {
        let f = get(&mut client, &format!("/counter/k/{n}")).await;
        assert_ok(&f, b"ok", "sequential");
    }
    assert_eq!(conns(&worker), 1, "ten sequential requests, one connection");

    // `Connection: close` with the answer: never reused.
    let f = get(&mut client, "/counter/k/close").await;
    assert_ok(&f, b"bye", "close");
    assert!(f.header("connection").is_none(), "hop-by-hop relayed");
    worker.closed.pass_within(PATIENCE, "worker closed").await;
    let f = get(&mut client, "/counter/k/after-close").await;
    assert_ok(&f, b"ok", "after Connection: close");
    assert_eq!(conns(&worker), 2);

    // The worker closes an idle connection without a word: the next
    // request, a GET and then a POST (never re-sent by the proxy), goes
    // out on a new connection.
    for (method, n) in [("GET", 3), ("POST", 4)] {
        let f = get(&mut client, "/counter/k/idle").await;
        assert_ok(&f, b"idle", "idle");
        idle.open();
        worker.closed.pass_within(PATIENCE, "worker closed").await;
        let end = last_peer(&worker);
        until("pinboard's kernel took the close", PATIENCE, || {
            kernel_socket(end).is_none_or(|(state, _)| state != ESTABLISHED)
        })
        .await;
        client
            .send(&request(
                method,
                "/counter/k/after-idle",
                "content-length: 0\r\n",
            ))
            .await;
        let f = client.response(false, PATIENCE).await;
        assert_ok(&f, b"ok", &format!("{method} after a silent close"));
        assert_eq!(conns(&worker), n, "{method}");
    }

    // Bytes after a complete answer, with it or while the connection is
    // idle: that connection is not reused.
    let f = get(&mut client, "/counter/k/stray").await;
    assert_ok(&f, b"stray", "stray");
    let f = get(&mut client, "/counter/k/after-stray").await;
    assert_ok(&f, b"ok", "after stray bytes");
    assert_eq!(conns(&worker), 5);
    let f = get(&mut client, "/counter/k/stray-later").await;
    assert_ok(&f, b"stray", "stray later");
    later.open();
    written.pass_within(PATIENCE, "stray bytes written").await;
    let end = last_peer(&worker);
    until("pinboard's kernel took the stray bytes", PATIENCE, || {
        kernel_socket(end).is_some_and(|(_, unread)| unread > 0)
    })
    .await;
    let f = get(&mut client, "/counter/k/after-stray-later").await;
    assert_ok(&f, b"ok", "after later stray bytes");
    assert_eq!(conns(&worker), 6);
    assert!(!client.ended());
    drop(pb);
}

/// The two cut answers: a `Content-Length` of 100 with 40 bytes, and a
/// chunked body that stops inside a chunk; each part before the cut is
/// 40 bytes of body.
fn cut_parts(chunked: bool) -> Vec<u8> {
    if chunked {
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
          1e\r\n012345678901234567890123456789\r\n20\r\n0123456789"
            .to_vec()
    } else {
        let mut bytes = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n".to_vec();
        bytes.extend_from_slice(&pattern(40));
        bytes
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_cut_short_never_reaches_the_client_as_complete() {
    let gate = Gate::new();
    let g = gate.clone();
    let (pb, worker, _) = setup("cut", move |seen, _| {
        let t = target(seen);
        let bytes = cut_parts(t.contains("chunked"));
        match t {
            "/counter/x/length" | "/counter/x/chunked" => {
                Answer::Script(vec![Act::Write(bytes), Act::Close])
            }
            "/counter/x/length-paced" | "/counter/x/chunked-paced" => {
                Answer::Script(vec![Act::Write(bytes), Act::Wait(g.clone()), Act::Close])
            }
            _ => writes([&ok("fine")]),
        }
    })
    .await;

    for path in ["/counter/x/length", "/counter/x/chunked"] {
        let mut client = Client::connect(pb.addr()).await;
        client.send(&request("GET", path, "")).await;
        // hyper's server may not have flushed the head when the body
        // fails: then the client sees the connection end and nothing else.
        let cut = client
            .read_until_or_end(false, PATIENCE, |f| f.complete)
            .await;
        assert!(client.ended(), "{path}: the client's connection stays open");
        if let Some(f) = cut {
            assert_eq!(f.status, 200, "{path}");
            assert!(!f.complete, "{path}: a cut body relayed as complete");
            assert!(f.body.len() <= 40, "{path}: {} bytes", f.body.len());
        }
    }

    // Paced: the head and the first 40 bytes reach the client before the
    // worker closes; then the client's connection ends, the body short.
    for path in ["/counter/x/length-paced", "/counter/x/chunked-paced"] {
        let mut client = Client::connect(pb.addr()).await;
        client.send(&request("GET", path, "")).await;
        let f = client
            .read_until(false, PATIENCE, |f| f.body.len() >= 40)
            .await;
        assert_eq!(f.status, 200, "{path}");
        gate.open();
        let f = client
            .read_until_or_end(false, PATIENCE, |f| f.complete)
            .await
            .expect("the head came");
        assert!(client.ended(), "{path}: the client's connection stays open");
        assert!(!f.complete, "{path}: a cut body relayed as complete");
        let expected: &[u8] = if path.contains("chunked") {
            b"0123456789012345678901234567890123456789"
        } else {
            &pattern(40)
        };
        assert_eq!(f.body, expected, "{path}");
    }

    let mut client = Client::connect(pb.addr()).await;
    let f = get(&mut client, "/counter/x/after").await;
    assert_ok(&f, b"fine", "after the cuts");
    assert_eq!(conns(&worker), 5, "a cut connection is never reused");
    drop(pb);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_answers_are_a_502_and_pinboard_keeps_serving() {
    let big_head = {
        let mut h = b"HTTP/1.1 200 OK\r\nx-big: ".to_vec();
        h.extend(std::iter::repeat_n(b'a', 70 * 1024));
        h.extend_from_slice(b"\r\ncontent-length: 2\r\n\r\nok");
        h
    };
    let many_fields = (0..101).fold(String::from("HTTP/1.1 200 OK\r\n"), |s, i| {
        s + &format!("x-f{i}: 1\r\n")
    }) + "content-length: 2\r\n\r\nok";
    let never = Gate::new();
    let (pb, worker, mut client) = setup("malformed", move |seen, _| match target(seen) {
        "/counter/m/garbage" => writes([b"SPLAT nonsense\r\n\r\n"]),
        "/counter/m/conflict" => {
            writes([b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!"])
        }
        "/counter/m/big-head" => Answer::Script(vec![Act::Write(big_head.clone())]),
        // Never finished: the bound is met before the end is waited for.
        "/counter/m/big-unfinished" => Answer::Script(vec![
            Act::Write(big_head[..66 * 1024].to_vec()),
            Act::Wait(never.clone()),
        ]),
        "/counter/m/many-fields" => writes([many_fields.as_bytes()]),
        "/counter/m/unasked-101" => writes([b"HTTP/1.1 101 Switching Protocols\r\n\r\n"]),
        _ => writes([&ok("good")]),
    })
    .await;

    for bad in [
        "garbage",
        "conflict",
        "big-head",
        "big-unfinished",
        "many-fields",
        "unasked-101",
    ] {
        let f = get(&mut client, &format!("/counter/m/{bad}")).await;
        assert_eq!(
            f.status,
            502,
            "{bad}: {:?}",
            String::from_utf8_lossy(&f.body)
        );
        assert_eq!(
            f.json(),
            json!({"detail": "worker connection failed mid-request"}),
            "{bad}"
        );
        let f = get(&mut client, "/counter/m/good").await;
        assert_ok(&f, b"good", &format!("after {bad}"));
    }
    assert_eq!(
        worker.hits.load(Ordering::SeqCst),
        12,
        "each request went out once"
    );
    drop(pb);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interim_answers_are_skipped_for_the_final_one() {
    let (pb, worker, mut client) = setup("interim", |_, _| {
        writes([
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n",
            b"HTTP/1.1 102 Processing\r\n\r\n",
            &ok("final"),
        ])
    })
    .await;
    for n in 0..2 {
        let f = get(&mut client, "/counter/i/x").await;
        assert_ok(&f, b"final", "after interim answers");
        assert!(f.header("link").is_none(), "an interim field leaked: {n}");
    }
    assert_eq!(conns(&worker), 1);
    drop(pb);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_go_out_with_exactly_their_length() {
    let (pb, worker, mut client) = setup("bodies", |_, _| writes([&ok("ok")])).await;
    for (request, length, body) in [
        (
            b"POST /counter/p/a HTTP/1.1\r\nhost: pb\r\ncontent-length: 5\r\n\r\nhello".to_vec(),
            vec!["5"],
            &b"hello"[..],
        ),
        (
            b"POST /counter/p/b HTTP/1.1\r\nhost: pb\r\ncontent-length: 0\r\n\r\n".to_vec(),
            vec!["0"],
            b"",
        ),
        (request("POST", "/counter/p/c", ""), vec!["0"], b""),
        (request("GET", "/counter/p/d", ""), vec![], b""),
    ] {
        client.send(&request).await;
        let f = client.response(false, PATIENCE).await;
        assert_ok(&f, b"ok", "post");
        let seen = worker.seen.lock().last().cloned().expect("seen");
        assert_eq!(seen.all("content-length"), length, "{}", seen.request_line);
        assert!(seen.all("transfer-encoding").is_empty());
        assert_eq!(seen.body, body, "{}", seen.request_line);
    }
    assert_eq!(conns(&worker), 1);
    drop(pb);
}

/// RFC 9110 §5.6.1: empty elements of a list do not count, and the
/// `Transfer-Encoding` lines of a head are one list: each of these is a
/// chunked body, relayed decoded (a reader that saw the empty element
/// last would relay the chunk framing as the body, or wait for a close
/// that a keep-alive worker never sends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_transfer_encoding_elements_leave_the_body_chunked() {
    const CASES: [(&str, &str); 4] = [
        ("trailing-comma", "transfer-encoding: chunked,\r\n"),
        ("trailing-blank", "transfer-encoding: chunked, \r\n"),
        ("leading-comma", "transfer-encoding: , chunked\r\n"),
        (
            "empty-line",
            "transfer-encoding: chunked\r\ntransfer-encoding:\r\n",
        ),
    ];
    let (pb, worker, mut client) = setup("telists", |seen, _| {
        let field = CASES
            .iter()
            .find(|(name, _)| target(seen).ends_with(name))
            .map_or("transfer-encoding: chunked\r\n", |(_, field)| field);
        writes([format!("HTTP/1.1 200 OK\r\n{field}\r\n2\r\nok\r\n0\r\n\r\n").as_bytes()])
    })
    .await;
    for (name, _) in CASES {
        let f = get(&mut client, &format!("/counter/te/{name}")).await;
        assert_ok(&f, b"ok", name);
    }
    assert_eq!(
        conns(&worker),
        1,
        "each body ended at its last chunk: one connection"
    );
    drop(pb);
}

/// What lenient parsers take and hyper and nginx refuse: a signed
/// `Content-Length`, text after a chunk size (after a space, a tab or a
/// bare CR), and a bare LF after a chunk's data. Each is a 502, sent once;
/// the connection is dropped and the next request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lenient_framing_is_refused_with_a_502() {
    const CASES: [(&str, &[u8]); 5] = [
        (
            "plus-length",
            b"HTTP/1.1 200 OK\r\ncontent-length: +2\r\n\r\nok",
        ),
        (
            "cr-in-size",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\rX\nok\r\n0\r\n\r\n",
        ),
        (
            "text-after-size",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2 X\r\nok\r\n0\r\n\r\n",
        ),
        (
            "tab-text-after-size",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\tX\r\nok\r\n0\r\n\r\n",
        ),
        (
            "bare-lf-after-data",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\n0\r\n\r\n",
        ),
    ];
    let (pb, worker, mut client) = setup("lenient", |seen, _| {
        match CASES.iter().find(|(name, _)| target(seen).ends_with(name)) {
            Some((_, bytes)) => writes([bytes]),
            None => writes([&ok("good")]),
        }
    })
    .await;
    for (name, _) in CASES {
        let f = get(&mut client, &format!("/counter/l/{name}")).await;
        assert_eq!(
            f.status,
            502,
            "{name}: {:?}",
            String::from_utf8_lossy(&f.body)
        );
        assert_eq!(
            f.json(),
            json!({"detail": "worker connection failed mid-request"}),
            "{name}"
        );
        let f = get(&mut client, "/counter/l/good").await;
        assert_ok(&f, b"good", &format!("after {name}"));
    }
    assert_eq!(worker.hits.load(Ordering::SeqCst), 10, "each went out once");
    assert_eq!(
        conns(&worker),
        6,
        "no refused answer's connection was reused"
    );
    drop(pb);
}

/// With the default `--proxy-retries` (8): a worker that answers a GET
/// with garbage gets it once (the worker took it; nginx's
/// `proxy_next_upstream` leaves `invalid_header` out by default), one that
/// closes the connection without a byte of answer gets it twice (one
/// re-send on a new connection, as for a keep-alive connection the worker
/// closed as it was reused), never nine times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_worker_may_have_started_is_sent_at_most_twice() {
    let pb = pinboard()
        .args(&["--lease-ttl-ms", "60000", "--io-threads", "1"])
        .start();
    let (worker, _) = raw_worker(&pb.url, "resend", |seen, _| match target(seen) {
        "/counter/r/garbage" | "/counter/r/garbage-put" => writes([b"SPLAT nonsense\r\n\r\n"]),
        "/counter/r/cut" => Answer::Script(vec![
            Act::Write(b"HTTP/1.1 200 OK\r\ncontent-le".to_vec()),
            Act::Close,
        ]),
        "/counter/r/silent" | "/counter/r/silent-post" => Answer::Close,
        _ => writes([&ok("fine")]),
    })
    .await;
    let mut client = Client::connect(pb.addr()).await;
    let hits = || worker.hits.load(Ordering::SeqCst);
    for (method, path, sends) in [
        ("GET", "/counter/r/garbage", 1),
        ("PUT", "/counter/r/garbage-put", 1),
        ("GET", "/counter/r/cut", 1),
        ("GET", "/counter/r/silent", 2),
        ("POST", "/counter/r/silent-post", 1),
    ] {
        let before = hits();
        client
            .send(&request(method, path, "content-length: 0\r\n"))
            .await;
        let f = client.response(false, PATIENCE).await;
        assert_eq!(
            f.status,
            502,
            "{method} {path}: {:?}",
            String::from_utf8_lossy(&f.body)
        );
        assert_eq!(hits() - before, sends, "{method} {path}: times sent");
        let f = get(&mut client, "/counter/r/after").await;
        assert_ok(&f, b"fine", &format!("after {path}"));
    }
    drop(pb);
}
