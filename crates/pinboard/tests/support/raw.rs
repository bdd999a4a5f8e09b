//! Raw HTTP/1.1 on sockets, for the edge suites: a client that sends
//! exactly the bytes a test wants (half a head, a broken chunk, a stalled
//! body) and sees exactly when the server closes, and a scripted worker
//! that may answer, close the connection without answering, or never
//! answer at all. The worker answers the registration challenge itself;
//! the test registers it (no heartbeats: use a long lease).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::{bearer, client};

/// A parsed response.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// Lowercase names.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// Connect to `addr`.
pub async fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).await.expect("connect");
    s.set_nodelay(true).expect("nodelay");
    s
}

/// How reading from a connection ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The peer closed it (EOF or reset).
    Closed,
    /// Still open at the deadline.
    Open,
}

/// Read (and discard) until the peer closes the connection or `patience`
/// passes; returns how it ended and what was read.
pub async fn wait_closed(s: &mut TcpStream, patience: Duration) -> (Ended, Vec<u8>) {
    let deadline = Instant::now() + patience;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return (Ended::Open, got),
            Ok(Ok(0)) | Ok(Err(_)) => return (Ended::Closed, got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

fn parse_head(head: &str) -> (String, Vec<(String, String)>) {
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap_or_default().to_owned();
    let headers = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (first, headers)
}

/// Read one response (a `Content-Length` body, or none) within `patience`.
/// Panics if the connection closes first or the deadline passes.
pub async fn read_reply(s: &mut TcpStream, patience: Duration) -> Reply {
    let deadline = Instant::now() + patience;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(end) = find_head_end(&buf) {
            break end;
        }
        let n = tokio::time::timeout_at(deadline, s.read(&mut chunk))
            .await
            .expect("a response head in time")
            .expect("read");
        assert!(n > 0, "connection closed before a response: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    };
    let (status_line, headers) = parse_head(&String::from_utf8_lossy(&buf[..head_end]));
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map_or(0, |(_, v)| v.parse().expect("content-length"));
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = tokio::time::timeout_at(deadline, s.read(&mut chunk))
            .await
            .expect("a response body in time")
            .expect("read");
        assert!(n > 0, "connection closed mid-body");
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(len);
    Reply {
        status,
        headers,
        body,
    }
}

/// What a scripted worker does with an instance request.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Read the body (by `Content-Length` or chunked), then answer this
    /// status with this JSON body.
    Json(u16, Value),
    /// As `Json`, with these extra response headers.
    JsonWith(u16, Vec<(&'static str, &'static str)>, Value),
    /// As `Json`, after waiting this long.
    After(Duration, u16, Value),
    /// Switch protocols (101) and echo every byte back until EOF.
    SwitchEcho,
    /// Close the connection without answering.
    Close,
    /// Never answer (the connection stays open).
    Hang,
}

/// A request as the scripted worker saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub request_line: String,
    /// Lowercase names, in arrival order.
    pub headers: Vec<(String, String)>,
}

impl Seen {
    /// Every value of header `name` (lowercase).
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

type Script = dyn Fn(&Seen, u32) -> Answer + Send + Sync;

/// A scripted worker's state.
pub struct Raw {
    pub secret: String,
    challenge: (String, String),
    pub hits: AtomicU32,
    pub seen: Mutex<Vec<Seen>>,
    script: Box<Script>,
}

async fn read_body(s: &mut TcpStream, buf: &mut Vec<u8>, headers: &[(String, String)]) -> bool {
    let mut chunk = [0u8; 8192];
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.to_ascii_lowercase())
    };
    if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        while buf.len() < len {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..len);
        return true;
    }
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        // Good enough for tests: until the last chunk's terminator.
        while !buf.windows(5).any(|w| w == b"0\r\n\r\n") {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        if let Some(i) = buf.windows(5).position(|w| w == b"0\r\n\r\n") {
            buf.drain(..i + 5);
        }
    }
    true
}

async fn respond(s: &mut TcpStream, status: u16, body: &Value) -> bool {
    respond_with(s, status, &[], body).await
}

async fn respond_with(
    s: &mut TcpStream,
    status: u16,
    extra: &[(&str, &str)],
    body: &Value,
) -> bool {
    let body = body.to_string();
    let mut head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (n, v) in extra {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await.is_ok() && s.write_all(body.as_bytes()).await.is_ok()
}

async fn serve_conn(raw: Arc<Raw>, mut s: TcpStream) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let end = loop {
            if let Some(end) = find_head_end(&buf) {
                break end;
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let (request_line, headers) = parse_head(&String::from_utf8_lossy(&buf[..end]));
        buf.drain(..end);
        let seen = Seen {
            request_line,
            headers,
        };
        let target = seen
            .request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        if target.starts_with("/_pinned/challenge") {
            let (c, v) = &raw.challenge;
            let ok = target.ends_with(&format!("challenge={c}"));
            let (status, body) = if ok {
                (200, json!({ "value": v }))
            } else {
                (404, json!({ "detail": "unknown challenge" }))
            };
            if !respond(&mut s, status, &body).await {
                return;
            }
            continue;
        }
        let hit = raw.hits.fetch_add(1, Ordering::SeqCst) + 1;
        let answer = (raw.script)(&seen, hit);
        raw.seen.lock().push(seen.clone());
        match answer {
            Answer::Close => return,
            Answer::SwitchEcho => {
                let head = "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: echo\r\n\r\n";
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                if !buf.is_empty() && s.write_all(&buf).await.is_err() {
                    return;
                }
                loop {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if s.write_all(&chunk[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            }
            Answer::Hang => {
                // Hold the socket open, reading nothing more.
                std::future::pending::<()>().await;
            }
            Answer::Json(status, body) => {
                if !read_body(&mut s, &mut buf, &seen.headers).await {
                    return;
                }
                if !respond(&mut s, status, &body).await {
                    return;
                }
            }
            Answer::JsonWith(status, extra, body) => {
                if !read_body(&mut s, &mut buf, &seen.headers).await {
                    return;
                }
                if !respond_with(&mut s, status, &extra, &body).await {
                    return;
                }
            }
            Answer::After(wait, status, body) => {
                if !read_body(&mut s, &mut buf, &seen.headers).await {
                    return;
                }
                tokio::time::sleep(wait).await;
                if !respond(&mut s, status, &body).await {
                    return;
                }
            }
        }
    }
}

/// Start a scripted worker hosting `/counter` and register it with `pb`;
/// `script(request, hit)` (hits count from 1) decides each answer.
pub async fn raw_worker(
    pb: &str,
    name: &'static str,
    script: impl Fn(&Seen, u32) -> Answer + Send + Sync + 'static,
) -> (Arc<Raw>, String) {
    let raw = Arc::new(Raw {
        secret: format!("secret-of-{name}"),
        challenge: (format!("ch{name}"), format!("val{name}")),
        hits: AtomicU32::new(0),
        seen: Mutex::new(Vec::new()),
        script: Box::new(script),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let serving = raw.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(serve_conn(serving.clone(), s));
        }
    });
    let (c, v) = raw.challenge.clone();
    let res = client()
        .post(format!("{pb}/registry/register"))
        .header("authorization", bearer())
        .json(&json!({
            "clientId": name, "secret": raw.secret, "namespaces": ["/counter"],
            "advertiseUrl": format!("http://{addr}"), "headroom": 100, "draining": false,
            "challenge": c, "challengeValue": v,
        }))
        .send()
        .await
        .expect("register");
    assert_eq!(res.status(), 200, "{:?}", res.text().await);
    let ack: Value = res.json().await.expect("ack");
    (raw, ack["sessionId"].as_str().expect("session").to_owned())
}

/// The value of `name` in pinboard's `/metrics` text (0 when absent).
pub async fn metric(pb: &str, name: &str) -> f64 {
    let text = client()
        .get(format!("{pb}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}
