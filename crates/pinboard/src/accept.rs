//! pinboard's connections: the shared accept loop
//! ([`pinned_edge::accept`]) on I/O threads, with pinboard's
//! per-connection service and what it counts.
//!
//! Owns connection setup beyond the loop's (the
//! `pinboard_connections_open` gauge, the client address every request
//! carries), the services of the two stages a connection goes through
//! (the shared front, [`pinned_edge::front`], serves proxied requests with
//! [`front::Front`](crate::front::Front); the first request it leaves
//! alone hands the connection to hyper, which sends the few control paths
//! to the axum router of [`server::router`] and every other path to
//! [`proxy::serve`]), and the metrics of the loop's [`Events`]. The cap,
//! back-off, deadlines, TLS handshake, drain and the stages themselves are
//! `pinned-edge`'s.
//!
//! The data plane skips the router on purpose: matching, boxing and
//! response mapping cost more per proxied request than the proxy's own
//! bookkeeping. This module never looks at a request beyond its path.
//!
//! The deadline machinery, the cap and the back-off live in `pinned-edge`,
//! shared with the worker's own server; they are re-exported here under
//! their old paths.

pub use pinned_edge::{backoff, cap, phase};

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceExt;

use pinned_edge::accept::{Connection, Events, Lane, Lanes, Settings};
use pinned_edge::defaults::MIN_READ_BUFFER;
use pinned_edge::front::{self, BrokenBody, ClientGone, Stages};
use pinned_edge::tls::tokio_rustls::TlsAcceptor;

use self::phase::{ConnTimeouts, Lapse, Phase, Tracked};
use crate::app::App;
use crate::config::Config;
use crate::front::Front;
use crate::placement::PlacementStore;
use crate::proxy::{self, ClientAddr, Inbound, UpgradeHold};
use crate::server;
use crate::upstream;

/// How [`serve`] serves connections: plain data, from [`Config`] (the TLS
/// acceptor is set apart: reading its files can fail, see
/// [`Config::tls_server`]).
#[derive(Clone)]
pub struct ServeSettings {
    /// I/O threads (at least one is used).
    pub threads: usize,
    /// Header and keep-alive deadlines.
    pub timeouts: ConnTimeouts,
    /// How long open connections may finish after the shutdown signal.
    pub shutdown_timeout: Duration,
    /// Most client connections open at once (before the open-file limit
    /// lowers it, see [`cap`]).
    pub max_connections: usize,
    /// Largest request head in bytes (431 beyond it).
    pub max_header_bytes: usize,
    /// Serve HTTPS with this acceptor (`None`: plain HTTP).
    pub tls: Option<TlsAcceptor>,
}

impl std::fmt::Debug for ServeSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeSettings")
            .field("threads", &self.threads)
            .field("timeouts", &self.timeouts)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("max_connections", &self.max_connections)
            .field("max_header_bytes", &self.max_header_bytes)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl From<&Config> for ServeSettings {
    fn from(config: &Config) -> Self {
        Self {
            threads: config.io_threads(),
            timeouts: ConnTimeouts {
                header: Duration::from_millis(config.header_read_timeout_ms),
                keep_alive: Duration::from_millis(config.keep_alive_timeout_ms),
            },
            shutdown_timeout: Duration::from_millis(config.shutdown_timeout_ms),
            max_connections: config.max_connections,
            max_header_bytes: config.max_header_bytes,
            tls: None,
        }
    }
}

/// One connection's place under the cap: its phase holds its seat in the
/// lane's roster, and it counts in the `pinboard_connections_open` gauge,
/// until dropped.
struct Slot {
    _phase: Phase,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl Slot {
    fn new<S>(phase: Phase, app: &App<S>) -> Self {
        let gauge = app.metrics.connections_open.clone();
        gauge.inc();
        Self {
            _phase: phase,
            gauge,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// Serves `listener` on `settings.threads` I/O threads (at least one)
/// until `shutdown` resolves, then gives every open connection up to
/// `settings.shutdown_timeout` to finish and drops the rest (see
/// [`pinned_edge::accept::serve`]: the cap, its reclaim of idle
/// connections, the back-off).
///
/// Each connection stays on the I/O thread it was handed to: its requests
/// and the worker connections they use all run on that thread's
/// single-threaded runtime, as in nginx's worker processes.
///
/// # Errors
///
/// When an I/O thread or its runtime cannot be started.
pub async fn serve<S: PlacementStore>(
    listener: TcpListener,
    app: Arc<App<S>>,
    settings: ServeSettings,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let edge = Settings {
        lanes: Lanes::Threads {
            count: settings.threads,
            name: "pinboard-io",
        },
        timeouts: settings.timeouts,
        shutdown_timeout: settings.shutdown_timeout,
        max_connections: settings.max_connections,
        tls: settings.tls.clone(),
    };
    let events = Arc::new(Counted(app.clone()));
    let make_lane = move |index| {
        upstream::bind_thread_slot(index);
        IoThread::new(app.clone(), &settings)
    };
    pinned_edge::accept::serve(listener, edge, make_lane, events, shutdown).await
}

/// The loop's events, counted in pinboard's metrics.
struct Counted<S>(Arc<App<S>>);

impl<S: PlacementStore> Events for Counted<S> {
    fn cap_lowered(&self, configured: usize, fd_limit: Option<u64>, max_connections: usize) {
        // Lowering the default is routine (debug); a value the operator
        // chose and does not get is worth a warning.
        if configured != pinned_edge::defaults::MAX_CONNECTIONS {
            tracing::warn!(
                target: "pinboard::accept",
                configured,
                open_file_limit = fd_limit,
                max_connections,
                "--max-connections lowered to what the open-file limit carries (raise `ulimit -n` for more)"
            );
        } else {
            tracing::debug!(target: "pinboard::accept", open_file_limit = fd_limit, max_connections, "--max-connections lowered to what the open-file limit carries (the default; raise `ulimit -n` for more)");
        }
    }

    fn accept_failed(&self) {
        self.0.metrics.accept_errors.inc();
    }

    fn refused(&self) {
        self.0.metrics.connections_refused.inc();
    }

    fn handshake_failed(&self, peer: SocketAddr, error: &std::io::Error) {
        self.0.metrics.tls_handshake_failures.inc();
        tracing::debug!(target: "pinboard::accept", %peer, error = %pinned_edge::logging::Chain(error), "TLS handshake failed");
    }

    fn lapsed(&self, peer: SocketAddr, lapse: Lapse) {
        let metrics = &self.0.metrics;
        match lapse {
            Lapse::Header => metrics.connections_header_timeouts.inc(),
            Lapse::Idle => metrics.connections_idle_timeouts.inc(),
            Lapse::Reclaimed => {
                tracing::debug!(target: "pinboard::accept", %peer, "idle connection closed to admit a new one at the cap");
                metrics.connections_reclaimed.inc()
            }
        };
    }
}

/// What one I/O thread serves its connections with.
struct IoThread<S> {
    app: Arc<App<S>>,
    control: Router,
    http: Arc<http1::Builder>,
    timeouts: ConnTimeouts,
    limits: front::Limits,
}

impl<S: PlacementStore> IoThread<S> {
    fn new(app: Arc<App<S>>, settings: &ServeSettings) -> Self {
        let mut http = http1::Builder::new();
        http.keep_alive(true)
            // Deadlines are `phase`'s (see there why not hyper's).
            .header_read_timeout(None)
            .max_header_size(settings.max_header_bytes)
            .max_buf_size(settings.max_header_bytes.max(MIN_READ_BUFFER));
        let limits = front::Limits {
            max_head: settings.max_header_bytes,
            // The bodies the proxy buffers anyway.
            max_body: app.proxy.retry_body_limit,
            body_timeout: app.proxy.body_timeout,
            // 400 or 408 from the proxy, no worker reached.
            broken_body: BrokenBody::Answer,
            // The proxied request finishes within its own deadlines, as
            // it always did on the front.
            client_gone: ClientGone::Finish,
        };
        Self {
            control: server::router(app.clone()),
            app,
            http: Arc::new(http),
            timeouts: settings.timeouts,
            limits,
        }
    }
}

impl<S: PlacementStore> Lane for IoThread<S> {
    type Conn = Client<S>;

    fn connect(&mut self, peer: SocketAddr, phase: &Phase) -> Client<S> {
        Client {
            app: self.app.clone(),
            control: self.control.clone(),
            http: self.http.clone(),
            client: Arc::new(ClientAddr::new(peer)),
            phase: phase.clone(),
            // Held by the connection task, its service and any WebSocket
            // it hands over: the connection counts against the cap until
            // all end.
            slot: Arc::new(Slot::new(phase.clone(), &self.app)),
            timeouts: self.timeouts,
            limits: self.limits,
        }
    }
}

/// One client connection's service.
struct Client<S> {
    app: Arc<App<S>>,
    control: Router,
    http: Arc<http1::Builder>,
    client: Arc<ClientAddr>,
    phase: Phase,
    slot: Arc<Slot>,
    timeouts: ConnTimeouts,
    limits: front::Limits,
}

impl<S: PlacementStore> Connection for Client<S> {
    async fn serve<IO>(self, io: IO, stopping: watch::Receiver<()>) -> Option<Lapse>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Self {
            app,
            control,
            http,
            client,
            phase,
            slot,
            timeouts,
            limits,
        } = self;
        let (handler, requests, hold) = (app.clone(), phase.clone(), slot.clone());
        let proxied = Front::new(app, client.clone());
        let service = service_fn(move |mut request: hyper::Request<Incoming>| {
            let busy = requests.begin_request();
            if request.headers().contains_key(http::header::UPGRADE) {
                let hold: Arc<dyn Send + Sync> = hold.clone();
                request.extensions_mut().insert(UpgradeHold(hold));
                // A WebSocket handshake may be held here (`crate::held`):
                // its events then enter the proxy through this node.
                let door: Arc<dyn crate::held::Door> = handler.clone();
                request.extensions_mut().insert(crate::held::HeldDoor(door));
            }
            let (app, control, client) = (handler.clone(), control.clone(), client.clone());
            let requests = requests.clone();
            async move {
                let response = route(app, control, client, request).await;
                if response.status() == http::StatusCode::SWITCHING_PROTOCOLS {
                    // Spliced from here on: never closed to make room.
                    requests.upgraded();
                }
                Ok::<_, Infallible>(response.map(|body| Tracked::new(body, busy)))
            }
        });
        let stages = Stages {
            http: &http,
            phase,
            timeouts,
            limits,
        };
        let lapse = front::serve_connection(stages, io, proxied, service, stopping).await;
        drop(slot);
        lapse
    }
}

async fn route<S: PlacementStore>(
    app: Arc<App<S>>,
    control: Router,
    client: Arc<ClientAddr>,
    request: hyper::Request<Incoming>,
) -> axum::response::Response {
    let mut request = request.map(Body::new);
    if server::paths::is_control(request.uri().path()) {
        // The dashboard's failed-login limit counts by peer address.
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(client.addr));
        match control.oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    } else {
        proxy::serve(&app, Some(&client), Inbound::Request(request), None).await
    }
}

#[cfg(test)]
mod tests {
    use crate::server::paths::is_control as is_control_path;

    #[test]
    fn only_pinboards_own_routes_are_control_paths() {
        assert!(is_control_path("/registry/register"));
        assert!(is_control_path("/healthz"));
        assert!(is_control_path("/metrics"));
        assert!(!is_control_path("/registry/some-id/path"));
        assert!(!is_control_path("/registry/register/x"));
        assert!(!is_control_path("/counter/a/hit"));
        assert!(!is_control_path("/"));
    }
}
