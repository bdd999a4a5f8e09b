//! The codec against hyper, byte for byte: the same message goes to our
//! parser and to hyper's (its HTTP/1 server for requests, its client for
//! responses, over an in-memory socket), and the outcomes are compared.
//!
//! What must hold is what closes a smuggling gap: where both take a
//! message, both cut the same body out of it; where hyper refuses one,
//! ours refuses it too. Ours may refuse what hyper takes only for the
//! reasons [`stricter_by_design`] names (each a choice the codec's docs
//! give), and, for responses, frame a `Transfer-Encoding` list with an
//! empty element by its last coding where hyper takes the empty element
//! as the last (RFC 9110 §5.6.1 says to ignore it; named in
//! [`framed_apart_by_design`]). Every other difference fails the test.

mod fuzz_targets;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Empty};
use hyper::server::conn::http1 as server;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use pinned_edge::h1::body;
use pinned_edge::h1::framing::Framing;
use pinned_edge::h1::head::{self, Fields};
use proptest::prelude::*;
use test_support::PATIENCE;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// Taken, with this body.
    Body(Vec<u8>),
    /// Refused (or cut short: the body never ended cleanly).
    Refused,
}

fn ours_request(wire: &[u8]) -> Outcome {
    let mut fields = Fields::default();
    let Ok(Some(line)) = head::parse_request(wire, &mut fields) else {
        return Outcome::Refused;
    };
    let head = Bytes::copy_from_slice(&wire[..line.len]);
    let Ok(request) = head::request_head(&head, &line, &fields) else {
        return Outcome::Refused;
    };
    let Ok(framing) = request.notes.request_framing(request.parts.version) else {
        return Outcome::Refused;
    };
    match fuzz_targets::decode(framing, &wire[line.len..], 7) {
        Ok(body) => Outcome::Body(body),
        Err(()) => Outcome::Refused,
    }
}

async fn hyper_request(wire: &[u8]) -> Outcome {
    let (mut near, far) = tokio::io::duplex(1 << 16);
    let (seen, body) = tokio::sync::mpsc::unbounded_channel();
    let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        let seen = seen.clone();
        async move {
            let collected = request.into_body().collect().await;
            let _ = seen.send(collected.map(|c| c.to_bytes().to_vec()).ok());
            Ok::<_, std::convert::Infallible>(hyper::Response::new(Empty::<Bytes>::new()))
        }
    });
    let connection = tokio::spawn(
        server::Builder::new()
            .keep_alive(false)
            // The client's end of input is not the end of the exchange.
            .half_close(true)
            .serve_connection(TokioIo::new(far), service),
    );
    near.write_all(wire).await.expect("write");
    near.shutdown().await.expect("shutdown");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, near.read_to_end(&mut answer)).await;
    let _ = tokio::time::timeout(PATIENCE, connection).await;
    drop(near);
    let mut body = body;
    match body.try_recv() {
        // `HTTP/1.0 200` to an HTTP/1.0 request.
        Ok(Some(bytes)) if answer.starts_with(b"HTTP/1.") && answer[8..].starts_with(b" 200 ") => {
            Outcome::Body(bytes)
        }
        _ => Outcome::Refused,
    }
}

fn ours_response(wire: &[u8]) -> Outcome {
    let mut buf = BytesMut::from(wire);
    let Ok(Some(parsed)) =
        head::response_head(&mut buf, &mut Fields::default(), false, &mut 0, 64 * 1024)
    else {
        return Outcome::Refused;
    };
    if parsed.framing == Framing::Chunked && body::check_chunks(&buf).is_err() {
        return Outcome::Refused;
    }
    match fuzz_targets::decode(parsed.framing, &buf, 7) {
        Ok(body) => Outcome::Body(body),
        Err(()) => Outcome::Refused,
    }
}

async fn hyper_response(wire: &[u8]) -> Outcome {
    let wire = wire.to_vec();
    let (near, mut far) = tokio::io::duplex(1 << 16);
    let Ok((mut sender, connection)) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(near)).await
    else {
        return Outcome::Refused;
    };
    let connection = tokio::spawn(connection);
    let request = hyper::Request::get("/")
        .body(Empty::new())
        .expect("request");
    // The answer goes out once the request is in: hyper refuses bytes that
    // arrive before it asked.
    let worker = async move {
        let mut asked = Vec::new();
        let mut byte = [0u8; 1];
        while !asked.ends_with(b"\r\n\r\n") {
            if far.read(&mut byte).await.ok()? == 0 {
                return None;
            }
            asked.push(byte[0]);
        }
        far.write_all(&wire).await.ok()?;
        far.shutdown().await.ok()?;
        Some(far)
    };
    let worker = tokio::spawn(worker_owned(worker));
    let exchange = async {
        let response = sender.send_request(request).await.ok()?;
        let body = response.into_body().collect().await.ok()?;
        Some(body.to_bytes().to_vec())
    };
    let outcome = match tokio::time::timeout(PATIENCE, exchange).await {
        Ok(Some(body)) => Outcome::Body(body),
        _ => Outcome::Refused,
    };
    connection.abort();
    worker.abort();
    outcome
}

/// `worker`, run to its end (its socket kept until then).
async fn worker_owned<F: std::future::Future>(worker: F) {
    let _far = worker.await;
}

/// The head part of `wire`, lower-cased, for the named differences.
fn head_text(wire: &[u8]) -> String {
    let end = wire
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(wire.len());
    String::from_utf8_lossy(&wire[..end]).to_ascii_lowercase()
}

/// Where ours refuses what hyper takes, on purpose: a request with both
/// `Transfer-Encoding` and `Content-Length` (RFC 9112 §6.1 allows the
/// refusal), a `Transfer-Encoding` list with an empty element in a
/// request, and a `Content-Length` of comma-joined repeats or with
/// `Transfer-Encoding` beside it (hyper reads `2, 2` as 2, and ignores a
/// malformed length beside a coding; ours reads digits only), and lengths
/// that disagree where no body is read (a 204: hyper never looks).
fn stricter_by_design(wire: &[u8]) -> bool {
    let head = head_text(wire);
    let te = head.contains("transfer-encoding:");
    let lengths: Vec<&str> = head
        .lines()
        .filter_map(|l| l.strip_prefix("content-length:"))
        .map(str::trim)
        .collect();
    let te_blank = head
        .lines()
        .filter_map(|l| l.strip_prefix("transfer-encoding:"))
        .any(|v| v.split(',').any(|e| e.trim().is_empty()));
    let odd_length = lengths
        .iter()
        .any(|v| v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()));
    let disagree = lengths.windows(2).any(|w| w[0] != w[1]);
    (te && !lengths.is_empty()) || (head.starts_with("post") && te_blank) || odd_length || disagree
}

/// Responses whose `Transfer-Encoding` list has an empty element: framed
/// by its last coding here, by the empty element (not chunked: until
/// close) in hyper.
fn framed_apart_by_design(wire: &[u8]) -> bool {
    head_text(wire)
        .lines()
        .filter_map(|l| l.strip_prefix("transfer-encoding:"))
        .any(|v| v.split(',').any(|e| e.trim().is_empty()))
}

/// A framing field, valid or not.
fn framing_field() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,2}".prop_map(|n| format!("content-length: {n}\r\n")),
        prop_oneof![Just("+2"), Just("2, 2"), Just("0x2"), Just("2 2"), Just("")]
            .prop_map(|v| format!("content-length: {v}\r\n")),
        prop_oneof![
            Just("chunked"),
            Just("gzip, chunked"),
            Just("chunked, gzip"),
            Just("gzip"),
            Just("chunked,"),
            Just(", chunked"),
            Just(""),
        ]
        .prop_map(|v| format!("transfer-encoding: {v}\r\n")),
    ]
}

/// A chunked body, well formed or with junk where lenient parsers skip
/// it.
fn chunked_body() -> impl Strategy<Value = Vec<u8>> {
    let chunk = (
        1usize..12,
        prop_oneof![
            4 => Just(""),
            1 => Just(";x=y"),
            1 => Just(" "),
            1 => Just("x"),
            1 => Just("\r"),
        ],
        prop_oneof![4 => Just("\r\n"), 1 => Just("\n"), 1 => Just("x\r\n")],
    )
        .prop_map(|(n, ext, end)| format!("{n:x}{ext}\r\n{}{end}", "d".repeat(n)));
    (
        prop::collection::vec(chunk, 0..3),
        prop_oneof![
            Just("0\r\n\r\n"),
            Just("0\r\nx-t: 1\r\n\r\n"),
            Just("0\r\n"),
        ],
    )
        .prop_map(|(chunks, last)| (chunks.concat() + last).into_bytes())
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![chunked_body(), "[a-z]{0,20}".prop_map(String::into_bytes)]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Compares one message's outcomes: `Err` names the difference.
fn compare(wire: &[u8], ours: &Outcome, theirs: &Outcome, apart_ok: bool) -> Result<(), String> {
    let text = String::from_utf8_lossy(wire);
    match (ours, theirs) {
        (a, b) if a == b => Ok(()),
        (Outcome::Refused, Outcome::Body(_)) if stricter_by_design(wire) => Ok(()),
        (_, _) if apart_ok && framed_apart_by_design(wire) => Ok(()),
        _ => Err(format!("{text:?}: ours {ours:?}, hyper {theirs:?}")),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn requests_are_framed_as_hyper_frames_them(
        version in prop_oneof![4 => Just("1.1"), 1 => Just("1.0")],
        fields in prop::collection::vec(framing_field(), 0..3),
        body in body(),
    ) {
        let mut wire =
            format!("POST /c/a HTTP/{version}\r\nhost: pb\r\n{}\r\n", fields.concat()).into_bytes();
        wire.extend_from_slice(&body);
        let theirs = runtime().block_on(hyper_request(&wire));
        let ours = ours_request(&wire);
        compare(&wire, &ours, &theirs, false).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn responses_are_framed_as_hyper_frames_them(
        status in prop_oneof![4 => Just("200 OK"), 1 => Just("204 No Content")],
        fields in prop::collection::vec(framing_field(), 0..3),
        body in body(),
    ) {
        let mut wire = format!("HTTP/1.1 {status}\r\n{}\r\n", fields.concat()).into_bytes();
        wire.extend_from_slice(&body);
        let theirs = runtime().block_on(hyper_response(&wire));
        let ours = ours_response(&wire);
        compare(&wire, &ours, &theirs, true).map_err(TestCaseError::fail)?;
    }
}

/// The comparison can fail: messages both take and both refuse, and the
/// named differences, are each seen.
#[test]
fn the_comparison_sees_agreement_and_the_named_differences() {
    let rt = runtime();
    let agree = [
        &b"POST / HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc"[..],
        b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\ncontent-length: +3\r\n\r\nabc",
        b"POST / HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\nabc",
    ];
    let mut outcomes = Vec::new();
    for wire in agree {
        let (ours, theirs) = (ours_request(wire), rt.block_on(hyper_request(wire)));
        assert_eq!(ours, theirs, "{:?}", String::from_utf8_lossy(wire));
        outcomes.push(ours);
    }
    assert!(outcomes.contains(&Outcome::Body(b"abc".to_vec())));
    assert!(outcomes.contains(&Outcome::Refused));
    // Stricter on purpose: hyper takes it, ours refuses.
    let both = b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    assert_eq!(ours_request(both), Outcome::Refused);
    assert_eq!(
        rt.block_on(hyper_request(both)),
        Outcome::Body(b"abc".to_vec())
    );
    assert!(compare(both, &Outcome::Refused, &Outcome::Body(vec![]), false).is_ok());
    // Anything else that differs is a failure.
    let plain = b"POST / HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc";
    assert!(compare(plain, &Outcome::Refused, &Outcome::Body(vec![]), false).is_err());
    assert!(compare(plain, &Outcome::Body(vec![]), &Outcome::Refused, true).is_err());
    // Framed apart on purpose: a trailing empty element.
    let apart = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked,\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    assert_eq!(ours_response(apart), Outcome::Body(b"abc".to_vec()));
    assert_eq!(
        rt.block_on(hyper_response(apart)),
        Outcome::Body(b"3\r\nabc\r\n0\r\n\r\n".to_vec())
    );
}
