//! `pinboard`: the control plane of pinned. It registers worker processes
//! (leases, heartbeats, challenges), places every `(namespace, id)` on exactly
//! one live worker, and reverse-proxies client traffic to the owner.
//!
//! Layers, bottom to top: a module uses only modules of its own layer or
//! below (no import circle among the files), and nothing below the
//! [`app`] state knows a request handler.
//!
//! 1. Inputs: [`config`] (flags, environment, the settings derived from
//!    them); [`clock`] (time, randomness and the epoch floor) with
//!    [`epoch_mark`] (the floor's durable mark in Postgres); [`metrics`].
//! 2. [`placement`]: the store trait; [`placement::MemoryStore`] (one
//!    node), [`placement::RedisStore`] (many nodes on one Redis) and
//!    [`placement::ClusterStore`] (many nodes on a Redis Cluster).
//! 3. [`world`]: which workers a request may reach (hostname and env).
//! 4. [`upstream`]: the pooled clients, one [`upstream::WorkerConn`] per
//!    live worker; [`outbound`]: the one transport for everything sent to
//!    workers.
//! 5. [`routes`]: the route directory (routes, the worker view, the
//!    store's generation and quarantine, readiness, claims), with the
//!    records it feeds in [`operator`] (`moves`, `traffic`).
//! 6. [`challenge`]: the advertise-URL proof; [`registry`]: register /
//!    heartbeat / release / deregister / tag / push, as decisions.
//! 7. [`app`]: the shared state of a node, wired in one function.
//! 8. What takes an `App`: [`proxy`] (the data plane, as phases),
//!    [`sweeper`] (due alarms and marked ids, with `--database-url`),
//!    [`upkeep`] (store-loss checks, expiry of vacated rows), and the HTTP
//!    shells `registry::http`, `operator::http` and `dashboard::http` (the
//!    operator's page at `/dashboard`).
//! 9. Serving: [`server`] (the control router), [`front`] (the proxy as
//!    the shared front's service) and [`accept`] (the accept loop: control
//!    paths to the router, everything else to [`proxy::serve`]).
//! 10. Entry points: [`run`], [`cli`], [`operator_cli`] (the `pinboard
//!     workers|placements|drain|…` commands), [`sim`] (`pinboard
//!     sim-coprocess`: the reference's simulation driving these parts over
//!     JSON lines).
//!
//! The crate never depends on the worker SDK: worker and control plane share
//! only `pinned-wire` (and read the same `pinned-store` tables).
#![forbid(unsafe_code)]

pub mod accept;
pub mod app;
pub mod challenge;
pub mod cli;
pub mod clock;
pub mod config;
pub mod dashboard;
pub mod epoch_mark;
pub mod front;
pub mod held;
pub mod metrics;
pub mod operator;
pub mod operator_cli;
pub mod outbound;
pub mod placement;
pub mod proxy;
pub mod registry;
pub mod routes;
pub mod server;
pub mod sim;
pub mod sweeper;
pub mod upkeep;
pub mod upstream;
pub mod world;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::clock::{Entropy, EpochFloor, SeededEntropy, SystemClock};
pub use crate::config::Config;
use crate::placement::{
    Batching, ClusterSettings, ClusterStore, MemoryStore, PlacementStore, RedisStore, StoreError,
};

/// How long shutdown waits for the sweeper to finish its lap and release
/// its lease.
const SWEEPER_STOP_GRACE: Duration = Duration::from_secs(5);

/// Why pinboard could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The placement store could not be reached.
    #[error("placement store: {0}")]
    Store(#[from] StoreError),
    /// Serving failed.
    #[error("serve: {0}")]
    Io(#[from] std::io::Error),
    /// The state store URL (`--database-url`) was refused.
    #[error("state store: {0}")]
    Database(#[from] pinned_store::StoreError),
    /// The durable epoch mark (`--database-url`) was refused.
    #[error("{0}")]
    Mark(crate::clock::MarkError),
    /// A TLS file (`--tls-cert`, `--tls-key`, `--upstream-ca`) was refused.
    #[error("TLS: {0}")]
    Tls(#[from] pinned_edge::tls::TlsError),
}

async fn serve_with<S: PlacementStore>(
    config: &Config,
    store: S,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    if config.operator_token.is_none() {
        tracing::warn!(
            "no --operator-token / PINBOARD_OPERATOR_TOKEN: /registry/push, /registry/workers \
             and /registry/overview take the worker token; set an operator token to separate them"
        );
    }
    let entropy = Arc::new(SeededEntropy::from_os());
    // With a database, the epoch floor also keeps to a high-water mark
    // there, shared by every node and untouched by a Redis wipe.
    let floor = match &config.database_url {
        Some(url) => EpochFloor::with_durable(Arc::new(
            epoch_mark::PostgresMark::connect(url).map_err(RunError::Mark)?,
        )),
        None => EpochFloor::default(),
    };
    let app = Arc::new(app::App::from_parts(
        config,
        app::AppParts {
            store: Arc::new(store),
            outbound: outbound::Outbound::http(config.upstream_tls()?),
            clock: Arc::new(SystemClock::new()),
            entropy: entropy.clone(),
            floor: Arc::new(floor),
        },
    ));
    // Before serving: a node places nothing until it knows the store's
    // generation (and whether the store starts empty).
    app.routes.open_generation().await?;
    let (stop, stopped) = watch::channel(false);
    // The background tasks' lines carry the node (its bound address), for
    // logs of several nodes read side by side.
    let node = tracing::info_span!("node", addr = %listener.local_addr()?);
    let _in_node = node.enter();
    let upkeep = upkeep::spawn(
        app.clone(),
        upkeep::UpkeepSettings::from(config),
        stopped.clone(),
    );
    let relay = relay_settings(config).map(|settings| {
        held::relay::spawn(
            &app.held,
            settings,
            held::relay::RelayMetrics {
                published: app.metrics.held_relay_published.clone(),
                received: app.metrics.held_relay_received.clone(),
                losses: app.metrics.held_relay_losses.clone(),
            },
            stopped.clone(),
        )
    });
    let sweeper = match &config.database_url {
        Some(url) => Some(sweeper::spawn_postgres(
            app.clone(),
            url,
            sweeper::SweepSettings::from(config),
            entropy.token_hex(16),
            stopped,
        )?),
        None => None,
    };
    drop(_in_node);
    let shutdown = async move {
        shutdown.await;
        let _ = stop.send(true);
    };
    let mut settings = accept::ServeSettings::from(config);
    settings.tls = config.tls_server()?;
    let served = accept::serve(listener, app, settings, shutdown).await;
    upkeep.abort();
    if let Some((publisher, subscriber)) = relay {
        publisher.abort();
        subscriber.abort();
    }
    if let Some(sweeper) = sweeper {
        // The sender is gone or signalled: the sweeper stops after its
        // current lap and releases its lease (else the lease lapses).
        let _ = tokio::time::timeout(SWEEPER_STOP_GRACE, sweeper).await;
    }
    served?;
    Ok(())
}

/// Where held sockets' sends meet the other nodes: the placement's Redis
/// (its URL, or a cluster's seeds), on `<prefix>held:sends`; none for
/// in-process placement (one node).
fn relay_settings(config: &Config) -> Option<held::relay::RelaySettings> {
    let urls: Vec<String> = match (&config.redis_cluster_url, &config.redis_url) {
        (Some(urls), _) => urls
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect(),
        (None, Some(url)) => vec![url.clone()],
        (None, None) => return None,
    };
    Some(held::relay::RelaySettings {
        urls,
        channel: format!("{}held:sends", config.redis_prefix),
        deadline: Duration::from_millis(config.redis_timeout_ms.max(1)),
    })
}

/// Serve on `listener` until `shutdown` resolves: Redis Cluster placement
/// when `config.redis_cluster_url` is set, Redis placement when
/// `config.redis_url` is, otherwise in-process placement.
///
/// # Errors
///
/// When Redis cannot be reached at start, or the listener fails.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    if let Some(urls) = &config.redis_cluster_url {
        let urls: Vec<&str> = urls
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect();
        let settings = ClusterSettings {
            batching: Batching {
                deadline: Duration::from_millis(config.redis_timeout_ms.max(1)),
                ..Batching::default()
            },
            wait_replicas: config.redis_cluster_replicas,
            quarantine_ms: config.quarantine_ms(),
            loss_quarantine_ms: config.quarantine_ms().max(config.lease_ttl_ms),
            row_grace_ms: config.placement_grace_ms(),
        };
        let store = ClusterStore::connect(&urls, &config.redis_prefix, settings).await?;
        tracing::info!(prefix = %config.redis_prefix, shards = placement::SHARDS, replicas = config.redis_cluster_replicas, "placement in Redis Cluster");
        return serve_with(&config, store, listener, shutdown).await;
    }
    match &config.redis_url {
        Some(url) => {
            let batching = Batching {
                deadline: Duration::from_millis(config.redis_timeout_ms.max(1)),
                ..Batching::default()
            };
            let store = RedisStore::connect_with(url, &config.redis_prefix, batching)
                .await?
                .with_row_grace(config.placement_grace_ms());
            tracing::info!(prefix = %config.redis_prefix, "placement in Redis");
            serve_with(&config, store, listener, shutdown).await
        }
        None => {
            tracing::info!("placement in memory (one node; set --redis-url to share placement)");
            let store = MemoryStore::new().with_row_grace(config.placement_grace_ms());
            serve_with(&config, store, listener, shutdown).await
        }
    }
}
