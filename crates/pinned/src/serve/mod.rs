//! The serving layer, the top of the worker: the options and the factory
//! that builds every layer below from them ([`config`], [`worker`]), the
//! sockets ([`edge`]), the request path ([`dispatch`], then the [`stack`]
//! around each of an object's routes), in-process cluster calls
//! ([`exchange`]) and the table of hosted namespaces ([`namespaces`]).
//!
//! [`serve`]: one builder that binds, starts the worker, serves it beside
//! the application's own routes, and on a shutdown signal drains under a
//! deadline and closes before returning.
//!
//! The drain-then-close sequence lives here and nowhere else, so an
//! application that adds routes keeps it: its instances' `on_stop` hooks
//! run on SIGTERM instead of being cut off. The sockets are `edge`'s
//! (deadlines, the connection cap, accept back-off).

pub(crate) mod body;
pub(crate) mod config;
pub(crate) mod dispatch;
pub(crate) mod edge;
pub(crate) mod exchange;
pub(crate) mod held_event;
pub(crate) mod namespaces;
pub(crate) mod requests;
pub(crate) mod stack;
pub(crate) mod worker;

use std::future::{Future, IntoFuture};
use std::io;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use axum::Router;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::net::TcpListener;

use crate::config_error::ConfigErrors;
use crate::serve::config::Options;
use crate::serve::worker::Worker;

/// How long a signalled worker lets its instances finish before aborting
/// them, unless [`Serve::drain_deadline`] says otherwise.
pub const SHUTDOWN_DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// Why [`serve`] stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The options are invalid (every problem, reported together).
    #[error("invalid pinned options: {0}")]
    Config(#[from] ConfigErrors),
    /// The application's routes overlap the worker's (`/_pinned/*`,
    /// `/metrics`, or a hosted namespace).
    #[error("the application's routes conflict with the worker's: {0}")]
    Routes(String),
    /// Binding or serving failed.
    #[error("pinned worker I/O: {0}")]
    Io(#[from] io::Error),
}

/// What [`serve`] runs: worker [`Options`] (built when served) or a
/// [`Worker`] already built (to keep a handle on it, for its secret or a
/// drain of your own).
pub trait IntoWorker: sealed::Sealed {
    /// Builds the worker.
    ///
    /// # Errors
    ///
    /// Every configuration problem at once.
    fn into_worker(self) -> Result<Worker, ConfigErrors>;
}

/// Built for [`serve`]: unlike [`Options::build`], an advertise URL with
/// port 0 is accepted, and takes the port `serve` binds.
impl IntoWorker for Options {
    fn into_worker(self) -> Result<Worker, ConfigErrors> {
        self.build_served()
    }
}

impl IntoWorker for Worker {
    fn into_worker(self) -> Result<Worker, ConfigErrors> {
        Ok(self)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::Options {}
    impl Sealed for crate::Worker {}
}

type Signal = BoxFuture<'static, ()>;

/// Serves a worker: the future of [`serve`], configured before it is
/// awaited.
///
/// ```no_run
/// use std::time::Duration;
/// use axum::{routing::get, Router};
/// # use pinned::{BoxError, Context, Object, Options, Routes};
/// # struct Counter;
/// # impl Object for Counter {
/// #     async fn activate(_: &Context) -> Result<Self, BoxError> { Ok(Counter) }
/// #     fn routes() -> Routes<Self> { Router::new() }
/// # }
///
/// # async fn run() -> Result<(), pinned::ServeError> {
/// pinned::serve(Options::from_env().host::<Counter>("/counter"))
///     .routes(Router::new().route("/healthz", get(|| async { "ok" })))
///     .drain_deadline(Duration::from_secs(10))
///     .await
/// # }
/// ```
#[must_use = "a Serve does nothing until awaited"]
pub struct Serve {
    worker: Result<Worker, ConfigErrors>,
    listener: Option<TcpListener>,
    routes: Router,
    signal: Option<Signal>,
    drain_deadline: Duration,
}

/// Serves the worker `app` builds (its [`Options`], or a built [`Worker`]):
/// binds `HOST:PORT` (default `127.0.0.1` and an ephemeral port) unless
/// given a [`listener`](Serve::listener), prints the bound address, starts
/// the worker, serves its routes, `/metrics` and the application's own
/// [`routes`](Serve::routes), and on SIGTERM or SIGINT (or the signal given
/// to [`with_graceful_shutdown`](Serve::with_graceful_shutdown)) drains with
/// a 30 s deadline, closes the worker, and returns.
///
/// The worker starts (and, behind pinboard, registers) only once the
/// listener is bound: an advertise URL with port 0 advertises the port
/// bound (see [`Options::pinboard`]).
///
/// ```no_run
/// # use pinned::{BoxError, Context, Object, Options, Routes};
/// # struct Counter;
/// # impl Object for Counter {
/// #     async fn activate(_: &Context) -> Result<Self, BoxError> { Ok(Counter) }
/// #     fn routes() -> Routes<Self> { axum::Router::new() }
/// # }
/// #[tokio::main]
/// async fn main() -> Result<(), pinned::ServeError> {
///     pinned::serve(Options::from_env().host::<Counter>("/counter")).await
/// }
/// ```
pub fn serve(app: impl IntoWorker) -> Serve {
    Serve {
        worker: app.into_worker(),
        listener: None,
        routes: Router::new(),
        signal: None,
        drain_deadline: SHUTDOWN_DRAIN_DEADLINE,
    }
}

impl Serve {
    /// Serves on `listener` instead of binding `HOST:PORT` (an advertise
    /// URL with port 0 takes this listener's port).
    pub fn listener(mut self, listener: TcpListener) -> Self {
        self.listener = Some(listener);
        self
    }

    /// Serves `routes` beside the worker's (merged; they must not overlap
    /// `/_pinned/*`, `/metrics` or a hosted namespace). Called again, the
    /// routes add up.
    pub fn routes(mut self, routes: Router) -> Self {
        self.routes = self.routes.merge(routes);
        self
    }

    /// Drains and stops when `signal` completes instead of on SIGTERM or
    /// SIGINT.
    pub fn with_graceful_shutdown(
        mut self,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        self.signal = Some(Box::pin(signal));
        self
    }

    /// How long the drain lets instances finish before aborting them
    /// (default 30 s).
    pub fn drain_deadline(mut self, deadline: Duration) -> Self {
        self.drain_deadline = deadline;
        self
    }

    async fn run(self) -> Result<(), ServeError> {
        let worker = self.worker?;
        // Merged before binding, so conflicting routes fail without a
        // listening line; the worker is not started yet.
        let app = merge(&worker, self.routes)?;
        let listener = match self.listener {
            Some(listener) => listener,
            None => {
                let (host, port) = worker.bind_address();
                let listener = TcpListener::bind((host, port)).await?;
                let scheme = if worker.tls_acceptor().is_some() {
                    "https"
                } else {
                    "http"
                };
                println!(
                    "pinned worker listening on {scheme}://{}",
                    listener.local_addr()?
                );
                listener
            }
        };
        // The registration loop must see the bound port, so the worker
        // learns it before it starts.
        worker.listening_on(listener.local_addr()?);
        worker.start();
        let signal = self.signal.unwrap_or_else(|| Box::pin(shutdown_signal()));
        let drain_deadline = self.drain_deadline;
        let draining = worker.clone();
        // New connections are served while the worker drains (a draining
        // worker still answers, refusing new activations); the connections
        // still open after it get the edge's shutdown deadline.
        let (settings, tls) = (worker.edge_settings(), worker.tls_acceptor());
        let reclaimed = worker.connections_reclaimed();
        crate::serve::edge::serve(
            listener,
            app,
            worker.hosts(),
            settings,
            tls,
            reclaimed,
            async move {
                signal.await;
                tracing::info!(deadline = ?drain_deadline, "shutdown signal: draining");
                draining.drain(Some(drain_deadline)).await;
                draining.close().await;
                tracing::info!("drained; stopping");
            },
        )
        .await;
        Ok(())
    }
}

/// The worker's routes, `/metrics`, and the application's, or why they
/// cannot be served together (axum refuses overlapping routes by
/// panicking; that becomes an error here).
fn merge(worker: &Worker, routes: Router) -> Result<Router, ServeError> {
    let ours = worker.build_router().merge(worker.metrics_router());
    std::panic::catch_unwind(AssertUnwindSafe(|| ours.merge(routes)))
        .map_err(|panic| ServeError::Routes(crate::namespace::panic_message(panic.as_ref())))
}

impl IntoFuture for Serve {
    type Output = Result<(), ServeError>;
    type IntoFuture = BoxFuture<'static, Result<(), ServeError>>;

    fn into_future(self) -> Self::IntoFuture {
        self.run().boxed()
    }
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
