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
use crate::upstream;

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

/// Serves `listener` on `threads` I/O threads (at least one) until
/// `shutdown` resolves, then waits for every open connection to finish.
///
/// Each I/O thread runs its own single-threaded runtime and accepts from
/// the shared socket: a connection, its requests and the worker connections
/// they use stay on one thread, as in nginx's worker processes. On a
/// work-stealing runtime the same exchange costs about a fifth more user
/// CPU (`proxy-bench`), spent moving tasks and wake-ups between threads.
///
/// # Errors
///
/// When the listener cannot be shared with the I/O threads, or a thread or
/// its runtime cannot be started.
pub async fn serve<S: PlacementStore>(
    listener: TcpListener,
    app: Arc<App<S>>,
    threads: usize,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let listener = listener.into_std()?;
    let (stop, stopped) = watch::channel(false);
    let mut finished = Vec::new();
    for slot in 0..threads.max(1) {
        let listener = listener.try_clone()?;
        let (app, mut stopped) = (app.clone(), stopped.clone());
        let (done, finished_rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(format!("pinboard-io-{slot}"))
            .spawn(move || {
                let served = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .and_then(|runtime| {
                        runtime.block_on(async move {
                            upstream::bind_thread_slot(slot);
                            let listener = TcpListener::from_std(listener)?;
                            let stop = async move {
                                let _ = stopped.wait_for(|stop| *stop).await;
                            };
                            accept_loop(listener, app, stop).await
                        })
                    });
                let _ = done.send(served);
            })?;
        finished.push(finished_rx);
    }
    drop(listener);
    shutdown.await;
    let _ = stop.send(true);
    for thread in finished {
        if let Ok(Err(error)) = thread.await {
            tracing::error!(target: "pinboard::accept", %error, "an I/O thread failed");
        }
    }
    Ok(())
}

/// One I/O thread's accept loop, until `shutdown`; then it waits for its
/// connections to finish.
async fn accept_loop<S: PlacementStore>(
    listener: TcpListener,
    app: Arc<App<S>>,
    shutdown: impl Future<Output = ()>,
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
