//! The accept loop: HTTP/1.1 connections from clients and workers.
//!
//! Owns connection setup (`TCP_NODELAY`, upgrades), the one split every
//! request goes through (the few control paths to the axum router of
//! [`server::router`], every other path straight to [`proxy::handle`]), and
//! graceful shutdown (stop accepting, let open connections finish).
//!
//! The data plane skips the router on purpose: matching, boxing and
//! response mapping cost more per proxied request than the proxy's own
//! bookkeeping. This module never looks at a request beyond its path.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceExt;

use crate::placement::PlacementStore;
use crate::proxy;
use crate::server::{self, App};

/// Pause after an accept error (out of file descriptors, say), so a
/// persistent one does not spin the loop.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Whether `path` is one of pinboard's own routes rather than `/<ns>/<id>/…`.
/// Exact paths only: a namespace may be called `/registry` and keep every
/// other path below it.
pub fn is_control_path(path: &str) -> bool {
    matches!(
        path,
        "/healthz"
            | "/metrics"
            | "/registry/register"
            | "/registry/heartbeat"
            | "/registry/release"
            | "/registry/deregister"
            | "/registry/tag"
            | "/registry/push"
            | "/registry/workers"
            | "/registry/overview"
    )
}

/// Serves `listener` until `shutdown` resolves, then waits for every open
/// connection to finish.
///
/// # Errors
///
/// Never at present; the signature leaves room for listener failures that
/// should end the process.
pub async fn serve<S: PlacementStore>(
    listener: TcpListener,
    app: Arc<App<S>>,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let control = server::router(app.clone());
    // Every connection holds a receiver: a send asks them to finish, and
    // `closed` resolves once the last one dropped its receiver.
    let (stop, stopping) = watch::channel(());
    let mut http = http1::Builder::new();
    http.keep_alive(true);
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
        let (app, control) = (app.clone(), control.clone());
        let service = service_fn(move |request: hyper::Request<Incoming>| {
            let (app, control) = (app.clone(), control.clone());
            async move { Ok::<_, Infallible>(route(app, control, request).await) }
        });
        let connection = http
            .serve_connection(TokioIo::new(tcp), service)
            .with_upgrades();
        let mut stopping = stopping.clone();
        tokio::spawn(async move {
            tokio::pin!(connection);
            // A client that goes away mid-exchange is routine, not an error.
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = stopping.changed() => {}
            }
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
            drop(stopping);
        });
    }
    drop(listener);
    drop(stopping);
    let _ = stop.send(());
    stop.closed().await;
    Ok(())
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
