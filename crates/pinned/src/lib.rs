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
#![forbid(unsafe_code)]

mod admit;
mod advertise;
mod auth;
mod body;
mod call;
mod cluster;
mod config;
mod config_error;
mod control;
mod directory;
mod dispatch;
mod durable;
mod edge;
mod exchange;
mod fence;
mod headroom;
mod host;
mod hosts;
mod instance;
mod instance_lease;
mod lease;
mod metrics;
mod object;
mod plane;
mod process;
mod registration;
mod response;
mod serve;
mod state;
mod switchboard;
mod task;
mod time;
mod worker;
pub mod ws;

pub use auth::{AuthError, Denial};
pub use call::Call;
pub use call::NotAnInstanceRoute;
pub use cluster::{Cluster, ClusterError};
pub use config::{
    Options, ENV_ADVERTISE_URL, ENV_ALLOW_DEV_IN_PRODUCTION, ENV_HEADER_READ_TIMEOUT_MS, ENV_HOST,
    ENV_KEEP_ALIVE_TIMEOUT_MS, ENV_MAX_CONNECTIONS, ENV_MAX_HEADER_BYTES, ENV_PINBOARD_CA,
    ENV_PINBOARD_TOKEN, ENV_PINBOARD_URL, ENV_PINNED_HOSTNAME, ENV_PORT, ENV_SHUTDOWN_TIMEOUT_MS,
    ENV_TLS_CERT, ENV_TLS_KEY, PRODUCTION_MARKERS,
};
pub use config_error::{ConfigError, ConfigErrors};
pub use directory::context::{Context, TagError};
pub use directory::Idle;
pub use durable::alarm::{
    Alarm, AlarmError, Schedule, ALARM_TRAY_ID, ALARM_TRAY_NS, MAX_SCHEDULES, MAX_SCHEDULE_NAME,
};
pub use durable::store::{InstanceStore, InstanceStoreError, RESERVED_TRAY_NS};
pub use durable::tray;
pub use headroom::{default_headroom, DEFAULT_HEADROOM_MB};
pub use host::{
    HostOptions, DEFAULT_DETACHED_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_INSTANCES,
    DEFAULT_SWEEP_INTERVAL,
};
pub use instance::abort::Cancelled;
pub use instance_lease::{EvictionRequested, InstanceLease};
pub use lease::DEFAULT_LEASE_BUFFER;
pub use object::{NoAlarmHandler, NoScheduleHandler, Object, RouteState, Routes, This};
/// The logging setup binaries install (`pinned::logging::init()` first
/// thing in `main`: text or JSON on stderr, no colours into files), errors
/// with their causes (`Chain`) and repeated failures logged once with a
/// count. The library itself never installs a subscriber.
pub use pinned_edge::logging;
/// The durable state crate, re-exported.
pub use pinned_store;
pub use pinned_wire::attestation::Caller;
pub use pinned_wire::registry::Takeover;
pub use plane::{ClusterHost, Headroom, RegistrationState, DEFAULT_HEARTBEAT_INTERVAL};
pub use serve::{serve, shutdown_signal, IntoWorker, Serve, ServeError, SHUTDOWN_DRAIN_DEADLINE};
pub use state::{MissingState, State};
pub use time::Domain;
pub use worker::Worker;

/// The repository README's code blocks, compiled as doc tests so the
/// README cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

/// The error type objects return from activation and hooks. `anyhow::Error`
/// and any `std::error::Error` convert into it with `?`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
