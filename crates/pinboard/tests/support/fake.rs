//! A worker that answers every instance request one fixed way (a [`Mode`]),
//! for tests that need to know a worker's secret or make it refuse on
//! purpose: the scripted worker of [`raw`](super::raw) playing one answer.
//! The test registers it itself (no heartbeats, so use a long lease, or
//! [`beat`]).

use std::sync::Arc;

use serde_json::json;

use super::raw::{raw_worker, Answer, Raw};
use super::registration::Identity;

/// How a fake worker answers instance requests.
#[derive(Clone, Copy)]
pub enum Mode {
    /// 200 `{"worker": name}`.
    Serve,
    /// 503 `host draining; retry` (never activates anything).
    Draining,
    /// 503 with `Pinned-Refusal: lease-unhealthy`.
    Unhealthy,
    /// 403 `invalid attestation`.
    Forbidden,
    /// 503 `instance capacity reached; retry` (every instance busy).
    Full,
}

impl Mode {
    /// What a worker named `name` answers in this mode.
    fn answer(self, name: &str) -> Answer {
        let refusal = |detail: &str, extra: Vec<(&'static str, &'static str)>| {
            let mut headers = vec![("retry-after", "1")];
            headers.extend(extra);
            Answer::JsonWith(503, headers, json!({ "detail": detail }))
        };
        match self {
            Mode::Serve => Answer::Json(200, json!({ "worker": name })),
            Mode::Draining => refusal("host draining; retry", Vec::new()),
            Mode::Full => refusal("instance capacity reached; retry", Vec::new()),
            Mode::Unhealthy => refusal(
                "lease unhealthy; refusing new activations",
                vec![("pinned-refusal", "lease-unhealthy")],
            ),
            Mode::Forbidden => Answer::Json(403, json!({"detail": "invalid attestation"})),
        }
    }
}

/// Start a fake worker hosting `/counter` as `name` and register it;
/// returns it with its session id. Every request it takes counts in
/// `hits` and is kept in `seen`.
pub async fn fake(pb: &str, name: &'static str, mode: Mode) -> (Arc<Raw>, String) {
    raw_worker(pb, name, move |_, _| mode.answer(name)).await
}

/// One heartbeat for a fake worker registered as `name` (it answers the
/// same challenge pair every time); returns the status.
pub async fn beat(pb: &str, name: &str, session: &str) -> u16 {
    Identity::named(name).beat(pb, session).await
}
