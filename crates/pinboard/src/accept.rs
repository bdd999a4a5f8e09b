//! The accept loop: HTTP/1.1 connections from clients and workers.
//!
//! Owns the I/O threads (one single-threaded runtime each), handing every
//! accepted connection to the least loaded one, connection setup
//! (`TCP_NODELAY`, upgrades), the one split every
//! request goes through (the few control paths to the axum router of
//! [`server::router`], every other path straight to [`proxy::handle`]), and
//! graceful shutdown (stop accepting, let open connections finish).
//!
//! The data plane skips the router on purpose: matching, boxing and
//! response mapping cost more per proxied request than the proxy's own
//! bookkeeping. This module never looks at a request beyond its path.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tower::ServiceExt;

use crate::placement::PlacementStore;
use crate::proxy;
use crate::server::{self, App};
use crate::upstream;

/// Pause after an accept error (out of file descriptors, say), so a
/// persistent one does not spin the loop.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Whether `path` is one of pinboard's own routes ([`server::paths`])
/// rather than `/<ns>/<id>/…`. Exact paths only: a namespace may be called
/// `/registry` and keep every other path below it.
pub fn is_control_path(path: &str) -> bool {
    server::paths::ALL.contains(&path)
}

/// Serves `listener` on `threads` I/O threads (at least one) until
/// `shutdown` resolves, then waits for every open connection to finish.
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
/// # Errors
///
/// When an I/O thread or its runtime cannot be started.
pub async fn serve<S: PlacementStore>(
    listener: TcpListener,
    app: Arc<App<S>>,
    threads: usize,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let mut lanes = Vec::new();
    let mut finished = Vec::new();
    for slot in 0..threads.max(1) {
        let (hand, handed) = mpsc::unbounded_channel::<std::net::TcpStream>();
        let open = Arc::new(AtomicUsize::new(0));
        let (app, load) = (app.clone(), open.clone());
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
                            io_loop(handed, app, load).await;
                        });
                    });
                let _ = done.send(served);
            })?;
        lanes.push((hand, open));
        finished.push(finished_rx);
    }
    tokio::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _peer)) => tcp,
                Err(error) => {
                    tracing::warn!(target: "pinboard::accept", %error, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        // Proxied exchanges are small: never wait on Nagle's algorithm.
        let _ = tcp.set_nodelay(true);
        let Ok(tcp) = tcp.into_std() else { continue };
        let lane = lanes
            .iter()
            .min_by_key(|(_, open)| open.load(Ordering::Relaxed));
        if let Some((hand, open)) = lane {
            open.fetch_add(1, Ordering::Relaxed);
            if hand.send(tcp).is_err() {
                open.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
    drop(listener);
    // Closing the lanes tells every I/O thread to finish its connections.
    drop(lanes);
    for thread in finished {
        if let Ok(Err(error)) = thread.await {
            tracing::error!(target: "pinboard::accept", %error, "an I/O thread failed");
        }
    }
    Ok(())
}

/// One I/O thread: serves the connections handed to it until the acceptor
/// closes its lane, then waits for them to finish. `open` counts its live
/// connections for the acceptor's choice.
async fn io_loop<S: PlacementStore>(
    mut handed: mpsc::UnboundedReceiver<std::net::TcpStream>,
    app: Arc<App<S>>,
    open: Arc<AtomicUsize>,
) {
    let control = server::router(app.clone());
    // Every connection holds a receiver: a send asks them to finish, and
    // `closed` resolves once the last one dropped its receiver.
    let (stop, stopping) = watch::channel(());
    let mut http = http1::Builder::new();
    http.keep_alive(true);
    while let Some(tcp) = handed.recv().await {
        let tcp = match TcpStream::from_std(tcp) {
            Ok(tcp) => tcp,
            Err(error) => {
                open.fetch_sub(1, Ordering::Relaxed);
                tracing::warn!(target: "pinboard::accept", %error, "cannot adopt a connection");
                continue;
            }
        };
        let (app, control) = (app.clone(), control.clone());
        let service = service_fn(move |request: hyper::Request<Incoming>| {
            let (app, control) = (app.clone(), control.clone());
            async move { Ok::<_, Infallible>(route(app, control, request).await) }
        });
        let connection = http
            .serve_connection(TokioIo::new(tcp), service)
            .with_upgrades();
        let (mut stopping, open) = (stopping.clone(), open.clone());
        tokio::spawn(async move {
            tokio::pin!(connection);
            // A client that goes away mid-exchange is routine, not an error.
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = stopping.changed() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            open.fetch_sub(1, Ordering::Relaxed);
            drop(stopping);
        });
    }
    drop(stopping);
    let _ = stop.send(());
    stop.closed().await;
}

async fn route<S: PlacementStore>(
    app: Arc<App<S>>,
    control: Router,
    request: hyper::Request<Incoming>,
) -> axum::response::Response {
    let request = request.map(Body::new);
    if is_control_path(request.uri().path()) {
        match control.oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    } else {
        proxy::handle(State(app), request).await
    }
}

#[cfg(test)]
mod tests {
    use super::is_control_path;

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
