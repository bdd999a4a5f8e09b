//! The HTTP/1 clients pinboard uses to reach workers: [`Pool`], one per
//! worker ([`WorkerConn`]), for proxied requests, and the generic pooled
//! [`Upstream`] for challenge probes and the sweeper's deliveries.
//!
//! Owns connection pooling, keep-alive settings and TLS to `https://`
//! advertise URLs ([`UpstreamTls`]: the Mozilla roots plus
//! `--upstream-ca`); never decides what to send or how to react (that is
//! `proxy` and `challenge`).
//!
//! A [`Pool`] speaks HTTP/1.1 itself ([`h1`]) for what the hot path sends
//! most: a plain `http://` worker, a buffered body, no upgrade. hyper's
//! client takes the rest (TLS, streamed bodies, WebSockets).

pub mod h1;
pub mod stamp;
pub mod worker;

pub use self::stamp::Stamp;
pub use self::worker::WorkerConn;

use self::h1::Reached;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use pinned_edge::tls::rustls::pki_types::ServerName;
use pinned_edge::tls::rustls::ClientConfig;
use pinned_edge::tls::tokio_rustls::TlsConnector;
use pinned_edge::tls::{self, TlsError};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// Request body sent upstream: buffered (replayable) or streamed through.
pub type UpstreamBody = Either<Full<Bytes>, axum::body::Body>;

/// The pooled client (`http://` and `https://`).
pub type Upstream = Client<HttpsConnector<HttpConnector>, UpstreamBody>;

/// How pinboard speaks TLS to `https://` advertise URLs: the roots it
/// trusts. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct UpstreamTls {
    config: Arc<ClientConfig>,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls").finish_non_exhaustive()
    }
}

impl UpstreamTls {
    /// Trusting the Mozilla roots of `webpki-roots`, plus the CA
    /// certificates in the PEM file `extra_ca` when given.
    ///
    /// # Errors
    ///
    /// The CA file is unreadable or holds no usable certificate.
    pub fn new(extra_ca: Option<&std::path::Path>) -> Result<Self, TlsError> {
        Ok(Self {
            config: Arc::new(tls::client_config(extra_ca)?),
        })
    }

    /// The connector the per-worker [`Pool`] handshakes with.
    pub fn connector(&self) -> TlsConnector {
        TlsConnector::from(self.config.clone())
    }
}

/// Idle pooled connections kept per worker.
const POOL_MAX_IDLE_PER_HOST: usize = 1024;
/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connect timeout to a worker.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A client with keep-alive pooling, `TCP_NODELAY`, a connect timeout,
/// and TLS with `tls`'s roots for `https://` URLs.
pub fn client(tls: &UpstreamTls) -> Upstream {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
    // The TLS layer below takes `https://`; plain `http://` passes through.
    connector.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config((*tls.config).clone())
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .build(connector)
}

/// A request of `head`'s method, target, version and headers (not its
/// extensions) with `stamp`'s fields set and `body`, for a client that
/// takes requests by value.
pub fn stamped<B>(head: &http::request::Parts, stamp: &Stamp<'_>, body: B) -> Request<B> {
    let mut request = Request::new(body);
    *request.method_mut() = head.method.clone();
    *request.uri_mut() = head.uri.clone();
    *request.version_mut() = head.version;
    *request.headers_mut() = head.headers.clone();
    stamp.insert_into(request.headers_mut());
    request
}

/// An empty replayable body.
pub fn empty() -> UpstreamBody {
    Either::Left(Full::new(Bytes::new()))
}

/// Most idle connections one [`Pool`] keeps per thread slot.
const POOL_MAX_IDLE: usize = 1024;

/// Idle lists per pool, one per I/O thread (modulo): a connection is driven
/// by a task on the runtime that opened it, so it is reused from that
/// thread only, and an exchange never hops between runtimes.
const POOL_SLOTS: usize = 32;

thread_local! {
    static SLOT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks the calling thread as I/O thread `slot` for every [`Pool`]:
/// connections it opens go back to, and are taken from, its own idle list.
/// Threads that never call this share slot 0.
pub fn bind_thread_slot(slot: usize) {
    SLOT.with(|cell| cell.set(slot % POOL_SLOTS));
}

fn thread_slot() -> usize {
    SLOT.with(std::cell::Cell::get)
}

/// Why [`Pool::send`] produced no response.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be opened: nothing was sent.
    #[error("cannot connect to the worker: {0}")]
    Connect(std::io::Error),
    /// The connection closed before the request was written: nothing was
    /// sent (hyper's or [`h1`]'s error).
    #[error("worker connection closed before the request was sent: {0}")]
    Unsent(BodyError),
    /// The request was (at least partly) sent and the connection ended
    /// before an answer came back (hyper's or [`h1`]'s error). An
    /// idempotent request was already sent once more on a new connection
    /// (see [`Pool::send`]): the worker may have started it, so it is not
    /// sent again.
    #[error("worker connection failed: {0}")]
    Failed(BodyError),
    /// An answer came and was malformed or cut short (hyper's or [`h1`]'s
    /// error): the worker took the request, and sending it again would
    /// only meet the same answer (nginx does not retry an invalid header
    /// by default either).
    #[error("worker answer was malformed: {0}")]
    BadAnswer(BodyError),
    /// The generic pooled client failed (sweeper calls, challenge probes).
    #[error("worker call failed: {0}")]
    Client(hyper_util::client::legacy::Error),
    /// A non-socket transport lost the connection under the request (it
    /// may have been partly handled).
    #[error("worker connection died: {0}")]
    Dropped(String),
}

impl SendError {
    /// Nothing reached the worker, so sending again repeats nothing.
    pub fn before_send(&self) -> bool {
        match self {
            Self::Connect(_) | Self::Unsent(_) => true,
            Self::Client(e) => e.is_connect(),
            Self::Failed(_) | Self::BadAnswer(_) | Self::Dropped(_) => false,
        }
    }
}

/// Keep-alive HTTP/1 connections to one worker, for the proxy's hot path.
///
/// A connection goes back to the pool when its response body ended, so
/// every idle one is free for the next request; the most recently used is
/// taken first. No task is spawned per request (the generic pooled client
/// spawns one to wait for each connection to become reusable), and no
/// pool key is hashed: the pool hangs off the worker it serves.
pub struct Pool {
    authority: http::uri::Authority,
    /// The handshake and the name it verifies, for an `https://` worker.
    tls: Option<(TlsConnector, ServerName<'static>)>,
    idle: Box<[parking_lot::Mutex<Vec<SendRequest<UpstreamBody>>>]>,
    /// Idle connections of [`h1`]'s, per thread slot as `idle`.
    // Boxed for the connection's life, not for the list: taken out and put
    // back as a pointer, and held so by each response's body.
    #[allow(clippy::vec_box)]
    idle_raw: Box<[parking_lot::Mutex<Vec<Box<h1::Conn>>>]>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("authority", &self.authority)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// An empty pool for the worker at `authority` (`host:port`), over TLS
    /// with `tls` when given (an `https://` advertise URL).
    ///
    /// # Errors
    ///
    /// The host is not a name TLS can verify (never for plain HTTP).
    pub fn new(
        authority: http::uri::Authority,
        tls: Option<TlsConnector>,
    ) -> Result<Arc<Self>, InvalidServerName> {
        let tls = match tls {
            None => None,
            Some(connector) => {
                let host = authority.host();
                // IPv6 literals come bracketed in a URI, bare in a name.
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                let name = ServerName::try_from(bare.to_owned())
                    .map_err(|_| InvalidServerName(host.to_owned()))?;
                Some((connector, name))
            }
        };
        Ok(Arc::new(Self {
            authority,
            tls,
            idle: (0..POOL_SLOTS)
                .map(|_| parking_lot::Mutex::new(Vec::new()))
                .collect(),
            idle_raw: (0..POOL_SLOTS)
                .map(|_| parking_lot::Mutex::new(Vec::new()))
                .collect(),
        }))
    }

    /// Sends `head` (origin-form URI) with `stamp`'s fields and `body` on
    /// an idle connection, or a new one; `upgrade`: the request asks to
    /// switch protocols (hyper's client takes it).
    ///
    /// # Re-sends
    ///
    /// A request that a reused connection refused unsent (the worker had
    /// closed it) goes out again on another connection: nothing of it
    /// reached the worker. An idempotent request with a buffered body
    /// whose connection ended after it was sent and before a byte of an
    /// answer (the keep-alive race of a connection the worker closed as it
    /// was reused, or a worker that died on it) goes out once more, on a
    /// new connection, and never a third time: the worker may have started
    /// it. An answer that came malformed or cut short is never re-sent
    /// ([`SendError::BadAnswer`]).
    ///
    /// # Errors
    ///
    /// [`SendError`]: connect failure, or the connection failing before a
    /// whole response head arrived.
    pub async fn send(
        self: &Arc<Self>,
        head: &http::request::Parts,
        stamp: &Stamp<'_>,
        upgrade: bool,
        body: UpstreamBody,
    ) -> Result<http::Response<PooledBody>, SendError> {
        let plain = self.tls.is_none() && !upgrade;
        match body {
            Either::Left(buffered) if plain => self.send_raw(head, stamp, buffered).await,
            body => self.send_hyper(head, stamp, body).await,
        }
    }

    /// [`send`](Self::send) over [`h1`]: a buffered body to a plain worker.
    async fn send_raw(
        self: &Arc<Self>,
        head: &http::request::Parts,
        stamp: &Stamp<'_>,
        mut body: Full<Bytes>,
    ) -> Result<http::Response<PooledBody>, SendError> {
        // A `Full` yields its one frame at once.
        let body = match body.frame().await {
            Some(Ok(frame)) => frame.into_data().unwrap_or_default(),
            _ => Bytes::new(),
        };
        // After a reused connection failed, the next try dials: the other
        // idle ones may be as stale.
        let mut fresh = false;
        // The one re-send of an unanswered idempotent request (see `send`).
        let mut resend = head.method.is_idempotent();
        loop {
            let idle = if fresh { None } else { self.take_raw() };
            fresh = true;
            let (conn, reused) = match idle {
                Some(conn) => (conn, true),
                None => (Box::pin(self.dial()).await.map(h1::Conn::new)?, false),
            };
            match conn.exchange(head, stamp, &body, self).await {
                Ok(response) => return Ok(response.map(|body| PooledBody::Raw { body })),
                // The worker had closed an idle connection: nothing of the
                // request went out, so it goes out once more on a new one.
                Err((Reached::Nothing, _)) if reused => {}
                // The request went out and the connection ended before a
                // byte of an answer.
                Err((Reached::NoAnswer, _)) if resend => resend = false,
                Err((Reached::Nothing, error)) => return Err(SendError::Unsent(error.into())),
                Err((Reached::NoAnswer, error)) => return Err(SendError::Failed(error.into())),
                Err((Reached::Answer, error)) => return Err(SendError::BadAnswer(error.into())),
            }
        }
    }

    /// [`send`](Self::send) over hyper's client.
    async fn send_hyper(
        self: &Arc<Self>,
        head: &http::request::Parts,
        stamp: &Stamp<'_>,
        body: UpstreamBody,
    ) -> Result<http::Response<PooledBody>, SendError> {
        // The one re-send of an unanswered idempotent request (see `send`)
        // needs its body again: only a buffered one can be.
        let mut resend = match &body {
            Either::Left(buffered) if head.method.is_idempotent() => Some(buffered.clone()),
            _ => None,
        };
        let mut request = stamped(head, stamp, body);
        let mut fresh = false;
        loop {
            let idle = if fresh { None } else { self.take() };
            let (mut sender, reused) = match idle {
                Some(sender) => (sender, true),
                // Boxed: dialling (TCP, TLS, the HTTP handshake) is a
                // large future on a cold path; inline, its size would be
                // moved with every request's future.
                None => (Box::pin(self.connect()).await?, false),
            };
            if let Err(error) = sender.ready().await {
                if reused {
                    continue;
                }
                return Err(SendError::Unsent(error.into()));
            }
            match sender.try_send_request(request).await {
                Ok(response) => {
                    // An upgraded connection belongs to the upgrade now.
                    let sender = (response.status() != http::StatusCode::SWITCHING_PROTOCOLS)
                        .then(|| (sender, self.clone()));
                    return Ok(response.map(|body| PooledBody::Hyper { body, home: sender }));
                }
                Err(mut error) => match error.take_message() {
                    Some(unsent) if reused => request = unsent,
                    Some(_) => return Err(SendError::Unsent(error.into_error().into())),
                    None => {
                        let error = error.into_error();
                        if error.is_parse() {
                            return Err(SendError::BadAnswer(error.into()));
                        }
                        let Some(again) = resend.take() else {
                            return Err(SendError::Failed(error.into()));
                        };
                        request = stamped(head, stamp, Either::Left(again));
                        fresh = true;
                    }
                },
            }
        }
    }

    fn take(&self) -> Option<SendRequest<UpstreamBody>> {
        let mut idle = self.idle[thread_slot()].lock();
        while let Some(sender) = idle.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    fn put(&self, sender: SendRequest<UpstreamBody>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle[thread_slot()].lock();
        if idle.len() < POOL_MAX_IDLE {
            idle.push(sender);
        }
    }

    fn take_raw(&self) -> Option<Box<h1::Conn>> {
        let mut idle = self.idle_raw[thread_slot()].lock();
        while let Some(conn) = idle.pop() {
            if conn.is_reusable() {
                return Some(conn);
            }
        }
        None
    }

    /// A connection of [`h1`]'s whose response ended cleanly.
    fn put_raw(&self, conn: Box<h1::Conn>) {
        let mut idle = self.idle_raw[thread_slot()].lock();
        if idle.len() < POOL_MAX_IDLE {
            idle.push(conn);
        }
    }

    /// A TCP connection to the worker, within the connect timeout.
    async fn dial(&self) -> Result<TcpStream, SendError> {
        let host = self.authority.host();
        let default_port = if self.tls.is_some() { 443 } else { 80 };
        let port = self.authority.port_u16().unwrap_or(default_port);
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((host, port)))
            .await
            .map_err(|_| {
                SendError::Connect(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "connect timed out",
                ))
            })?
            .map_err(SendError::Connect)?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    async fn connect(&self) -> Result<SendRequest<UpstreamBody>, SendError> {
        let stream = self.dial().await?;
        match &self.tls {
            None => handshake(stream).await,
            Some((connector, name)) => {
                let stream =
                    tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name.clone(), stream))
                        .await
                        .map_err(|_| {
                            SendError::Connect(std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                "TLS handshake timed out",
                            ))
                        })?
                        .map_err(SendError::Connect)?;
                handshake(stream).await
            }
        }
    }
}

/// The host of an `https://` advertise URL is not a DNS name or IP address
/// TLS can verify.
#[derive(Debug, thiserror::Error)]
#[error("not a TLS server name: {0}")]
pub struct InvalidServerName(pub String);

/// HTTP/1 over `io`, its connection driven by a task of its own.
async fn handshake<IO>(io: IO) -> Result<SendRequest<UpstreamBody>, SendError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| SendError::Unsent(e.into()))?;
    tokio::spawn(async move {
        // Ends when the worker closes the connection or the last handle
        // to it is dropped; either is routine.
        let _ = connection.with_upgrades().await;
    });
    Ok(sender)
}

pin_project_lite::pin_project! {
    /// A worker's response body from a [`Pool`]: it hands its connection
    /// back once read to the end (dropped early, the connection closes).
    /// `body` is the body; `home` the connection and its pool.
    #[allow(missing_docs)]
    #[project = PooledProj]
    pub enum PooledBody {
        /// Over hyper's client.
        Hyper {
            #[pin]
            body: Incoming,
            home: Option<(SendRequest<UpstreamBody>, Arc<Pool>)>,
        },
        /// Over [`h1`].
        Raw {
            #[pin]
            body: h1::RawBody,
        },
    }
}

/// The error of a [`PooledBody`]: hyper's or [`h1`]'s.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

impl PooledBody {
    /// The whole body is in memory already (most answers of [`h1`]'s):
    /// reading it waits for nothing.
    pub fn in_memory(&self) -> bool {
        match self {
            Self::Raw { body } => body.in_memory(),
            Self::Hyper { .. } => false,
        }
    }
}

impl http_body::Body for PooledBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BodyError>>> {
        match self.project() {
            PooledProj::Raw { body } => body.poll_frame(cx).map_err(Into::into),
            PooledProj::Hyper { mut body, home } => {
                let polled = body.as_mut().poll_frame(cx);
                let ended = match &polled {
                    std::task::Poll::Ready(None) => true,
                    std::task::Poll::Ready(Some(Ok(_))) => body.is_end_stream(),
                    _ => false,
                };
                if ended {
                    if let Some((sender, pool)) = home.take() {
                        pool.put(sender);
                    }
                }
                polled.map_err(Into::into)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Hyper { body, .. } => body.is_end_stream(),
            Self::Raw { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            Self::Hyper { body, .. } => body.size_hint(),
            Self::Raw { body } => body.size_hint(),
        }
    }
}
