//! The worker's own HTTP server: the accept loop [`serve`](crate::serve)
//! runs, with the same edge pinboard has (from `pinned-edge`): a header
//! read deadline, an idle keep-alive deadline, a head size limit, a
//! connection cap with accept back-off (never a hot loop on `EMFILE`), and
//! a deadline for open connections after the drain.
//!
//! Owns sockets and connection tasks only; never looks at a request (the
//! application's [`Router`] does). The per-request cost is what
//! `axum::serve` paid (the `ConnectInfo` extension and the body box) plus
//! a few atomic operations for the phase: nothing allocates per request.
//! Each connection keeps the paths its namespace requests were last
//! rewritten to ([`Rewrites`](crate::serve::dispatch::Rewrites)), so a repeated
//! route is not parsed again.
//!
//! With [`Options::tls`](crate::Options::tls) the handshake runs in the
//! connection's task: the connection already counts against the cap, and
//! the handshake must finish within the header deadline of accept.
//!
//! Upgraded connections (WebSockets) leave the cap when hyper hands them
//! over: the instance they reach keeps them in flight, not this loop.
//!
//! At the cap, the connection idle longest (waiting for a request head,
//! none of it read, for at least [`MIN_IDLE`](pinned_edge::backoff::MIN_IDLE))
//! is closed to admit the new one, as nginx does with its keep-alive
//! connections ([`pinned_edge::roster`]); a connection is turned away only
//! when none is. Each closure is counted in
//! `pinned_connections_reclaimed_total`.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use futures_util::future::Either;
use futures_util::FutureExt;
use http::Extensions;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use pinned_edge::backoff::{Acceptor, Admission};
use pinned_edge::drive::serve_connection;
use pinned_edge::phase::{ConnTimeouts, Lapse, Phase, Tracked};
use pinned_edge::roster::Roster;
use pinned_edge::tls::tokio_rustls::TlsAcceptor;
use pinned_edge::tls::{self, HandshakeError};
use pinned_edge::{cap, defaults};
use prometheus_client::metrics::counter::Counter;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::config_error::ConfigError;
use crate::serve::dispatch;
use crate::serve::namespaces::Namespaces;

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

/// The extensions every request of the connection from `peer` starts with
/// (each request a clone): the peer's [`ConnectInfo`], in a map with room
/// for the entries a namespace request gathers on its way (the worker's
/// own, then axum's `OriginalUri`, `MatchedPath` and path parameters).
/// An empty map is created for three and would be regrown, rehashed and
/// freed at the fourth insert of every request.
fn request_extensions(peer: std::net::SocketAddr) -> Extensions {
    /// Placeholder entries that size the map, removed again.
    #[derive(Clone)]
    struct Room<const N: usize>;
    let mut extensions = Extensions::new();
    extensions.insert(Room::<0>);
    extensions.insert(Room::<1>);
    extensions.insert(Room::<2>);
    extensions.insert(Room::<3>);
    extensions.remove::<Room<0>>();
    extensions.remove::<Room<1>>();
    extensions.remove::<Room<2>>();
    extensions.remove::<Room<3>>();
    extensions.insert(ConnectInfo(peer));
    extensions
}

/// Serves `app` on `listener` (over TLS with `tls`) until `shutdown`
/// resolves (for [`serve`](crate::serve): the signal, then the drain),
/// then lets open connections finish for up to `settings.shutdown_timeout`
/// and drops the rest.
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
    let fd_limit = cap::open_file_limit();
    let max_connections = cap::effective(settings.max_connections, fd_limit);
    // Lowering the default is routine (debug); a value the operator chose
    // and does not get is worth a warning.
    if max_connections < settings.max_connections
        && settings.max_connections != pinned_edge::defaults::MAX_CONNECTIONS
    {
        tracing::warn!(
            configured = settings.max_connections,
            open_file_limit = fd_limit,
            max_connections,
            "max_connections lowered to what the open-file limit carries (raise `ulimit -n` for more)"
        );
    } else if max_connections < settings.max_connections {
        tracing::debug!(
            open_file_limit = fd_limit,
            max_connections,
            "max_connections lowered to what the open-file limit carries (the default; raise `ulimit -n` for more)"
        );
    }
    let mut http = http1::Builder::new();
    http.keep_alive(true)
        // Deadlines are the phase's (see `pinned_edge::phase` for why not
        // hyper's own header timeout).
        .header_read_timeout(None)
        .max_header_size(settings.max_header_bytes)
        .max_buf_size(settings.max_header_bytes.max(defaults::MIN_READ_BUFFER));
    let http = Arc::new(http);
    // One roster: connections run on the application's runtime, any thread.
    let rosters = [Roster::new()];
    // Every connection holds a receiver: a send asks them to finish, and
    // `closed` resolves once the last one dropped its receiver.
    let (stop, stopping) = watch::channel(());
    // Cancels the connections still open at the shutdown deadline.
    let abort = CancellationToken::new();
    let mut acceptor = Acceptor::new(max_connections);
    tokio::pin!(shutdown);
    while let Some((tcp, peer)) = acceptor.next(&listener, &mut shutdown, || {}).await {
        if acceptor.admit(&rosters) == Admission::Refused {
            // Closed before any byte: the client sees the connection end.
            drop(tcp);
            continue;
        }
        // Small request/response exchanges must not wait on Nagle's algorithm.
        let _ = tcp.set_nodelay(true);
        // The phase holds the connection's seat under the cap until the
        // task ends (see the end of the task for upgrades).
        let phase = Phase::seated(rosters[0].seat());
        let (requests, app, hosts) = (phase.clone(), app.clone(), hosts.clone());
        let extensions = request_extensions(peer);
        let rewrites = dispatch::Rewrites::default();
        let service = service_fn(move |mut request: hyper::Request<Incoming>| {
            let busy = requests.begin_request();
            let mut first = extensions.clone();
            // Whatever hyper put there itself (the `OnUpgrade` of an
            // upgrade request) is kept.
            first.extend(std::mem::take(request.extensions_mut()));
            *request.extensions_mut() = first;
            // A namespace's path goes straight to its dispatch: `app` would
            // only have matched nothing and fallen back to it (the routes
            // served beside the worker's never overlap a namespace). Its
            // routing runs here; the future hyper keeps is only what the
            // object's routes started (no copy of the request held beside).
            let request = request.map(Body::new);
            let response = match dispatch::host_of(&hosts, request.uri().path()) {
                Some(host) => Either::Left(dispatch::route(host, request, Some(&rewrites))),
                None => {
                    Either::Right(app.clone().oneshot(request).map(|answered| match answered {
                        Ok(response) => response,
                        Err(never) => match never {},
                    }))
                }
            };
            let requests = requests.clone();
            response.map(move |response| {
                if response.status() == http::StatusCode::SWITCHING_PROTOCOLS {
                    // Handed over from here on: never closed to make room.
                    requests.upgraded();
                }
                Ok::<_, Infallible>(response.map(|body| Tracked::new(body, busy)))
            })
        });
        let (stopping, abort, timeouts) = (stopping.clone(), abort.clone(), settings.timeouts);
        let reclaimed = reclaimed.clone();
        let (http, tls) = (http.clone(), tls.clone());
        tokio::spawn(async move {
            let served = async {
                match tls {
                    None => serve_connection(&http, tcp, service, &phase, timeouts, stopping).await,
                    // The header deadline counts from accept, handshake included.
                    Some(acceptor) => match tls::accept(&acceptor, tcp, timeouts.header).await {
                        Ok(tls) => {
                            serve_connection(&http, tls, service, &phase, timeouts, stopping).await
                        }
                        Err(HandshakeError::TimedOut(_)) => Some(Lapse::Header),
                        Err(HandshakeError::Failed(error)) => {
                            tracing::debug!(%peer, error = %pinned_edge::logging::Chain(&error), "TLS handshake failed");
                            None
                        }
                    },
                }
            };
            tokio::select! {
                // Fixed order: the connection is what wakes this task, once
                // or more per request; a random start would cost a random
                // number per wake-up, and the abort is seen either way.
                biased;
                lapse = served => {
                    match lapse {
                        Some(Lapse::Header) => {
                            tracing::debug!(%peer, deadline = "header read", "connection closed at its deadline");
                        }
                        Some(Lapse::Idle) => {
                            tracing::debug!(%peer, deadline = "keep-alive", "connection closed at its deadline");
                        }
                        Some(Lapse::Reclaimed) => {
                            reclaimed.inc();
                            tracing::debug!(%peer, "idle connection closed to admit a new one at the cap");
                        }
                        None => {}
                    }
                }
                () = abort.cancelled() => {}
            }
            // An upgraded socket lives on with its instance, which holds it
            // in flight: it leaves the cap here, as it leaves this loop.
            phase.leave_roster();
        });
    }
    drop(listener);
    drop(stopping);
    let _ = stop.send(());
    if tokio::time::timeout(settings.shutdown_timeout, stop.closed())
        .await
        .is_err()
    {
        tracing::warn!(
            connections = rosters[0].open(),
            "shutdown deadline passed; dropping the connections still open"
        );
        abort.cancel();
    }
}
