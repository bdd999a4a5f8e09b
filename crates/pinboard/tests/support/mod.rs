//! pinboard's suites' harness: the shared starters (`test_support`) with
//! this package's `pinboard` binary and its defaults, and what only these
//! suites need: raw sockets, the scripted fake worker (and its fixed-answer
//! form), the durable fake, their registration, and Redis helpers.
//!
//! The Python interpreter comes from `PINNED_PY` (default: the workspace's
//! `.venv/bin/python`); a missing interpreter fails the test, it never skips.
#![allow(dead_code, unreachable_pub)]

pub mod durable;
pub mod fake;
pub mod raw;
pub mod registration;

use std::time::Duration;

use serde_json::Value;

// The shared harness, under this module's old names.
#[allow(unused_imports)] // not every suite uses every helper
pub use test_support::{
    eventually, get_json, python, unique, unreachable_url, Proc, RedisServer, Signal, TOKEN,
};

/// A worker record for store-level suites: session `sid` (client
/// `client-<sid>`, secret `s`) at an address nothing listens on, hosting
/// `ns` with headroom 1.
pub fn record(sid: &str, ns: &str) -> pinboard::placement::WorkerRecord {
    pinboard::placement::WorkerRecord {
        session_id: sid.into(),
        client_id: format!("client-{sid}"),
        secret: "s".into(),
        advertise_url: "http://127.0.0.1:9".into(),
        namespaces: vec![ns.into()],
        headroom: 1,
        ..Default::default()
    }
}

/// A fixed moment for store-level suites (wall clock in 2027, monotonic 0).
pub fn fixed_now() -> pinboard::clock::Now {
    pinboard::clock::Now {
        wall_ms: 1_800_000_000_000,
        mono_ms: 0,
    }
}

/// Lease TTL used by the suites (ms): the starter's default.
pub const LEASE_TTL_MS: u64 = test_support::Pinboard::LEASE_TTL_MS;

/// This package's `pinboard` on `127.0.0.1:0`: the memory store, a 2 s
/// lease, no quarantine, pinboard's debug log.
pub fn pinboard() -> test_support::Pinboard {
    test_support::Pinboard::new(env!("CARGO_BIN_EXE_pinboard"))
        .env("RUST_LOG", "pinboard=debug,info")
}

/// A Python reference worker (uvicorn + `tests/py/app.py`) registering
/// with `pinboard_url`.
pub fn python_worker(pinboard_url: &str) -> test_support::PythonWorker {
    test_support::PythonWorker::new(pinboard_url)
}

/// The value of the metric `name` (a counter's `_total` line, or a gauge)
/// on `pb`'s `GET /metrics`.
///
/// # Panics
///
/// When pinboard does not expose it (unlike `test_support::metric`, which
/// answers 0).
pub async fn metric(c: &reqwest::Client, pb: &Proc, name: &str) -> u64 {
    let scrape = test_support::metrics::scrape(c, &pb.url).await;
    let value = scrape.sample(name);
    value.unwrap_or_else(|| panic!("no metric {name} in {scrape}")) as u64
}

/// A plain HTTP client (no system proxy).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

/// `Authorization: Bearer <TOKEN>`.
pub fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

/// `GET /registry/workers` rows.
pub async fn workers(c: &reqwest::Client, pb: &str) -> Vec<Value> {
    test_support::workers(c, pb, TOKEN).await
}

/// Wait until `n` workers are registered; returns their rows.
pub async fn wait_workers(c: &reqwest::Client, pb: &str, n: usize) -> Vec<Value> {
    test_support::wait_workers(c, pb, TOKEN, n).await
}

/// GET `pb<path>` as JSON, retrying 503s for up to `patience`.
/// Hits `/counter/<prefix><i>/hit` through pinboard for `i` in `0..tries`
/// until one lands on the worker whose process token is `process`; answers
/// that id and its first answer.
pub async fn id_on(
    c: &reqwest::Client,
    pinboard: &str,
    process: &Value,
    prefix: &str,
    tries: usize,
) -> Option<(String, Value)> {
    for i in 0..tries {
        let id = format!("{prefix}{i}");
        let answer = get_json(
            c,
            &format!("{pinboard}/counter/{id}/hit"),
            Duration::from_secs(10),
        )
        .await;
        if answer["process"] == *process {
            return Some((id, answer));
        }
    }
    None
}

/// A unique Redis key prefix for one test.
pub fn redis_prefix(test: &str) -> String {
    format!("pinboard-test:{test}:{}:", unique())
}

/// Delete every Redis key under `prefix` (a store that lost its data).
pub async fn redis_wipe(prefix: &str) {
    let client = redis::Client::open(test_support::SHARED_REDIS).expect("redis url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connect");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .expect("keys");
    if !keys.is_empty() {
        let _: i64 = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut conn)
            .await
            .expect("del");
    }
}
