//! [`serve`]: bind, start, and on SIGTERM/SIGINT drain under a deadline
//! before exiting. The one-call way to run a worker.

use std::future::Future;
use std::io;
use std::time::Duration;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;

use crate::config::{ConfigErrors, Options};
use crate::worker::Worker;

/// How long a signalled worker lets its instances finish before aborting
/// them.
pub const SHUTDOWN_DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// Why [`serve`] stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The options are invalid.
    #[error("invalid pinned options: {0}")]
    Config(#[from] ConfigErrors),
    /// Binding or serving failed.
    #[error("pinned worker I/O: {0}")]
    Io(#[from] io::Error),
}

/// Builds the worker from `options`, binds `HOST:PORT` (default
/// `127.0.0.1`, an ephemeral port), prints the bound address, serves the
/// worker's routes and `/metrics`, and on SIGTERM or SIGINT drains with a
/// 30 s deadline, closes, and returns.
///
/// # Errors
///
/// Invalid options, or a socket that cannot be bound.
pub async fn serve(options: Options) -> Result<(), ServeError> {
    let port = options.parsed_port().map_err(|e| ConfigErrors(vec![e]))?;
    let bind = options
        .bind
        .clone()
        .unwrap_or_else(|| "127.0.0.1".to_owned());
    let worker = options.build()?;
    let listener = TcpListener::bind((bind.as_str(), port)).await?;
    let address = listener.local_addr()?;
    println!("pinned worker listening on http://{address}");
    serve_worker(listener, worker, shutdown_signal()).await?;
    Ok(())
}

/// Serves `worker` on `listener` until `signal` completes, then drains (30 s
/// deadline), closes the worker and stops the server.
///
/// # Errors
///
/// An I/O failure of the server.
pub async fn serve_worker(
    listener: TcpListener,
    worker: Worker,
    signal: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_worker_with(listener, worker, signal, SHUTDOWN_DRAIN_DEADLINE).await
}

/// [`serve_worker`] with another drain deadline.
///
/// # Errors
///
/// An I/O failure of the server.
pub async fn serve_worker_with(
    listener: TcpListener,
    worker: Worker,
    signal: impl Future<Output = ()> + Send + 'static,
    drain_deadline: Duration,
) -> io::Result<()> {
    let app = worker.router().merge(worker.metrics_router());
    worker.start();
    let draining = worker.clone();
    // Small request/response exchanges must not wait on Nagle's algorithm.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        signal.await;
        tracing::info!(deadline = ?drain_deadline, "shutdown signal: draining");
        draining.drain(Some(drain_deadline)).await;
        draining.close().await;
        tracing::info!("drained; stopping");
    })
    .await
}

/// Completes on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
