//! Every response the worker mints itself, in the reference's shape:
//! `{"detail": ...}` JSON, `Retry-After: 1` on retryable 503s, and
//! `Pinned-Refusal` on the one refusal that asks the proxy to re-place.

use axum::body::Body;
use axum::response::Response;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, StatusCode};
use pinned_wire::headers;
use pinned_wire::refusal::{detail_body, Refusal};

const JSON: HeaderValue = HeaderValue::from_static("application/json");

/// A `{"detail": ...}` response.
pub(crate) fn detail(status: StatusCode, detail: &str) -> Response {
    let mut response = Response::new(Body::from(detail_body(detail)));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, JSON);
    response
}

/// A worker refusal with its status and headers.
pub(crate) fn refusal(refusal: Refusal) -> Response {
    let mut response = detail(refusal.status(), refusal.detail());
    if refusal.retry_after() {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    }
    if let Some(value) = refusal.pinned_refusal() {
        response
            .headers_mut()
            .insert(headers::REFUSAL, HeaderValue::from_static(value));
    }
    response
}

/// 500 `{"detail":"Internal Server Error"}`.
pub(crate) fn internal_error() -> Response {
    detail(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error")
}

/// 404 `{"detail":"Not Found"}`, the reference framework's answer.
pub(crate) fn not_found() -> Response {
    detail(StatusCode::NOT_FOUND, "Not Found")
}

/// 405 `{"detail":"Method Not Allowed"}`, the reference framework's answer.
pub(crate) fn method_not_allowed() -> Response {
    detail(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
}
