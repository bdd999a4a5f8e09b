//! How the library's errors answer a request: `IntoResponse` for every error
//! a handler meets ([`TrayError`], [`InstanceStoreError`], [`AlarmError`],
//! [`ClusterError`], [`TagError`]), so a handler returns
//! `Result<_, TrayError>` and uses `?`.
//!
//! Owns the choice of status and `detail` for each variant and the log line
//! of each server-side failure. The line is not written here, where the
//! instance is unknown (its span is DEBUG: at `info` there is none): the
//! answer carries it as a [`Failure`] in its extensions, and the request
//! stack writes it with the instance's `namespace` and `id` fields
//! ([`log_failure`]); an answer that succeeds carries nothing. Every body is the reference's
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

use std::fmt::Display;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use http::header::RETRY_AFTER;
use http::{HeaderValue, StatusCode};
use pinned_edge::logging::Chain;
use pinned_store::StoreError;
use pinned_wire::refusal::Refusal;
use tracing::Level;

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

/// A server-side failure met while a request's answer was built, carried
/// in the answer's extensions (an extension must be `Clone`: the clones
/// share one line) until the request stack writes it with its instance
/// ([`log_failure`]). A line the stack never took (a router served on its
/// own, an answer a handler built and then dropped) is written when the
/// last clone is dropped, without the instance: never lost.
#[derive(Clone)]
pub(crate) struct Failure(Arc<Line>);

/// The line of a [`Failure`].
struct Line {
    level: Level,
    message: &'static str,
    /// The error's text (its cause chain): the error itself went with the
    /// answer's making.
    error: String,
    /// Written already (by [`log_failure`]).
    logged: AtomicBool,
}

impl Line {
    /// Writes the line, with `instance`'s namespace and id when known.
    /// The target stays this module's, where the lines were written before.
    fn write(&self, instance: Option<(&dyn Display, &dyn Display)>) {
        let (error, message) = (&self.error, self.message);
        // `tracing`'s macros take their level as a constant.
        macro_rules! line {
            ($event:ident) => {
                match instance {
                    Some((ns, id)) => {
                        tracing::$event!(namespace = %ns, id = %id, %error, "{message}")
                    }
                    None => tracing::$event!(%error, "{message}"),
                }
            };
        }
        match self.level {
            Level::ERROR => line!(error),
            _ => line!(warn),
        }
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if !*self.logged.get_mut() {
            self.write(None);
        }
    }
}

/// `answer`, carrying the line `message` at `level` about `error` for the
/// request stack to write (see [`Failure`]).
pub(crate) fn with_failure(
    mut answer: Response,
    level: Level,
    message: &'static str,
    error: impl Display,
) -> Response {
    let line = Line {
        level,
        message,
        error: error.to_string(),
        logged: AtomicBool::new(false),
    };
    answer.extensions_mut().insert(Failure(Arc::new(line)));
    answer
}

/// Writes the [`Failure`] `answer` carries, if any, naming instance `id`
/// of namespace `ns`, and takes it out of the answer. The request stack
/// calls it for a 5xx answer only (every failure answers one): a
/// successful request does nothing more than compare its status.
pub(crate) fn log_failure(answer: &mut Response, ns: &dyn Display, id: &dyn Display) {
    if let Some(Failure(line)) = answer.extensions_mut().remove::<Failure>() {
        if !line.logged.swap(true, Ordering::Relaxed) {
            line.write(Some((ns, id)));
        }
    }
}

/// 500 `Internal Server Error`, carrying `error` with its causes as
/// `request failed`.
fn internal(error: &(dyn std::error::Error + 'static)) -> Response {
    with_failure(
        response::internal_error(),
        Level::ERROR,
        "request failed",
        Chain(error),
    )
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
        return with_failure(
            response::refusal(Refusal::Aborted),
            Level::WARN,
            "store fence lost under a request",
            Chain(error),
        );
    }
    if error.retryable() {
        return with_failure(
            unavailable(STORE_UNAVAILABLE),
            Level::WARN,
            "state store unavailable",
            Chain(error),
        );
    }
    internal(error)
}

impl IntoResponse for TrayError {
    fn into_response(self) -> Response {
        match &self {
            TrayError::Store(error) => store_failure(error),
            TrayError::Poisoned(_) | TrayError::Closed => with_failure(
                response::refusal(Refusal::Aborted),
                Level::WARN,
                "tray write cut short",
                Chain(&self),
            ),
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
            ClusterError::NoSession => with_failure(
                unavailable(&self.to_string()),
                Level::WARN,
                "cluster call without a pinboard session",
                &self,
            ),
            ClusterError::Transport(error) => {
                let answer = if error.is_timeout() {
                    response::detail(StatusCode::GATEWAY_TIMEOUT, "cluster call timed out")
                } else {
                    response::detail(StatusCode::BAD_GATEWAY, "cluster call failed")
                };
                with_failure(answer, Level::WARN, "cluster call failed", Chain(&self))
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
            TagError::Unreachable => with_failure(
                unavailable(&self.to_string()),
                Level::WARN,
                "tag not accepted",
                &self,
            ),
            TagError::NotAdmitted => internal(&self),
        }
    }
}

#[cfg(test)]
mod tests {
    use test_support::LogLines;

    use super::*;

    /// The lines `run` writes at `info` and above.
    fn written(run: impl FnOnce()) -> Vec<String> {
        LogLines::during(Level::INFO, run)
    }

    /// A call refused for its depth is one ERROR line, written by the
    /// answer, naming the calling instance and the limit.
    #[test]
    fn a_call_refused_for_its_depth_answers_500_with_one_line() {
        let lines = written(|| {
            let mut answer = ClusterError::TooDeep {
                path: "/desks/b/x".into(),
                max: 50,
            }
            .into_response();
            assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR);
            log_failure(&mut answer, &"/desks", &"a");
        });
        assert_eq!(lines.len(), 1, "{lines:#?}");
        assert!(
            lines[0].contains(" ERROR ")
                && lines[0].contains("request failed namespace=/desks id=a")
                && lines[0].contains("exceeds subrequest depth 50"),
            "{lines:#?}"
        );
    }

    /// The stack writes a failure once, naming the instance, and takes it
    /// out of the answer; one it never saw is written when dropped, without
    /// the instance, never lost.
    #[test]
    fn a_failure_is_written_once_by_the_stack_or_when_dropped() {
        let lines = written(|| {
            let mut answer = TagError::Unreachable.into_response();
            log_failure(&mut answer, &"/desks", &"a");
            assert!(answer.extensions().get::<Failure>().is_none());
            log_failure(&mut answer, &"/desks", &"a");
            drop(answer);
            drop(TagError::Unreachable.into_response());
        });
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(
            lines[0].contains(" WARN ")
                && lines[0].contains("tag not accepted namespace=/desks id=a error="),
            "{lines:#?}"
        );
        assert!(
            lines[1].contains("tag not accepted error=") && !lines[1].contains("namespace="),
            "{lines:#?}"
        );
    }
}
