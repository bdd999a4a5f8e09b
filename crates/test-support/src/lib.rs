//! The test harness every suite of the workspace shares: polling a
//! condition with a deadline (never sleep-then-assert), the processes the
//! suites start (pinboard, Rust and Python workers, a private Redis: each
//! binds port 0 and reports its address, logs to a file of its own, and is
//! killed on drop; a private Postgres cluster, stopped and started at will,
//! with TLS from a private CA), the Python reference's interpreter, and HTTP
//! helpers for pinboard's registry and a worker's answers, and reading
//! `/metrics` scrapes (`metrics`: assert a family moved), and raw client
//! connections held idle or mid-head for edge tests (`sockets`), an
//! OTLP/HTTP trace receiver (`otlp`), and a headless browser for the
//! dashboard (`browser`).
//!
//! A dev-dependency only (`publish = false`). Each suite's own `support`
//! module adds its defaults (which binary, which environment) and what only
//! it needs. Nothing here reads a secret; it must never hold product logic.
#![forbid(unsafe_code)]

pub mod browser;
mod http;
mod logs;
pub mod metrics;
pub mod otlp;
mod poll;
mod process;
mod python;
pub mod sockets;
mod tls;

pub use self::http::{
    client, get_json, get_json_with, json, metric, metric_grows, wait_workers, workers,
};
pub use self::logs::LogLines;
pub use self::poll::{eventually, until, until_explained, PATIENCE, POLL};
pub use self::process::{
    listening_line, redis_cpu_seconds, unique, unreachable_url, Exited, Pinboard, PostgresCluster,
    Proc, PythonWorker, RedisCluster, RedisServer, RustWorker, ServerTls, Signal, NODE_TIMEOUT_MS,
    READY_PATIENCE, SHARED_REDIS,
};
pub use self::python::python;
pub use self::tls::{Issued, PrivateCa, SelfSigned};

/// The deployment token the starters give pinboard and workers unless told
/// otherwise.
pub const TOKEN: &str = "test-token";
