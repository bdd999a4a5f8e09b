//! Raw HTTP/1.1 on sockets, for the edge suites: a client that sends
//! exactly the bytes a test wants (half a head, a broken chunk, a stalled
//! body) and sees exactly when the server closes, and a scripted worker
//! that may answer, close the connection without answering, never answer
//! at all, or play a script of exact writes paced by the test's [`Gate`]s.
//! The worker answers the registration challenge itself; the test
//! registers it (no heartbeats: use a long lease).
//!
//! [`Client`] is the other end: one connection to pinboard whose answers
//! are decoded exactly as framed (a length, chunks and trailers, or until
//! close), so a body cut short shows as incomplete rather than as a panic.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::client;
use super::registration::Identity;

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
        values(&self.headers, name).first().copied()
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
    let (first, fields) = head.split_once("\r\n").unwrap_or((head, ""));
    (first.to_owned(), field_lines(fields))
}

/// Every value of header `name` (lowercase) in `headers`.
fn values<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
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

/// A counting signal between a test and a scripted worker: each
/// [`open`](Self::open) lets one [`pass`](Self::pass) through.
#[derive(Debug)]
pub struct Gate(tokio::sync::Semaphore);

impl Gate {
    /// A closed gate.
    pub fn new() -> Arc<Self> {
        Arc::new(Self(tokio::sync::Semaphore::new(0)))
    }

    /// Lets one waiter through (now or when it comes).
    pub fn open(&self) {
        self.0.add_permits(1);
    }

    /// Waits for an opening.
    pub async fn pass(&self) {
        self.0.acquire().await.expect("gate never closes").forget();
    }

    /// Waits for an opening for at most `patience`; panics after that.
    pub async fn pass_within(&self, patience: Duration, what: &str) {
        tokio::time::timeout(patience, self.pass())
            .await
            .unwrap_or_else(|_| panic!("{what}: not within {patience:?}"));
    }
}

/// One step of an [`Answer::Script`].
#[derive(Debug, Clone)]
pub enum Act {
    /// Write these bytes (one `write_all`).
    Write(Vec<u8>),
    /// Wait until the test opens this gate.
    Wait(Arc<Gate>),
    /// Open this gate for the test (everything written before it has
    /// reached the peer's socket: loopback delivers within the write).
    Open(Arc<Gate>),
    /// Close the connection (then [`Raw::closed`] opens once).
    Close,
}

/// A response as it was framed on the wire.
#[derive(Debug, Clone)]
pub struct Framed {
    pub status: u16,
    /// Lowercase names, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The body, chunk framing removed; what has come so far when
    /// incomplete.
    pub body: Vec<u8>,
    /// The trailer section of a chunked body (lowercase names).
    pub trailers: Vec<(String, String)>,
    /// The framing says the body ended: its length was reached, its last
    /// chunk and trailer section came, or (neither length nor chunks) the
    /// peer closed.
    pub complete: bool,
    /// How many buffered bytes the message took.
    len: usize,
}

impl Framed {
    /// Every value of header `name` (lowercase).
    pub fn all(&self, name: &str) -> Vec<&str> {
        values(&self.headers, name)
    }

    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.all(name).first().copied()
    }

    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

fn field_lines(text: &str) -> Vec<(String, String)> {
    text.split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect()
}

/// Decodes one response off the front of `buf` (the answer to a `HEAD`
/// when `head_request`); `None` until its head is complete. `eof`: the
/// peer closed after `buf`.
fn decode(buf: &[u8], head_request: bool, eof: bool) -> Option<Framed> {
    let end = find_head_end(buf)?;
    let (status_line, headers) = parse_head(&String::from_utf8_lossy(&buf[..end]));
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let mut f = Framed {
        status,
        headers,
        body: Vec::new(),
        trailers: Vec::new(),
        complete: false,
        len: end,
    };
    let rest = &buf[end..];
    if head_request || matches!(status, 100..=199 | 204 | 304) {
        f.complete = true;
        return Some(f);
    }
    let chunked = f
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let length = f
        .header("content-length")
        .map(|v| v.parse::<usize>().expect("content-length"));
    if chunked {
        let mut at = 0;
        while let Some(nl) = rest[at..].windows(2).position(|w| w == b"\r\n") {
            let line = String::from_utf8_lossy(&rest[at..at + nl]).into_owned();
            let digits = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(digits, 16).expect("chunk size");
            let data = at + nl + 2;
            if size == 0 {
                let section = &rest[data..];
                if section.starts_with(b"\r\n") {
                    at = data + 2;
                    f.complete = true;
                } else if let Some(e) = find_head_end(section) {
                    f.trailers = field_lines(&String::from_utf8_lossy(&section[..e]));
                    at = data + e;
                    f.complete = true;
                }
                break;
            }
            if rest.len() < data + size + 2 {
                f.body
                    .extend_from_slice(&rest[data..rest.len().min(data + size)]);
                break;
            }
            assert_eq!(&rest[data + size..data + size + 2], b"\r\n", "chunk end");
            f.body.extend_from_slice(&rest[data..data + size]);
            at = data + size + 2;
        }
        f.len = end + at;
    } else if let Some(length) = length {
        let take = rest.len().min(length);
        f.body = rest[..take].to_vec();
        f.complete = take == length;
        f.len = end + take;
    } else {
        f.body = rest.to_vec();
        f.complete = eof;
        f.len = buf.len();
    }
    Some(f)
}

/// One connection to pinboard that reads responses exactly as framed.
pub struct Client {
    s: TcpStream,
    buf: Vec<u8>,
    eof: bool,
}

impl Client {
    /// Connect to `addr`.
    pub async fn connect(addr: SocketAddr) -> Self {
        Self {
            s: connect(addr).await,
            buf: Vec::new(),
            eof: false,
        }
    }

    /// Writes `bytes` as they are.
    pub async fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).await.expect("write to pinboard");
    }

    /// The peer closed (or reset) the connection.
    pub fn ended(&self) -> bool {
        self.eof
    }

    /// Reads until the next response (to a `HEAD` when `head_request`)
    /// satisfies `until` or the connection ends, and answers it as it is
    /// then (not taken off the buffer). Panics when `patience` passes
    /// first, or the connection ends before a whole head.
    pub async fn read_until(
        &mut self,
        head_request: bool,
        patience: Duration,
        until: impl Fn(&Framed) -> bool,
    ) -> Framed {
        match self.read_until_or_end(head_request, patience, until).await {
            Some(f) => f,
            None => panic!(
                "connection ended before a response head: {:?}",
                String::from_utf8_lossy(&self.buf)
            ),
        }
    }

    /// As [`read_until`](Self::read_until), but `None` when the
    /// connection ends before a whole head.
    pub async fn read_until_or_end(
        &mut self,
        head_request: bool,
        patience: Duration,
        until: impl Fn(&Framed) -> bool,
    ) -> Option<Framed> {
        let deadline = Instant::now() + patience;
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            match decode(&self.buf, head_request, self.eof) {
                Some(f) if self.eof || until(&f) => return Some(f),
                None if self.eof => return None,
                _ => {}
            }
            match tokio::time::timeout_at(deadline, self.s.read(&mut chunk)).await {
                Err(_) => panic!(
                    "no such response within {patience:?}; have {} bytes: {:?}",
                    self.buf.len(),
                    String::from_utf8_lossy(&self.buf[..self.buf.len().min(600)])
                ),
                Ok(Ok(0)) | Ok(Err(_)) => self.eof = true,
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// The next response: whole (and taken off the buffer, so the next
    /// one can be read), or as far as it came before the connection ended
    /// (`complete` false).
    pub async fn response(&mut self, head_request: bool, patience: Duration) -> Framed {
        let f = self
            .read_until(head_request, patience, |f| f.complete)
            .await;
        if f.complete {
            self.buf.drain(..f.len);
        }
        f
    }

    /// Bytes read and not yet taken by [`response`](Self::response).
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }
}

/// What a scripted worker does with an instance request.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Read the request body whole (recorded in [`Seen::body`]), then play
    /// these acts; at their end, if the connection is still open, wait
    /// for the next request on it.
    Script(Vec<Act>),
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
    /// The request body as it came on the wire (only for
    /// [`Answer::Script`]).
    pub body: Vec<u8>,
}

impl Seen {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.all(name).first().copied()
    }

    /// Every value of header `name` (lowercase).
    pub fn all(&self, name: &str) -> Vec<&str> {
        values(&self.headers, name)
    }
}

type Script = dyn Fn(&Seen, u32) -> Answer + Send + Sync;

/// A scripted worker's state.
pub struct Raw {
    pub identity: Identity,
    pub hits: AtomicU32,
    /// Connections that carried an instance request (the challenge comes
    /// on connections of its own and is not counted).
    pub conns: AtomicU32,
    /// Opens once per connection an [`Act::Close`] closed, after it closed.
    pub closed: Arc<Gate>,
    /// The ends (pinboard's, the worker's) of each connection counted in
    /// `conns`, in order.
    pub peers: Mutex<Vec<(SocketAddr, SocketAddr)>>,
    pub seen: Mutex<Vec<Seen>>,
    script: Box<Script>,
}

/// Reads a request body off `buf` and `s`: the bytes as they came on the
/// wire (chunk framing included), `None` if the connection ended first.
async fn read_body(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    headers: &[(String, String)],
) -> Option<Vec<u8>> {
    let mut chunk = [0u8; 8192];
    let header = |name: &str| {
        values(headers, name)
            .first()
            .map(|v| v.to_ascii_lowercase())
    };
    if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        while buf.len() < len {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        return Some(buf.drain(..len).collect());
    }
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        // Good enough for tests: until the last chunk's terminator.
        while !buf.windows(5).any(|w| w == b"0\r\n\r\n") {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        if let Some(i) = buf.windows(5).position(|w| w == b"0\r\n\r\n") {
            return Some(buf.drain(..i + 5).collect());
        }
    }
    Some(Vec::new())
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
    let mut counted = false;
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
        let mut seen = Seen {
            request_line,
            headers,
            body: Vec::new(),
        };
        let target = seen
            .request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        if let Some(query) = target.strip_prefix("/_pinned/challenge") {
            // pinboard percent-encodes the challenge (`-` too).
            let challenge = query
                .split_once("challenge=")
                .map(|(_, c)| percent_encoding::percent_decode_str(c).decode_utf8_lossy());
            let proxy_secret = seen.header("pinboard-proxy-secret");
            let (status, body) = raw
                .identity
                .answer_challenge(proxy_secret, challenge.as_deref());
            if !respond(&mut s, status, &body).await {
                return;
            }
            continue;
        }
        if !counted {
            counted = true;
            raw.conns.fetch_add(1, Ordering::SeqCst);
            if let (Ok(peer), Ok(own)) = (s.peer_addr(), s.local_addr()) {
                raw.peers.lock().push((peer, own));
            }
        }
        let hit = raw.hits.fetch_add(1, Ordering::SeqCst) + 1;
        let answer = (raw.script)(&seen, hit);
        if let Answer::Script(acts) = answer {
            let Some(body) = read_body(&mut s, &mut buf, &seen.headers).await else {
                return;
            };
            seen.body = body;
            raw.seen.lock().push(seen);
            for act in acts {
                match act {
                    Act::Write(bytes) => {
                        if s.write_all(&bytes).await.is_err() {
                            return;
                        }
                    }
                    Act::Wait(gate) => gate.pass().await,
                    Act::Open(gate) => gate.open(),
                    Act::Close => {
                        drop(s);
                        raw.closed.open();
                        return;
                    }
                }
            }
            continue;
        }
        raw.seen.lock().push(seen.clone());
        match answer {
            Answer::Close => return,
            Answer::Script(_) => unreachable!("played above"),
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
                if read_body(&mut s, &mut buf, &seen.headers).await.is_none() {
                    return;
                }
                if !respond(&mut s, status, &body).await {
                    return;
                }
            }
            Answer::JsonWith(status, extra, body) => {
                if read_body(&mut s, &mut buf, &seen.headers).await.is_none() {
                    return;
                }
                if !respond_with(&mut s, status, &extra, &body).await {
                    return;
                }
            }
            Answer::After(wait, status, body) => {
                if read_body(&mut s, &mut buf, &seen.headers).await.is_none() {
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

/// Start a scripted worker hosting `/counter` and register it with `pb`
/// as `name` (see [`Identity::named`]); `script(request, hit)` (hits count
/// from 1) decides each answer.
pub async fn raw_worker(
    pb: &str,
    name: &'static str,
    script: impl Fn(&Seen, u32) -> Answer + Send + Sync + 'static,
) -> (Arc<Raw>, String) {
    let raw = Arc::new(Raw {
        identity: Identity::named(name),
        hits: AtomicU32::new(0),
        conns: AtomicU32::new(0),
        closed: Gate::new(),
        peers: Mutex::new(Vec::new()),
        seen: Mutex::new(Vec::new()),
        script: Box::new(script),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let serving = raw.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            // Each write leaves as written (a script's pacing and splits
            // must not be merged by Nagle's algorithm).
            let _ = s.set_nodelay(true);
            tokio::spawn(serve_conn(serving.clone(), s));
        }
    });
    let session = raw.identity.register(pb, &["/counter"], addr, None).await;
    (raw, session)
}

/// The value of `name` in pinboard's `/metrics` text (0 when absent).
pub async fn metric(pb: &str, name: &str) -> f64 {
    let scrape = test_support::metrics::scrape(&client(), pb).await;
    scrape.sample(name).unwrap_or(0.0)
}
