//! Durable objects on your own servers: the worker SDK.
//!
//! An [`Object`] is a small axum app instantiated once per client-chosen id.
//! The first request for `/<namespace>/<id>/...` activates it; every later
//! request for that id reaches the same live instance, which keeps its
//! memory until it goes idle and is evicted.
//!
//! ```no_run
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use axum::{routing::{get, post}, Json, Router};
//! use pinned::{BoxError, Context, Object, Options, Routes, This};
//!
//! struct Counter {
//!     value: AtomicU64,
//! }
//!
//! impl Object for Counter {
//!     async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
//!         Ok(Counter { value: AtomicU64::new(0) })
//!     }
//!
//!     fn routes() -> Routes<Self> {
//!         Router::new()
//!             .route("/increment", post(|this: This<Counter>| async move {
//!                 Json(serde_json::json!({ "value": this.value.fetch_add(1, Ordering::SeqCst) + 1 }))
//!             }))
//!             .route("/value", get(|this: This<Counter>| async move {
//!                 Json(serde_json::json!({ "value": this.value.load(Ordering::SeqCst) }))
//!             }))
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), pinned::ServeError> {
//!     pinned::serve(Options::from_env().host::<Counter>("/counter")).await
//! }
//! ```
//!
//! Without a pinboard the worker runs in *local mode* (the reference's dev
//! mode): one process, no attestation checks, a warning at start, and a
//! refusal to start when the environment says production.
//!
//! The [guide] walks through everything else chapter by chapter: concepts,
//! a first object, shared state and auth, durable state and trays, alarms,
//! sockets, running behind pinboard, operating a fleet, migrating from the
//! Python reference, guarantees and limits.
//!
//! # How the crate is built
//!
//! In layers, each importing only from itself and the layers below it
//! (`tests/layers.rs` checks it from the sources), bottom to top:
//!
//! 1. the base: the time source ([`Domain`]), task spawning, responses,
//!    metrics, configuration errors;
//! 2. `instance`: one instance's life as a plain state machine (activating,
//!    live, closing, closed; its in-flight count, abort signal, turns);
//! 3. `plane`: pinboard (registration, lease, fences) and cluster calls;
//! 4. `namespace`: one hosted namespace's instance table, admission and
//!    capacity, drain, wind-down and teardown, and the [`Context`] handle;
//! 5. `durable`: an instance's rows, alarms and schedules, trays;
//! 6. `object`: [`Object`], [`This`], [`Call`], [`State`], [`ws`];
//! 7. `serve`: the options and the factory that builds every layer
//!    ([`Options::build`]), the sockets, dispatch and the request stack
//!    around each route, [`serve`].
//!
//! A lower layer that must act on a higher one is handed what it needs by
//! the factory: the namespace gets the durable layer as a `Durability` and
//! the object's hooks as a `Lifecycle`; the registration loop gets the
//! namespaces as `Commanded` views.
#![forbid(unsafe_code)]

// The layers, bottom to top (see the crate docs): a module imports only
// from its own layer and the ones listed before it.
mod auth;
mod config_error;
mod metrics;
mod process;
mod response;
mod task;
mod time;

// The guide: documentation only, no code (its link table is a macro).
#[macro_use]
mod guide_links;
pub mod guide;

mod instance;

mod plane;

mod namespace;

mod durable;

mod object;

mod serve;

pub use auth::{AuthError, Denial};
pub use config_error::{ConfigError, ConfigErrors};
pub use durable::alarm::{
    Alarm, AlarmError, Schedule, ALARM_TRAY_ID, ALARM_TRAY_NS, MAX_SCHEDULES, MAX_SCHEDULE_NAME,
};
pub use durable::store::{InstanceStore, InstanceStoreError, RESERVED_TRAY_NS};
pub use durable::tray;
pub use instance::abort::Cancelled;
pub use namespace::context::{Context, TagError};
pub use namespace::options::{
    HostOptions, DEFAULT_CHURN_LINES_PER_SECOND, DEFAULT_DETACHED_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_INSTANCES, DEFAULT_SWEEP_INTERVAL,
};
pub use namespace::Idle;
pub use object::call::{Call, NotAnInstanceRoute};
pub use object::state::{MissingState, State};
pub use object::ws;
pub use object::{NoAlarmHandler, NoScheduleHandler, Object, RouteState, Routes, This};
/// The logging setup binaries install (`pinned::logging::init()` first
/// thing in `main`: text or JSON on stderr, no colours into files), errors
/// with their causes (`Chain`) and repeated failures logged once with a
/// count. The library itself never installs a subscriber.
pub use pinned_edge::logging;
/// Traces: the W3C trace context continued from requests and passed on to
/// cluster calls, spans exported over OTLP/HTTP when the `OTEL_*` variables
/// ask (feature `otlp`, on by default); `pinned::logging::init()` installs
/// the exporter, [`trace::shutdown`] sends what is still batched.
pub use pinned_edge::trace;
/// The durable state crate, re-exported.
pub use pinned_store;
pub use pinned_wire::attestation::Caller;
pub use pinned_wire::registry::Takeover;
pub use plane::cluster::{Cluster, ClusterError};
pub use plane::headroom::{default_headroom, DEFAULT_HEADROOM_MB};
pub use plane::instance_lease::{EvictionRequested, InstanceLease};
pub use plane::lease::DEFAULT_LEASE_BUFFER;
pub use plane::pinboard::{ClusterHost, Headroom, RegistrationState, DEFAULT_HEARTBEAT_INTERVAL};
pub use serve::config::{
    Options, ENV_ADVERTISE_URL, ENV_ALLOW_DEV_IN_PRODUCTION, ENV_HEADER_READ_TIMEOUT_MS, ENV_HOST,
    ENV_KEEP_ALIVE_TIMEOUT_MS, ENV_MAX_CONNECTIONS, ENV_MAX_HEADER_BYTES, ENV_PINBOARD_CA,
    ENV_PINBOARD_TOKEN, ENV_PINBOARD_URL, ENV_PINNED_HOSTNAME, ENV_PORT, ENV_SHUTDOWN_TIMEOUT_MS,
    ENV_TLS_CERT, ENV_TLS_KEY, PRODUCTION_MARKERS,
};
pub use serve::worker::Worker;
pub use serve::{serve, shutdown_signal, IntoWorker, Serve, ServeError, SHUTDOWN_DRAIN_DEADLINE};
pub use time::Domain;

/// The repository README's code blocks, compiled as doc tests so the
/// README cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

/// The error type objects return from activation and hooks. `anyhow::Error`
/// and any `std::error::Error` convert into it with `?`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
