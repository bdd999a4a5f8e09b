//! `pinboard`: the control plane of pinned. It registers worker processes
//! (leases, heartbeats, challenges), places every `(namespace, id)` on exactly
//! one live worker, and reverse-proxies client traffic to the owner.
//!
//! Layout, one concern per module:
//!
//! - [`config`]: flags and environment.
//! - [`clock`]: time, randomness and the epoch floor, as inputs.
//! - [`placement`]: the store trait; [`placement::MemoryStore`] (one node) and
//!   [`placement::RedisStore`] (many nodes).
//! - [`registry`]: register / heartbeat / release / deregister / tag / push
//!   and the operator views; [`registry::http`] is its HTTP shell.
//! - [`challenge`]: the advertise-URL proof.
//! - [`proxy`]: the data plane (resolve, forward, classify, retry).
//! - [`metrics`], [`upstream`], [`server`]: metrics, the pooled client, wiring.
//!
//! The crate never depends on the worker SDK: worker and control plane share
//! only `pinned-wire`.
#![forbid(unsafe_code)]

pub mod challenge;
pub mod cli;
pub mod clock;
pub mod config;
pub mod metrics;
pub mod placement;
pub mod proxy;
pub mod registry;
pub mod server;
pub mod upstream;

use std::sync::Arc;

use tokio::net::TcpListener;

use crate::clock::{SeededEntropy, SystemClock};
pub use crate::config::Config;
use crate::placement::{MemoryStore, PlacementStore, RedisStore, StoreError};

/// Why pinboard could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The placement store could not be reached.
    #[error("placement store: {0}")]
    Store(#[from] StoreError),
    /// Serving failed.
    #[error("serve: {0}")]
    Io(#[from] std::io::Error),
}

async fn serve_with<S: PlacementStore>(
    config: &Config,
    store: S,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let app = Arc::new(server::App::new(
        config,
        store,
        Arc::new(SystemClock::new()),
        Arc::new(SeededEntropy::from_os()),
    ));
    axum::serve(listener, server::router(app))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

/// Serve on `listener` until `shutdown` resolves: Redis placement when
/// `config.redis_url` is set, otherwise in-process placement.
///
/// # Errors
///
/// When Redis cannot be reached at start, or the listener fails.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    match &config.redis_url {
        Some(url) => {
            let store = RedisStore::connect(url, &config.redis_prefix).await?;
            tracing::info!(prefix = %config.redis_prefix, "placement in Redis");
            serve_with(&config, store, listener, shutdown).await
        }
        None => {
            tracing::info!("placement in memory (one node; set --redis-url to share placement)");
            serve_with(&config, MemoryStore::new(), listener, shutdown).await
        }
    }
}
