//! The worker's own edge, against real sockets with short configured
//! deadlines: a head sent a byte at a time (slowloris) and a silent
//! connection are closed at the header deadline, an idle keep-alive
//! connection at its own longer deadline while a busy request is never cut,
//! at the connection cap the connection idle longest makes room for a new
//! one and, with none idle, one connection too many is closed and its place
//! freed when one ends, a shutdown does not wait on a half-sent request beyond the
//! shutdown deadline, bad edge settings are configuration errors, and with
//! `Options::tls` the worker answers HTTPS (a self-signed certificate made
//! in the test), closing a connection that never handshakes at the header
//! deadline. Handlers see the peer's address (`ConnectInfo`) and the
//! rewritten request line on every request of a keep-alive connection, and
//! the same request whichever stage of the connection read it: the front
//! (a body sent in pieces, read whole) or hyper after it (a body slower
//! than the front waits for, a chunked one, and every request after). A
//! client that closes its connection while its handler waits cancels the
//! handler, as hyper's server did.

mod support;

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::time::Duration;

use pinned::{ConfigError, Options};
use support::Counter;
use test_support::sockets::{admitted, answer, connect, mid_head};
use test_support::PATIENCE;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

type Served = tokio::task::JoinHandle<Result<(), pinned::ServeError>>;

/// Serves `options` (a counter, empty environment) on 127.0.0.1:0 until
/// the returned sender fires.
async fn serving(options: Options) -> (SocketAddr, tokio::sync::oneshot::Sender<()>, Served) {
    let worker = options
        .host::<Counter>("/counter")
        .env_vars(Vec::<(String, String)>::new())
        .build()
        .expect("worker");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, signal) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        pinned::serve(worker)
            .listener(listener)
            .with_graceful_shutdown(async move {
                let _ = signal.await;
            })
            .into_future(),
    );
    (addr, stop, server)
}

/// Reads until the peer closes (EOF or reset) or `patience` passes; true
/// when it closed.
async fn closed_within(s: &mut TcpStream, patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// Sends one `GET` and reads its answer's status, leaving the connection
/// open (keep-alive).
async fn exchange(s: &mut TcpStream, path: &str) -> u16 {
    exchange_text(s, path).await.0
}

/// [`exchange`], also answering the body (as text).
async fn exchange_text(s: &mut TcpStream, path: &str) -> (u16, String) {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: w\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .expect("an answer in time")
            .expect("read");
        assert!(n > 0, "closed before answering");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some(end) = text.find("\r\n\r\n") {
            let length: usize = text[..end]
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + length {
                let status = text[9..12].parse().expect("status");
                return (status, text[end + 4..end + 4 + length].to_owned());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_sent_a_byte_at_a_time_is_closed_at_the_header_deadline() {
    let (addr, _stop, _server) = serving(
        Options::new()
            .header_read_timeout(Duration::from_millis(400))
            .keep_alive_timeout(Duration::from_secs(60)),
    )
    .await;

    // Slowloris: one byte every 50 ms never completes the head in time.
    let slow = TcpStream::connect(addr).await.expect("connect");
    let (mut read, mut write) = slow.into_split();
    let started = Instant::now();
    let dribble = tokio::spawn(async move {
        // The attack's own pace: a byte per tick.
        let mut pace = tokio::time::interval(Duration::from_millis(50));
        for byte in b"GET /counter/a/value HTTP/1.1\r\nHost: w\r\nX-Slow: 1234567890\r\n\r\n" {
            pace.tick().await;
            if write.write_all(&[*byte]).await.is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buf = [0u8; 256];
    let (closed, answered) = match tokio::time::timeout_at(deadline, read.read(&mut buf)).await {
        Err(_) => (false, false),
        Ok(Ok(0)) | Ok(Err(_)) => (true, false),
        Ok(Ok(_)) => (false, true),
    };
    let took = started.elapsed();
    dribble.abort();
    assert!(!answered, "a dribbled head was served");
    assert!(closed, "a dribbling head kept its connection open");
    assert!(
        took >= Duration::from_millis(350) && took < Duration::from_secs(3),
        "closed after {took:?}"
    );

    // A connection that never sends a byte is a slow client too.
    let mut silent = TcpStream::connect(addr).await.expect("connect");
    let started = Instant::now();
    assert!(closed_within(&mut silent, Duration::from_secs(5)).await);
    assert!(started.elapsed() >= Duration::from_millis(350));

    // A head sent at once is served.
    let mut ok = TcpStream::connect(addr).await.expect("connect");
    assert_eq!(exchange(&mut ok, "/counter/a/value").await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_has_its_own_deadline_and_busy_requests_are_never_cut() {
    let (addr, _stop, _server) = serving(
        Options::new()
            .header_read_timeout(Duration::from_millis(300))
            .keep_alive_timeout(Duration::from_millis(1200)),
    )
    .await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    // Busy longer than both deadlines: answered.
    s.write_all(b"POST /counter/k/sleep/1500 HTTP/1.1\r\nHost: w\r\nContent-Length: 0\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("answered")
        .expect("read");
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    // Idle after it: open past the header deadline, closed at keep-alive.
    let answered = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(5)).await);
    let idle = answered.elapsed();
    assert!(
        idle >= Duration::from_millis(1100) && idle < Duration::from_secs(3),
        "idle connection closed after {idle:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_the_longest_idle_makes_room_and_with_none_idle_one_too_many_is_closed() {
    let (addr, _stop, _server) = serving(
        Options::new()
            .max_connections(3)
            .keep_alive_timeout(Duration::from_secs(60)),
    )
    .await;
    let mut held = Vec::new();
    for i in 0..3 {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        assert_eq!(exchange(&mut s, &format!("/counter/c{i}/value")).await, 200);
        held.push(s);
    }
    // Three idle keep-alive connections fill the cap: a fourth is served
    // in the place of the one idle longest (once it has idled a second).
    let _fourth = admitted(addr, b"GET /counter/x/value HTTP/1.1\r\nHost: w\r\n\r\n").await;
    assert!(
        closed_within(&mut held[0], Duration::from_secs(5)).await,
        "the longest idle connection was kept"
    );
    assert_eq!(exchange(&mut held[1], "/counter/c1/value").await, 200);

    // On a server of its own, three heads in progress fill the cap:
    // nothing is idle, so a fourth is accepted and closed before any byte.
    let (addr, _stop, _server) = serving(Options::new().max_connections(3)).await;
    let head = b"GET /counter/h/value HTTP/1.1\r\nHost: w\r\n";
    let mut halves = Vec::new();
    for _ in 0..3 {
        halves.push(mid_head(addr, head).await);
    }
    let mut extra = TcpStream::connect(addr).await.expect("connect");
    let _ = extra
        .write_all(b"GET /counter/x/value HTTP/1.1\r\nHost: w\r\n\r\n")
        .await;
    assert!(
        closed_within(&mut extra, Duration::from_secs(5)).await,
        "a connection over the cap was kept"
    );
    // The held ones still work; one leaving makes room.
    halves[0].write_all(b"\r\n").await.expect("write");
    let answered = answer(&mut halves[0], Duration::from_secs(5)).await;
    assert_eq!(answered.map(|(status, _)| status), Some(200));
    drop(halves.pop());
    support::eventually("a place under the cap", support::PATIENCE, || async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET /counter/y/value HTTP/1.1\r\nHost: w\r\n\r\n")
            .await
            .ok()?;
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf))
            .await
            .ok()?
            .ok()?;
        buf[..n].starts_with(b"HTTP/1.1 200").then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_on_a_half_sent_request_past_its_deadline() {
    let (addr, stop, server) = serving(
        Options::new()
            .header_read_timeout(Duration::from_secs(60))
            .shutdown_timeout(Duration::from_millis(300)),
    )
    .await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    assert_eq!(exchange(&mut s, "/counter/h/value").await, 200);
    s.write_all(b"GET /counter/h/value HTTP/1.1\r\nHost:")
        .await
        .expect("half a head");
    let signalled = Instant::now();
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("serve returns")
        .expect("join")
        .expect("serve");
    assert!(
        signalled.elapsed() < Duration::from_secs(3),
        "took {:?}",
        signalled.elapsed()
    );
    assert!(closed_within(&mut s, Duration::from_secs(2)).await);
}

#[test]
fn edge_settings_are_validated_and_read_from_the_environment() {
    let errors = Options::new()
        .host::<Counter>("/counter")
        .env_vars([
            ("PINNED_HEADER_READ_TIMEOUT_MS", "soon"),
            ("PINNED_MAX_CONNECTIONS", "0"),
            ("PINNED_MAX_HEADER_BYTES", "10"),
        ])
        .build()
        .err()
        .expect("refused");
    assert!(errors.contains(&ConfigError::EdgeVariable {
        variable: "PINNED_HEADER_READ_TIMEOUT_MS",
        value: "soon".into(),
    }));
    assert!(errors.contains(&ConfigError::ZeroEdge("max_connections")));
    assert!(errors.contains(&ConfigError::SmallHeaderLimit));
    let errors = Options::new()
        .host::<Counter>("/counter")
        .env_vars(Vec::<(String, String)>::new())
        .shutdown_timeout(Duration::ZERO)
        .build()
        .err()
        .expect("refused");
    assert_eq!(errors.0, vec![ConfigError::ZeroEdge("shutdown_timeout")]);
    Options::new()
        .host::<Counter>("/counter")
        .env_vars([
            ("PINNED_HEADER_READ_TIMEOUT_MS", "500"),
            ("PINNED_KEEP_ALIVE_TIMEOUT_MS", "900"),
            ("PINNED_SHUTDOWN_TIMEOUT_MS", "100"),
            ("PINNED_MAX_CONNECTIONS", "7"),
            ("PINNED_MAX_HEADER_BYTES", "4096"),
        ])
        .build()
        .expect("valid edge variables");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tls_the_worker_answers_https_and_holds_handshakes_to_the_header_deadline() {
    let certs = test_support::SelfSigned::new();
    let (cert, key, pem) = (certs.cert.clone(), certs.key.clone(), certs.pem.clone());
    let (addr, _stop, _server) = serving(
        Options::new()
            .tls(&cert, &key)
            .header_read_timeout(Duration::from_millis(400)),
    )
    .await;
    let c = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).expect("pem"))
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let res = c
        .post(format!("https://{addr}/counter/t/increment"))
        .send()
        .await
        .expect("https");
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.json::<serde_json::Value>().await.expect("json")["value"],
        1
    );
    // Plain HTTP on the TLS port gets no HTTP answer.
    let mut plain = TcpStream::connect(addr).await.expect("connect");
    plain
        .write_all(b"GET /counter/t/value HTTP/1.1\r\nHost: w\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), plain.read(&mut buf))
        .await
        .expect("an end in time")
        .unwrap_or(0);
    assert!(!buf[..n].starts_with(b"HTTP/"), "answered in clear text");
    // A connection that never handshakes is closed at the header deadline.
    let mut silent = TcpStream::connect(addr).await.expect("connect");
    let started = Instant::now();
    assert!(closed_within(&mut silent, Duration::from_secs(5)).await);
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(350), "{took:?}");
}

#[test]
fn tls_needs_both_files_and_names_a_bad_one() {
    let certs = test_support::SelfSigned::new();
    let (cert, key) = (certs.cert.clone(), certs.key.clone());
    let errors = Options::new()
        .host::<Counter>("/counter")
        .env_vars([("PINNED_TLS_CERT", cert.to_str().expect("utf-8 path"))])
        .build()
        .err()
        .expect("refused");
    assert_eq!(errors.0, vec![ConfigError::HalfTls { missing: "the key" }]);
    // The key given as certificate: the file is named.
    let errors = Options::new()
        .host::<Counter>("/counter")
        .env_vars(Vec::<(String, String)>::new())
        .tls(&key, &key)
        .build()
        .err()
        .expect("refused");
    let text = errors.to_string();
    assert!(
        text.contains("key.pem") && text.contains("no CERTIFICATE"),
        "{text}"
    );
}

/// An object whose one route answers what its handler extracts of the
/// connection and the request line: the peer, the URI below the instance,
/// and the URI the client sent.
struct Peer;

impl pinned::Object for Peer {
    async fn activate(_ctx: &pinned::Context) -> Result<Self, pinned::BoxError> {
        Ok(Peer)
    }

    fn routes() -> pinned::Routes<Self> {
        axum::Router::new().route(
            "/peer",
            axum::routing::get(
                |axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>,
                 axum::extract::OriginalUri(original): axum::extract::OriginalUri,
                 uri: http::Uri| async move { format!("{peer} {uri} {original}") },
            ),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_see_the_peer_address_on_every_request_of_a_connection() {
    let (addr, stop, server) = serving(Options::new().host::<Peer>("/peer")).await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let me = s.local_addr().expect("local addr");
    // Twice on one keep-alive connection: each request starts from the
    // connection's extensions, not only the first.
    for id in ["a", "b"] {
        let (status, body) = exchange_text(&mut s, &format!("/peer/{id}/peer?x=1")).await;
        assert_eq!(
            (status, body.as_str()),
            (200, format!("{me} /peer?x=1 /peer/{id}/peer?x=1").as_str())
        );
    }
    drop(s);
    let _ = stop.send(());
    server.await.expect("join").expect("served");
}

/// How many requests reached the echo handler: counted as the handler
/// starts, before it reads the body.
static ECHOES_ENTERED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// An object whose one route answers the request body it was sent.
struct Echo;

impl pinned::Object for Echo {
    async fn activate(_ctx: &pinned::Context) -> Result<Self, pinned::BoxError> {
        Ok(Echo)
    }

    fn routes() -> pinned::Routes<Self> {
        axum::Router::new().route(
            "/echo",
            axum::routing::post(|body: axum::body::Body| async move {
                ECHOES_ENTERED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let bytes = axum::body::to_bytes(body, 1 << 20)
                    .await
                    .map_err(|_| http::StatusCode::BAD_REQUEST)?;
                Ok::<_, http::StatusCode>(bytes)
            }),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_handed_from_the_front_to_hyper_serves_every_body_whole() {
    let header = Duration::from_millis(300);
    let (addr, stop, server) = serving(
        Options::new()
            .host::<Echo>("/echo")
            .header_read_timeout(header),
    )
    .await;
    let mut s = connect(addr).await;
    let head = |len: usize| {
        format!("POST /echo/a/echo HTTP/1.1\r\nHost: w\r\ncontent-length: {len}\r\n\r\n")
    };
    // The front reads a body sent in pieces whole before routing it.
    s.write_all(format!("{}hello", head(10)).as_bytes())
        .await
        .expect("write");
    s.write_all(b"world").await.expect("write");
    assert_eq!(
        answer(&mut s, PATIENCE).await,
        Some((200, b"helloworld".to_vec()))
    );
    // A body paused for longer than the front waits (the header deadline):
    // hyper gets the request as it came and streams the rest to the
    // handler, which answers it whole; the connection is not closed. The
    // handler is entered while half the body is still unsent: the front
    // never routes a body before it is whole, so that is the hand-off.
    let entered = ECHOES_ENTERED.load(std::sync::atomic::Ordering::SeqCst);
    s.write_all(format!("{}slo", head(6)).as_bytes())
        .await
        .expect("write");
    support::until("hyper routes the paused request", PATIENCE, || {
        ECHOES_ENTERED.load(std::sync::atomic::Ordering::SeqCst) > entered
    })
    .await;
    s.write_all(b"w!!").await.expect("write");
    assert_eq!(
        answer(&mut s, PATIENCE).await,
        Some((200, b"slow!!".to_vec()))
    );
    // hyper serves the rest of the connection: a chunked body, then a
    // plain one.
    s.write_all(
        b"POST /echo/a/echo HTTP/1.1\r\nHost: w\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    .await
    .expect("write");
    assert_eq!(answer(&mut s, PATIENCE).await, Some((200, b"abc".to_vec())));
    s.write_all(format!("{}again", head(5)).as_bytes())
        .await
        .expect("write");
    assert_eq!(
        answer(&mut s, PATIENCE).await,
        Some((200, b"again".to_vec()))
    );
    drop(s);
    let _ = stop.send(());
    server.await.expect("join").expect("served");
}

/// Set by [`Waits`]'s handler once it runs, and when its future is dropped.
static WAITING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static DROPPED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Raises [`DROPPED`] when dropped.
struct OnDrop;

impl Drop for OnDrop {
    fn drop(&mut self) {
        DROPPED.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// An object whose one route waits forever (a long poll nobody answers).
struct Waits;

impl pinned::Object for Waits {
    async fn activate(_ctx: &pinned::Context) -> Result<Self, pinned::BoxError> {
        Ok(Waits)
    }

    fn routes() -> pinned::Routes<Self> {
        axum::Router::new().route(
            "/wait",
            axum::routing::get(|| async {
                let _dropped = OnDrop;
                WAITING.store(true, std::sync::atomic::Ordering::SeqCst);
                std::future::pending::<()>().await;
                "never"
            }),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_cancels_the_handler_it_waits_for() {
    use std::sync::atomic::Ordering;
    let (addr, stop, server) = serving(Options::new().host::<Waits>("/waits")).await;
    let mut s = connect(addr).await;
    s.write_all(b"GET /waits/a/wait HTTP/1.1\r\nHost: w\r\n\r\n")
        .await
        .expect("write");
    support::until("the handler waits", PATIENCE, || {
        WAITING.load(Ordering::SeqCst)
    })
    .await;
    assert!(!DROPPED.load(Ordering::SeqCst));
    drop(s);
    support::until("the handler is dropped", PATIENCE, || {
        DROPPED.load(Ordering::SeqCst)
    })
    .await;
    let _ = stop.send(());
    server.await.expect("join").expect("served");
}
