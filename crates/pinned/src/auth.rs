//! App-level authorization: what [`Object::authorize`] answers, and how a
//! refusal becomes a response, as the reference answers them.
//!
//! - a deliberate [`Denial`]: 401 (default) or 403 with `{"message": ...}`,
//!   a payload of the application's own, or a whole response of its own;
//! - anything else ([`AuthError::Failed`]): 503 `authorization failed`
//!   without `Retry-After`, counted in
//!   `pinned_request_failures_total{phase="auth"}`.
//!
//! [`Object::authorize`]: crate::Object::authorize

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{json, Value};

use crate::BoxError;

/// A deliberate refusal from [`Object::authorize`](crate::Object::authorize).
///
/// ```
/// use pinned::Denial;
/// let missing = Denial::unauthorized("missing token");          // 401 {"message": "missing token"}
/// let not_yours = Denial::forbidden("not a member");            // 403 {"message": "not a member"}
/// let custom = Denial::forbidden("x").payload(serde_json::json!({"code": "E42"}));
/// ```
#[derive(Debug)]
pub struct Denial {
    answer: Answer,
}

#[derive(Debug)]
enum Answer {
    Json { status: StatusCode, body: Value },
    Response(Box<Response>),
}

impl Denial {
    /// 401 `{"message": message}`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::json(StatusCode::UNAUTHORIZED, message.into())
    }

    /// 403 `{"message": message}`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::json(StatusCode::FORBIDDEN, message.into())
    }

    fn json(status: StatusCode, message: String) -> Self {
        Self {
            answer: Answer::Json {
                status,
                body: json!({ "message": message }),
            },
        }
    }

    /// Answers `body` (JSON) instead of `{"message": ...}`, with the same
    /// status.
    #[must_use]
    pub fn payload(self, body: Value) -> Self {
        match self.answer {
            Answer::Json { status, .. } => Self {
                answer: Answer::Json { status, body },
            },
            Answer::Response(_) => self,
        }
    }

    /// Answers `response` as it is.
    pub fn response(response: impl IntoResponse) -> Self {
        Self {
            answer: Answer::Response(Box::new(response.into_response())),
        }
    }
}

impl IntoResponse for Denial {
    fn into_response(self) -> Response {
        match self.answer {
            Answer::Json { status, body } => (status, axum::Json(body)).into_response(),
            Answer::Response(response) => *response,
        }
    }
}

/// Why [`Object::authorize`](crate::Object::authorize) refused a request.
/// `?` turns a [`Denial`] into `Denied` and any error into `Failed`.
#[derive(Debug)]
pub enum AuthError {
    /// A deliberate refusal, answered as the [`Denial`] says.
    Denied(Denial),
    /// The authorizer itself failed (a store or network error): 503
    /// `authorization failed`, no `Retry-After`.
    Failed(BoxError),
}

impl From<Denial> for AuthError {
    fn from(denial: Denial) -> Self {
        Self::Denied(denial)
    }
}

impl<E: Into<BoxError>> From<E> for AuthError {
    fn from(error: E) -> Self {
        Self::Failed(error.into())
    }
}
