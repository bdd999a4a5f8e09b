//! Every way a registry call fails, each mapped once to its status and body.
//!
//! Owns the error → HTTP mapping for `/registry/*`; never logs except for
//! store failures (the only unexpected kind).

use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use pinned_wire::registry::HeartbeatNack;

use crate::challenge::ChallengeError;
use crate::placement::StoreError;

/// A failed registry call.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Missing or wrong bearer token. 401.
    #[error("invalid token")]
    Unauthorized,
    /// The body is not what the endpoint takes. 400 with the reason.
    #[error("{0}")]
    Malformed(String),
    /// The body is larger than `--max-registry-body-bytes`. 413, with
    /// `Connection: close` unless the rest of the body was read (`drained`).
    #[error("request body exceeds {limit} bytes")]
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
        /// Whether the whole body was read (the connection can be reused).
        drained: bool,
    },
    /// The body did not arrive within `--body-timeout-ms`. 408.
    #[error("request body not received in time")]
    BodyTimeout,
    /// The advertise URL could not be reached yet. 503 + `Retry-After: 1` (retryable).
    #[error("{0}")]
    ChallengeUnreachable(ChallengeError),
    /// The advertise URL answered the challenge wrongly. 403.
    #[error("{0}")]
    ChallengeFailed(ChallengeError),
    /// Unknown or lapsed session. 409 `{"reregister": true}`.
    #[error("unknown session")]
    Reregister,
    /// The session was displaced by a newer deployment of its hostname.
    /// 409 `{"superseded": true, "error": …}`.
    #[error("{0}")]
    Superseded(String),
    /// A registration refused because its hostname is held (`takeover: deny`
    /// or an older deployment epoch). 409 `{"error": …}`.
    #[error("{0}")]
    HostnameHeld(String),
    /// Operator call for a session that is not live. 404.
    #[error("unknown session")]
    UnknownSession,
    /// The placement store failed. 503 + `Retry-After: 1` (retryable).
    #[error("placement store unavailable: {0}")]
    Store(#[from] StoreError),
    /// Other registrations kept changing the deployment bindings while
    /// this one was decided. 503 + `Retry-After: 1` (retryable).
    #[error("deployment bindings changed during registration; retry")]
    Contended,
}

impl RegistryError {
    /// HTTP status of this failure.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Malformed(_) => StatusCode::BAD_REQUEST,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::ChallengeUnreachable(_) | Self::Store(_) | Self::Contended => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::ChallengeFailed(_) => StatusCode::FORBIDDEN,
            Self::Reregister | Self::Superseded(_) | Self::HostnameHeld(_) => StatusCode::CONFLICT,
            Self::UnknownSession => StatusCode::NOT_FOUND,
        }
    }

    /// JSON body of this failure.
    pub fn body(&self) -> serde_json::Value {
        match self {
            Self::Reregister => serde_json::to_value(HeartbeatNack {
                reregister: true,
                superseded: false,
                error: None,
            }),
            Self::Superseded(e) => serde_json::to_value(HeartbeatNack {
                reregister: false,
                superseded: true,
                error: Some(e.clone()),
            }),
            Self::HostnameHeld(e) => Ok(serde_json::json!({ "error": e, "detail": e })),
            other => Ok(serde_json::json!({ "detail": other.to_string() })),
        }
        .unwrap_or_default()
    }
}

impl IntoResponse for RegistryError {
    fn into_response(self) -> Response {
        if let Self::Store(e) = &self {
            // Every registry call fails while the store is down: once with
            // its cause, then with a count (see `repeats`).
            let cause = pinned_edge::logging::Chain(e);
            if let Some(seen) =
                pinned_edge::logging::repeats().failed("pinboard registry", "store", cause)
            {
                tracing::warn!(target: "pinboard::registry", error = %seen, failures = seen.failures, "placement store failed");
            }
        }
        let retry = matches!(
            self,
            Self::ChallengeUnreachable(_) | Self::Store(_) | Self::Contended
        );
        // The unread rest of the body cannot be told from a next request.
        let close = matches!(
            self,
            Self::BodyTooLarge { drained: false, .. } | Self::BodyTimeout
        );
        let mut res = (self.status(), axum::Json(self.body())).into_response();
        if retry {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if close {
            res.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        res
    }
}
