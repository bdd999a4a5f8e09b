//! The test harness every suite of the workspace shares: polling a
//! condition with a deadline (never sleep-then-assert), the Python
//! reference's interpreter, a loopback port, and HTTP helpers for pinboard's
//! registry and a worker's answers.
//!
//! A dev-dependency only (`publish = false`). Each suite's own `support`
//! module re-exports what it uses from here under its old names, so tests
//! written against those modules keep compiling. Nothing here starts a
//! service or reads a secret; it must never hold product logic.
#![forbid(unsafe_code)]

mod http;
mod poll;
mod python;
mod tls;

pub use self::http::{
    client, get_json, get_json_with, json, metric, metric_grows, wait_workers, workers,
};
pub use self::poll::{eventually, until, until_explained, POLL};
pub use self::python::{free_port, python};
pub use self::tls::SelfSigned;
