//! The HTTP/1 clients pinboard uses to reach workers: [`Pool`], one per
//! worker, for proxied requests, and the generic pooled [`Upstream`] for
//! challenge probes and the sweeper's deliveries.
//!
//! Owns connection pooling, keep-alive settings and TLS to `https://`
//! advertise URLs ([`UpstreamTls`]: the Mozilla roots plus
//! `--upstream-ca`); never decides what to send or how to react (that is
//! `proxy` and `challenge`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{Either, Full};
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
    /// sent.
    #[error("worker connection closed before the request was sent: {0}")]
    Unsent(hyper::Error),
    /// The request was (at least partly) sent and no response came back.
    #[error("worker connection failed: {0}")]
    Failed(hyper::Error),
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
            Self::Failed(_) | Self::Dropped(_) => false,
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
        }))
    }

    /// Sends `request` (origin-form URI, `Host` set by the caller) on an
    /// idle connection, or a new one. A request that a reused connection
    /// refused unsent (the worker had closed it) goes out once more on a
    /// fresh connection.
    ///
    /// # Errors
    ///
    /// [`SendError`]: connect failure, or the connection failing before a
    /// response head arrived.
    pub async fn send(
        self: &Arc<Self>,
        mut request: Request<UpstreamBody>,
    ) -> Result<http::Response<PooledBody>, SendError> {
        loop {
            let (mut sender, reused) = match self.take() {
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
                return Err(SendError::Unsent(error));
            }
            match sender.try_send_request(request).await {
                Ok(response) => {
                    // An upgraded connection belongs to the upgrade now.
                    let sender = (response.status() != http::StatusCode::SWITCHING_PROTOCOLS)
                        .then(|| (sender, self.clone()));
                    return Ok(response.map(|body| PooledBody { body, home: sender }));
                }
                Err(mut error) => match error.take_message() {
                    Some(unsent) if reused => request = unsent,
                    Some(_) => return Err(SendError::Unsent(error.into_error())),
                    None => return Err(SendError::Failed(error.into_error())),
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

    async fn connect(&self) -> Result<SendRequest<UpstreamBody>, SendError> {
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
        .map_err(SendError::Unsent)?;
    tokio::spawn(async move {
        // Ends when the worker closes the connection or the last handle
        // to it is dropped; either is routine.
        let _ = connection.with_upgrades().await;
    });
    Ok(sender)
}

pin_project_lite::pin_project! {
    /// A response body that hands its connection back to the [`Pool`] once
    /// it has been read to the end (dropped early, the connection closes).
    pub struct PooledBody {
        #[pin]
        body: Incoming,
        home: Option<(SendRequest<UpstreamBody>, Arc<Pool>)>,
    }
}

impl PooledBody {
    fn finished(self: std::pin::Pin<&mut Self>) {
        if let Some((sender, pool)) = self.project().home.take() {
            pool.put(sender);
        }
    }
}

impl http_body::Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        let polled = self.as_mut().project().body.poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(None) => self.finished(),
            std::task::Poll::Ready(Some(Ok(_))) if self.body.is_end_stream() => self.finished(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
