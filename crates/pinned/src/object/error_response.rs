//! How the library's errors answer a request: `IntoResponse` for every error
//! a handler meets ([`TrayError`], [`InstanceStoreError`], [`AlarmError`],
//! [`ClusterError`], [`TagError`]), so a handler returns
//! `Result<_, TrayError>` and uses `?`.
//!
//! Owns the choice of status and `detail` for each variant and the log line
//! of each server-side failure. Every body is the reference's
//! `{"detail": "<string>"}`; a failure on the server's side answers a
//! generic detail and logs its cause chain, so no store text, SQL or path
//! reaches a client. It must never decide policy (aborting an instance,
//! poisoning a tray): the errors arrive with that already done.
//!
//! `pinned_store::StoreError` has no impl of its own (pinned-store does not
//! depend on axum, and the orphan rule keeps the impl out of this crate):
//! it answers through the errors that wrap it, and `TrayError::from(e)` or
//! `InstanceStoreError::from(e)` turns a bare one into an answer.
//!
//! | error | status | `detail` |
//! | --- | --- | --- |
//! | store: fence lost (a newer activation owns the id; this one was aborted) | 503 | `instance aborted` (the reference's, no `Retry-After`) |
//! | store: transient (unavailable, deadline, a busy database; nothing committed) | 503 + `Retry-After: 1` | `state store unavailable; retry` |
//! | store: anything else (commit outcome unknown, corrupt row, closed, setup) | 500 | `Internal Server Error` |
//! | `TrayError::Poisoned`, `TrayError::Closed` (the instance was aborted or closed under the request) | 503 | `instance aborted` |
//! | `TrayError::NotFound` | 404 | `tray <name>/<key> does not exist` (the reference's text) |
//! | `TrayError::EmptyKey`, `TrayError::InvalidName`, `InstanceStoreError::Reserved`, `AlarmError::InvalidTime`, `AlarmError::InvalidName` | 400 | the error's text |
//! | `TrayError::Deleted`, `TrayError::NotParked`, `AlarmError::TooManySchedules` | 409 | the error's text |
//! | `ClusterError::NoSession`, `TagError::Unreachable` | 503 + `Retry-After: 1` | the error's text |
//! | `ClusterError::Transport` | 502 (504 on a timeout) | `cluster call failed` / `cluster call timed out` |
//! | every other variant (no store, undeclared tray, a row or value that does not convert, a hook that failed, a panic, a bad cluster path) | 500 | `Internal Server Error` |
//!
//! The 503s are not pinboard's retryable refusals (pinboard relays them as
//! they are): the client decides whether to send again.

use axum::response::{IntoResponse, Response};
use http::header::RETRY_AFTER;
use http::{HeaderValue, StatusCode};
use pinned_edge::logging::Chain;
use pinned_store::StoreError;
use pinned_wire::refusal::Refusal;

use crate::durable::alarm::AlarmError;
use crate::durable::store::InstanceStoreError;
use crate::durable::tray::TrayError;
use crate::namespace::context::TagError;
use crate::plane::cluster::ClusterError;
use crate::response;

/// The `detail` of a transient store failure.
pub(crate) const STORE_UNAVAILABLE: &str = "state store unavailable; retry";

/// 503 `detail` with `Retry-After: 1`: nothing happened, sending again later
/// may succeed.
fn unavailable(detail: &str) -> Response {
    let mut answer = response::detail(StatusCode::SERVICE_UNAVAILABLE, detail);
    answer
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    answer
}

/// 500 `Internal Server Error`, after logging `error` with its causes.
fn internal(error: &(dyn std::error::Error + 'static)) -> Response {
    tracing::error!(error = %Chain(error), "request failed");
    response::internal_error()
}

/// The error's own text as a client's fault or a conflict.
fn client(status: StatusCode, error: &dyn std::error::Error) -> Response {
    response::detail(status, &error.to_string())
}

/// The answer for a store failure that reached a handler.
fn store_failure(error: &StoreError) -> Response {
    if error.is_fence_lost() {
        // The store already aborted the instance (a newer activation owns
        // its rows): the request answers as the reference answers every
        // request cut short by an abort.
        tracing::warn!(error = %Chain(error), "store fence lost under a request");
        return response::refusal(Refusal::Aborted);
    }
    if error.retryable() {
        tracing::warn!(error = %Chain(error), "state store unavailable");
        return unavailable(STORE_UNAVAILABLE);
    }
    internal(error)
}

impl IntoResponse for TrayError {
    fn into_response(self) -> Response {
        match &self {
            TrayError::Store(error) => store_failure(error),
            TrayError::Poisoned(_) | TrayError::Closed => {
                tracing::warn!(error = %Chain(&self), "tray write cut short");
                response::refusal(Refusal::Aborted)
            }
            TrayError::NotFound { .. } => client(StatusCode::NOT_FOUND, &self),
            TrayError::EmptyKey
            | TrayError::InvalidName(_)
            | TrayError::AdmissionKey
            | TrayError::Recipient(_)
            | TrayError::Message(_) => client(StatusCode::BAD_REQUEST, &self),
            TrayError::OutboxFull { .. } => client(StatusCode::SERVICE_UNAVAILABLE, &self),
            TrayError::Deleted(_) | TrayError::NotParked(_) => client(StatusCode::CONFLICT, &self),
            TrayError::NoStore
            | TrayError::NotDeclared(_)
            | TrayError::Malformed { .. }
            | TrayError::Encode(_)
            | TrayError::Hook { .. }
            | TrayError::Dispatch(_)
            | TrayError::Panicked => internal(&self),
        }
    }
}

impl IntoResponse for InstanceStoreError {
    fn into_response(self) -> Response {
        match &self {
            InstanceStoreError::Store(error) => store_failure(error),
            InstanceStoreError::Reserved(_) => client(StatusCode::BAD_REQUEST, &self),
            InstanceStoreError::Decode { .. }
            | InstanceStoreError::Encode { .. }
            | InstanceStoreError::NotAnObject { .. } => internal(&self),
        }
    }
}

impl IntoResponse for AlarmError {
    fn into_response(self) -> Response {
        match &self {
            AlarmError::Store(error) => store_failure(error),
            AlarmError::InvalidTime | AlarmError::InvalidName => {
                client(StatusCode::BAD_REQUEST, &self)
            }
            AlarmError::TooManySchedules => client(StatusCode::CONFLICT, &self),
            AlarmError::NoStore => internal(&self),
        }
    }
}

impl IntoResponse for ClusterError {
    fn into_response(self) -> Response {
        match &self {
            ClusterError::NoSession => {
                tracing::warn!(error = %self, "cluster call without a pinboard session");
                unavailable(&self.to_string())
            }
            ClusterError::Transport(error) => {
                tracing::warn!(error = %Chain(&self), "cluster call failed");
                if error.is_timeout() {
                    response::detail(StatusCode::GATEWAY_TIMEOUT, "cluster call timed out")
                } else {
                    response::detail(StatusCode::BAD_GATEWAY, "cluster call failed")
                }
            }
            ClusterError::TooDeep { .. }
            | ClusterError::BadPath(_)
            | ClusterError::UnknownTarget(_)
            | ClusterError::WorkerGone
            | ClusterError::Request(_) => internal(&self),
        }
    }
}

impl IntoResponse for TagError {
    fn into_response(self) -> Response {
        match &self {
            TagError::Unreachable => {
                tracing::warn!(error = %self, "tag not accepted");
                unavailable(&self.to_string())
            }
            TagError::NotAdmitted => internal(&self),
        }
    }
}
