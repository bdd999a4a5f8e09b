//! Fleet harness: the shared starters (`test_support`) with this package's
//! binaries (`fleet-pinboard`, the pinboard binary's entry point, and
//! `fleet-worker`) and the fleet's short heartbeats, and a worker's stats.
//!
//! The Python interpreter comes from `PINNED_PY` (default: the workspace's
//! `.venv/bin/python`); a missing interpreter fails the test.
#![allow(dead_code, unreachable_pub)]

use serde_json::Value;

// The shared harness, under this module's old names.
#[allow(unused_imports)] // not every suite uses every helper
pub use test_support::{
    client, eventually, get_json, python, unique, until, until_explained, Proc, RedisServer, TOKEN,
};

/// A unique Redis key prefix for one test.
pub fn redis_prefix(test: &str) -> String {
    format!("fleet-test:{test}:{}:", unique())
}

/// pinboard (`fleet-pinboard`) on `127.0.0.1:0`: the memory store, a 2 s
/// lease, no quarantine.
pub fn pinboard() -> test_support::Pinboard {
    test_support::Pinboard::new(env!("CARGO_BIN_EXE_fleet-pinboard"))
}

/// A Rust worker (`fleet-worker`) registering with `pinboard_url`. Its
/// heartbeat (300 ms) and lease buffer (500 ms) suit a 2 s lease.
pub fn rust_worker(pinboard_url: &str) -> test_support::RustWorker {
    test_support::RustWorker::new(env!("CARGO_BIN_EXE_fleet-worker"), pinboard_url)
        .env("FLEET_HEARTBEAT_MS", "300")
        .env("FLEET_LEASE_BUFFER_MS", "500")
}

/// A Python reference worker (pinboard's test app) registering with
/// `pinboard_url`, with the Rust worker's heartbeat and lease buffer.
pub fn python_worker(pinboard_url: &str) -> test_support::PythonWorker {
    test_support::PythonWorker::new(pinboard_url)
        .env("HEARTBEAT_S", "0.3")
        .env("LEASE_BUFFER_S", "0.5")
}

/// `GET /registry/workers` rows.
pub async fn workers(c: &reqwest::Client, pb: &str) -> Vec<Value> {
    test_support::workers(c, pb, TOKEN).await
}

/// Waits until `n` workers are registered (at most 30 s).
pub async fn wait_workers(c: &reqwest::Client, pb: &str, n: usize) -> Vec<Value> {
    test_support::wait_workers(c, pb, TOKEN, n).await
}

/// A worker's `/_pinned/stats`, authenticated with its secret.
pub async fn stats(c: &reqwest::Client, worker: &Proc) -> Value {
    c.get(format!("{}/_pinned/stats", worker.url))
        .header("pinboard-proxy-secret", worker.secret())
        .send()
        .await
        .expect("stats")
        .json()
        .await
        .expect("stats json")
}

/// The `rooms` object's `GET /seen` through `base` (a pinboard): the last
/// sequence number its current owner handled, per socket id.
#[allow(dead_code)] // not every test binary that shares this module reads it
pub async fn room_seen(c: &reqwest::Client, base: &str, room: &str) -> serde_json::Value {
    c.get(format!("{base}/rooms/{room}/seen"))
        .send()
        .await
        .expect("seen")
        .json()
        .await
        .expect("seen json")
}
