//! The worker's own HTTP server: the accept loop [`serve`](crate::serve)
//! runs, pinboard's own ([`pinned_edge::accept`]) with the worker's
//! per-connection service, and the same edge pinboard has: a header
//! read deadline, an idle keep-alive deadline, a head size limit, a
//! connection cap with accept back-off (never a hot loop on `EMFILE`), and
//! a deadline for open connections after the drain.
//!
//! A connection is served as pinboard's are ([`pinned_edge::front`]): its
//! simple requests (a whole head, no body or a `Content-Length` one up to
//! 64 KiB, no upgrade) by the shared front on the connection's own task;
//! the first other request hands the connection to hyper for the rest of
//! its life. Both stages route a request the same way
//! ([`Requests`](crate::serve::requests::Requests)), so a handler sees the
//! same request whichever read it. Served by hyper, the warm request cost
//! 22 301 instructions, by the front 20 652 (`worker-bench`; the bare axum
//! counter 18 717 and 18 747 in the same runs). A body the front waits for longer than the header
//! deadline goes to hyper as it arrived (streamed to the handler): the
//! front never answers a slow upload itself.
//!
//! Owns the per-connection services and what the loop's events log; never
//! looks at a request (the application's [`Router`] and the namespaces'
//! dispatch do).
//!
//! With [`Options::tls`](crate::Options::tls) the handshake runs in the
//! connection's task: the connection already counts against the cap, and
//! the handshake must finish within the header deadline of accept.
//!
//! Upgraded connections (WebSockets) leave the cap when hyper hands them
//! over: a plain upgrade's instance keeps it in flight, and a hibernatable
//! socket counts under its namespace's and the worker's socket bounds
//! (`SocketOptions`, `Options::max_sockets`), not this loop's.
//!
//! At the cap, the connection idle longest (waiting for a request head,
//! none of it read, for at least [`MIN_IDLE`](pinned_edge::backoff::MIN_IDLE))
//! is closed to admit the new one, as nginx does with its keep-alive
//! connections ([`pinned_edge::roster`]); a connection is turned away only
//! when none is. Each closure is counted in
//! `pinned_connections_reclaimed_total`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use futures_util::FutureExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use pinned_edge::accept::{self, Connection, Events, Lane, Lanes, Settings};
use pinned_edge::defaults;
use pinned_edge::front::{self, BrokenBody, ClientGone, Stages};
use pinned_edge::phase::{ConnTimeouts, Lapse, Phase, Tracked};
use pinned_edge::tls::tokio_rustls::TlsAcceptor;
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config_error::ConfigError;
use crate::serve::namespaces::Namespaces;
use crate::serve::requests::Requests;

/// Largest request body the front reads whole before the request is
/// routed (pinboard buffers up to the same by default, to re-send); a
/// larger one hands the connection to hyper, which streams it to the
/// handler.
const FRONT_MAX_BODY: usize = 64 * 1024;

/// The edge's deadlines and bounds (see the [`Options`](crate::Options)
/// setters for each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EdgeSettings {
    pub(crate) timeouts: ConnTimeouts,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) max_connections: usize,
    pub(crate) max_header_bytes: usize,
}

impl Default for EdgeSettings {
    fn default() -> Self {
        Self {
            timeouts: ConnTimeouts {
                header: Duration::from_millis(defaults::HEADER_READ_TIMEOUT_MS),
                keep_alive: Duration::from_millis(defaults::KEEP_ALIVE_TIMEOUT_MS),
            },
            shutdown_timeout: Duration::from_millis(defaults::SHUTDOWN_TIMEOUT_MS),
            max_connections: defaults::MAX_CONNECTIONS,
            max_header_bytes: defaults::MAX_HEADER_BYTES,
        }
    }
}

impl EdgeSettings {
    /// Every setting that cannot be served with.
    pub(crate) fn problems(&self) -> Vec<ConfigError> {
        let mut problems = Vec::new();
        for (name, zero) in [
            ("header_read_timeout", self.timeouts.header.is_zero()),
            ("keep_alive_timeout", self.timeouts.keep_alive.is_zero()),
            ("shutdown_timeout", self.shutdown_timeout.is_zero()),
            ("max_connections", self.max_connections == 0),
        ] {
            if zero {
                problems.push(ConfigError::ZeroEdge(name));
            }
        }
        if self.max_header_bytes < defaults::MIN_MAX_HEADER_BYTES {
            problems.push(ConfigError::SmallHeaderLimit);
        }
        problems
    }
}

/// Serves `app` on `listener` (over TLS with `tls`) until `shutdown`
/// resolves (for [`serve`](crate::serve): the signal, then the drain),
/// then lets open connections finish for up to `settings.shutdown_timeout`
/// and drops the rest: the accept loop pinboard runs too
/// ([`pinned_edge::accept`]), on the application's runtime, with the
/// worker's per-connection service ([`Worker`]'s lane).
///
/// At the cap the longest idle connection is closed to admit a new one
/// (counted in `reclaimed`); with none idle long enough the new one is
/// accepted and closed at once. A failing accept pauses the loop as
/// [`pinned_edge::backoff`] says.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    hosts: Namespaces,
    settings: EdgeSettings,
    tls: Option<TlsAcceptor>,
    reclaimed: Counter,
    shutdown: impl Future<Output = ()> + Send,
) {
    let mut http = http1::Builder::new();
    http.keep_alive(true)
        // Deadlines are the phase's (see `pinned_edge::phase` for why not
        // hyper's own header timeout).
        .header_read_timeout(None)
        .max_header_size(settings.max_header_bytes)
        .max_buf_size(settings.max_header_bytes.max(defaults::MIN_READ_BUFFER));
    let limits = front::Limits {
        max_head: settings.max_header_bytes,
        max_body: FRONT_MAX_BODY,
        // Past it the request goes to hyper as it arrived, its body
        // streamed to the handler: the front never answers a slow upload
        // itself.
        body_timeout: settings.timeouts.header,
        broken_body: BrokenBody::HandOff,
        // As hyper serves it: a handler waiting for a client that left
        // stops waiting.
        client_gone: ClientGone::Cancel,
    };
    let lane = Worker {
        app,
        hosts,
        http: Arc::new(http),
        timeouts: settings.timeouts,
        limits,
    };
    let edge = Settings {
        // One lane: connections run on the application's runtime, any
        // thread.
        lanes: Lanes::Caller,
        timeouts: settings.timeouts,
        shutdown_timeout: settings.shutdown_timeout,
        max_connections: settings.max_connections,
        tls,
    };
    let events = Arc::new(Logged { reclaimed });
    // One lane on the caller's runtime: no thread to start, nothing fails.
    let _ = accept::serve(listener, edge, move |_| lane.clone(), events, shutdown).await;
}

/// The loop's events: logged, reclaims counted in
/// `pinned_connections_reclaimed_total`.
struct Logged {
    reclaimed: Counter,
}

impl Events for Logged {
    fn handshake_failed(&self, peer: SocketAddr, error: &std::io::Error) {
        tracing::debug!(%peer, error = %pinned_edge::logging::Chain(error), "TLS handshake failed");
    }

    fn lapsed(&self, peer: SocketAddr, lapse: Lapse) {
        match lapse {
            Lapse::Header => {
                tracing::debug!(%peer, deadline = "header read", "connection closed at its deadline");
            }
            Lapse::Idle => {
                tracing::debug!(%peer, deadline = "keep-alive", "connection closed at its deadline");
            }
            Lapse::Reclaimed => {
                self.reclaimed.inc();
                tracing::debug!(%peer, "idle connection closed to admit a new one at the cap");
            }
        }
    }
}

/// What the worker serves every connection with.
#[derive(Clone)]
struct Worker {
    app: Router,
    hosts: Namespaces,
    http: Arc<http1::Builder>,
    timeouts: ConnTimeouts,
    limits: front::Limits,
}

impl Lane for Worker {
    type Conn = Client;

    fn connect(&mut self, peer: SocketAddr, phase: &Phase) -> Client {
        Client {
            lane: self.clone(),
            peer,
            phase: phase.clone(),
        }
    }
}

/// One client connection's service.
struct Client {
    lane: Worker,
    peer: SocketAddr,
    phase: Phase,
}

impl Connection for Client {
    async fn serve<IO>(self, io: IO, stopping: watch::Receiver<()>) -> Option<Lapse>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Self { lane, peer, phase } = self;
        let Worker {
            app,
            hosts,
            http,
            timeouts,
            limits,
        } = lane;
        // Each stage routes with state of its own (the rewrites are the
        // connection's, unshared: the front's until it hands over, then
        // hyper's).
        let front = Requests::new(app.clone(), hosts.clone(), peer);
        let rest = Requests::new(app, hosts, peer);
        let requests = phase.clone();
        let service = service_fn(move |mut request: hyper::Request<Incoming>| {
            let busy = requests.begin_request();
            // Whatever hyper put there itself (the `OnUpgrade` of an
            // upgrade request) is kept.
            let hypers = std::mem::take(request.extensions_mut());
            let response = rest.route(request.map(Body::new), hypers);
            let requests = requests.clone();
            response.map(move |response| {
                if response.status() == http::StatusCode::SWITCHING_PROTOCOLS {
                    // Handed over from here on: never closed to make room.
                    requests.upgraded();
                }
                Ok::<_, Infallible>(response.map(|body| Tracked::new(body, busy)))
            })
        });
        let stages = Stages {
            http: &http,
            phase: phase.clone(),
            timeouts,
            limits,
        };
        let lapse = front::serve_connection(stages, io, front, service, stopping).await;
        // An upgraded socket lives on with its instance, which holds it in
        // flight: it leaves the cap here, as it leaves this loop.
        phase.leave_roster();
        lapse
    }
}
