//! The accept loop: HTTP/1.1 connections from clients and workers.
//!
//! Owns the I/O threads (one single-threaded runtime each), handing every
//! accepted connection to the least loaded one, connection setup
//! (`TCP_NODELAY`, the TLS handshake with `--tls-cert`, upgrades), the
//! edge's bounds and deadlines (the connection cap in [`cap`], accept
//! back-off in [`backoff`], the header and keep-alive deadlines of
//! [`phase`], the head size limit, the shutdown deadline), the two stages
//! a connection goes through ([`front`] serves proxied requests itself;
//! the first request it leaves alone hands the connection to hyper, which
//! sends the few control paths to the axum router of [`server::router`]
//! and every other path to [`proxy::serve`]), and graceful shutdown (stop
//! accepting, let open connections finish within `--shutdown-timeout-ms`,
//! then drop the rest).
//!
//! The data plane skips the router on purpose: matching, boxing and
//! response mapping cost more per proxied request than the proxy's own
//! bookkeeping. This module never looks at a request beyond its path.
//!
//! The deadline machinery, the cap and the back-off live in `pinned-edge`,
//! shared with the worker's own server; they are re-exported here under
//! their old paths.
//!
//! With TLS, the handshake runs on the I/O thread inside the connection's
//! task: the connection already counts against the cap, and the handshake
//! must finish within the header deadline counted from accept (a slow
//! handshake is a slow head: same deadline, same counter).

pub use pinned_edge::{backoff, cap, phase};

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tower::ServiceExt;

use hyper_util::rt::TokioIo;
use pinned_edge::defaults::MIN_READ_BUFFER;
use pinned_edge::drive::{drive, drive_to_end, Driven, EdgeService};
use pinned_edge::roster::{Roster, Seat};
use pinned_edge::tls::tokio_rustls::TlsAcceptor;
use pinned_edge::tls::{self, HandshakeError};
use tokio::io::{AsyncRead, AsyncWrite};

use self::backoff::{Acceptor, Admission};
use self::phase::{ConnTimeouts, Lapse, Phase, Tracked, Watched};
use crate::app::App;
use crate::config::Config;
use crate::front::{self, Ended, Served};
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

/// A connection handed to an I/O thread, with its seat in that thread's
/// roster (taken by the acceptor, so the cap counts it on the way).
struct Handed {
    tcp: std::net::TcpStream,
    peer: SocketAddr,
    seat: Seat,
}

/// Serves `listener` on `settings.threads` I/O threads (at least one)
/// until `shutdown` resolves, then gives every open connection up to
/// `settings.shutdown_timeout` to finish and drops the rest.
///
/// The caller's task accepts; each connection goes to the I/O thread with
/// the fewest open connections, and stays there: its requests and the
/// worker connections they use all run on that thread's single-threaded
/// runtime, as in nginx's worker processes. On a work-stealing runtime the
/// same exchange costs about a fifth more CPU (`proxy-bench`), spent moving
/// tasks and wake-ups between threads. Handing connections out (rather
/// than letting every thread accept from the shared socket) keeps the
/// threads evenly loaded when many connections arrive at once.
///
/// At the cap ([`cap::effective`]) the connection that has idled longest
/// (waiting for a request head, none of it read, for at least
/// [`backoff::MIN_IDLE`]) is closed to admit the new one, as nginx does with its keep-alive connections
/// ([`roster`](pinned_edge::roster): one roster per I/O thread, the
/// longest idle of them all); with none such the new connection is
/// accepted and closed at once (the client sees the connection close
/// before any answer). A failing accept pauses the loop as [`backoff`]
/// says.
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
    let fd_limit = cap::open_file_limit();
    let max_connections = cap::effective(settings.max_connections, fd_limit);
    // Lowering the default is routine (debug); a value the operator chose
    // and does not get is worth a warning.
    if max_connections < settings.max_connections
        && settings.max_connections != pinned_edge::defaults::MAX_CONNECTIONS
    {
        tracing::warn!(
            target: "pinboard::accept",
            configured = settings.max_connections,
            open_file_limit = fd_limit,
            max_connections,
            "--max-connections lowered to what the open-file limit carries (raise `ulimit -n` for more)"
        );
    } else if max_connections < settings.max_connections {
        tracing::debug!(target: "pinboard::accept", open_file_limit = fd_limit, max_connections, "--max-connections lowered to what the open-file limit carries (the default; raise `ulimit -n` for more)");
    }
    let mut lanes = Vec::new();
    let mut rosters = Vec::new();
    let mut finished = Vec::new();
    for slot in 0..settings.threads.max(1) {
        let (hand, handed) = mpsc::unbounded_channel::<Handed>();
        let roster = Roster::new();
        let (app, load, settings) = (app.clone(), roster.clone(), settings.clone());
        let (done, finished_rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(format!("pinboard-io-{slot}"))
            .spawn(move || {
                let served = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map(|runtime| {
                        runtime.block_on(async move {
                            upstream::bind_thread_slot(slot);
                            io_loop(handed, app, load, settings).await;
                        });
                        // Dropping the runtime drops every connection that
                        // outlived the shutdown deadline.
                    });
                let _ = done.send(served);
            })?;
        lanes.push(hand);
        rosters.push(roster);
        finished.push(finished_rx);
    }
    let mut acceptor = Acceptor::new(max_connections);
    tokio::pin!(shutdown);
    let failed = || {
        app.metrics.accept_errors.inc();
    };
    while let Some((tcp, peer)) = acceptor.next(&listener, &mut shutdown, failed).await {
        if acceptor.admit(&rosters) == Admission::Refused {
            // Closed before any byte: the client sees the connection end.
            drop(tcp);
            app.metrics.connections_refused.inc();
            continue;
        }
        // Proxied exchanges are small: never wait on Nagle's algorithm.
        let _ = tcp.set_nodelay(true);
        let Ok(tcp) = tcp.into_std() else { continue };
        let lane = lanes
            .iter()
            .zip(&rosters)
            .min_by_key(|(_, roster)| roster.open());
        if let Some((hand, roster)) = lane {
            // A failed send drops the seat with the connection.
            let _ = hand.send(Handed {
                tcp,
                peer,
                seat: roster.seat(),
            });
        }
    }
    drop(listener);
    // Closing the lanes tells every I/O thread to finish its connections.
    drop(lanes);
    for thread in finished {
        if let Ok(Err(error)) = thread.await {
            tracing::error!(target: "pinboard::accept", error = %pinned_edge::logging::Chain(&error), "an I/O thread failed");
        }
    }
    Ok(())
}

/// One I/O thread: serves the connections handed to it until the acceptor
/// closes its lane, then waits up to the shutdown deadline for them to
/// finish. `roster` holds its live connections, for the acceptor's choice
/// and the cap.
async fn io_loop<S: PlacementStore>(
    mut handed: mpsc::UnboundedReceiver<Handed>,
    app: Arc<App<S>>,
    roster: Arc<Roster>,
    settings: ServeSettings,
) {
    let control = server::router(app.clone());
    // Every connection holds a receiver: a send asks them to finish, and
    // `closed` resolves once the last one dropped its receiver.
    let (stop, stopping) = watch::channel(());
    let mut http = http1::Builder::new();
    http.keep_alive(true)
        // Deadlines are `phase`'s (see there why not hyper's).
        .header_read_timeout(None)
        .max_header_size(settings.max_header_bytes)
        .max_buf_size(settings.max_header_bytes.max(MIN_READ_BUFFER));
    let http = Arc::new(http);
    while let Some(Handed { tcp, peer, seat }) = handed.recv().await {
        let tcp = match TcpStream::from_std(tcp) {
            Ok(tcp) => tcp,
            Err(error) => {
                tracing::warn!(target: "pinboard::accept", error = %pinned_edge::logging::Chain(&error), "cannot adopt a connection");
                continue;
            }
        };
        let phase = Phase::seated(seat);
        let client = Arc::new(ClientAddr::new(peer));
        // Held by the connection task, its service and any WebSocket it
        // hands over: the connection counts against the cap until all end.
        let slot = Arc::new(Slot::new(phase.clone(), &app));
        let (handler, control, requests, hold, front_client) = (
            app.clone(),
            control.clone(),
            phase.clone(),
            slot.clone(),
            client.clone(),
        );
        let service = service_fn(move |mut request: hyper::Request<Incoming>| {
            let busy = requests.begin_request();
            if request.headers().contains_key(http::header::UPGRADE) {
                let hold: Arc<dyn Send + Sync> = hold.clone();
                request.extensions_mut().insert(UpgradeHold(hold));
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
        let (stopping, app, http) = (stopping.clone(), app.clone(), http.clone());
        let (tls, timeouts) = (settings.tls.clone(), settings.timeouts);
        let limits = front::Limits {
            max_head: settings.max_header_bytes,
            max_body: app.proxy.retry_body_limit,
            body_timeout: app.proxy.body_timeout,
        };
        tokio::spawn(async move {
            let stages = Stages {
                app: &app,
                client: front_client,
                phase,
                timeouts,
                limits,
                http: &http,
            };
            let lapse = match tls {
                None => stages.serve(tcp, service, stopping).await,
                // The header deadline counts from accept, handshake included.
                Some(acceptor) => match tls::accept(&acceptor, tcp, timeouts.header).await {
                    Ok(tls) => stages.serve(tls, service, stopping).await,
                    Err(HandshakeError::TimedOut(_)) => Some(Lapse::Header),
                    Err(HandshakeError::Failed(error)) => {
                        app.metrics.tls_handshake_failures.inc();
                        tracing::debug!(target: "pinboard::accept", %peer, error = %pinned_edge::logging::Chain(&error), "TLS handshake failed");
                        None
                    }
                },
            };
            match lapse {
                Some(Lapse::Header) => app.metrics.connections_header_timeouts.inc(),
                Some(Lapse::Idle) => app.metrics.connections_idle_timeouts.inc(),
                Some(Lapse::Reclaimed) => {
                    tracing::debug!(target: "pinboard::accept", %peer, "idle connection closed to admit a new one at the cap");
                    app.metrics.connections_reclaimed.inc()
                }
                None => 0,
            };
            drop(slot);
        });
    }
    drop(stopping);
    let _ = stop.send(());
    let left = roster.open();
    if tokio::time::timeout(settings.shutdown_timeout, stop.closed())
        .await
        .is_err()
    {
        tracing::warn!(
            target: "pinboard::accept",
            connections = roster.open(),
            open_at_signal = left,
            "shutdown deadline passed; dropping the connections still open"
        );
    }
}

/// What one connection's two stages share: the front first, then hyper if
/// the front hands the connection over (see [`front`]).
struct Stages<'a, S> {
    app: &'a Arc<App<S>>,
    client: Arc<ClientAddr>,
    phase: Phase,
    timeouts: ConnTimeouts,
    limits: front::Limits,
    http: &'a http1::Builder,
}

impl<S: PlacementStore> Stages<'_, S> {
    /// Serves `io` to its end under the phase deadlines: `Some` when a
    /// deadline closed it.
    async fn serve<IO, Svc>(
        self,
        io: IO,
        service: Svc,
        mut stopping: watch::Receiver<()>,
    ) -> Option<Lapse>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        Svc: EdgeService,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let io = Watched::new(io, self.phase.clone());
        let run = front::serve(
            io,
            self.app.clone(),
            self.client,
            self.phase.clone(),
            stop.clone(),
            self.limits,
        );
        let rest = match drive_to_end(
            Served::new(run, stop.clone()),
            &self.phase,
            self.timeouts,
            &mut stopping,
        )
        .await
        {
            Driven::Lapsed(lapse) => return Some(lapse),
            Driven::Ended(Ended::Closed) => return None,
            Driven::Ended(Ended::HandOff(rest)) => rest,
        };
        let connection = self
            .http
            .serve_connection(TokioIo::new(rest), service)
            .with_upgrades();
        let mut connection = std::pin::pin!(connection);
        // A stop the front saw is not seen again by `stopping`.
        if stop.load(Ordering::Acquire) {
            connection.as_mut().graceful_shutdown();
        }
        drive(connection, &self.phase, self.timeouts, stopping).await
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
        proxy::serve(&app, Some(&client), Inbound::Request(request)).await
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
