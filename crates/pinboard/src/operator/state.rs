//! The storage inspector through pinboard: a namespace's ids with durable
//! state, one id's rows decoded, and the per-key controls (unpark, skip,
//! pause, resume, delete), each answered by a worker's
//! `/_pinned/state/…` routes (authenticated with the worker's secret, as
//! only pinboard holds it), and the audit list of every control asked for.
//!
//! Views go to any live worker hosting the namespace (they share the
//! store, and the worker reads without moving any epoch); a worker that
//! has no such route (a Python reference worker answers 404 `Not Found`)
//! is passed over. A control goes to the id's owner at its placement
//! epoch: the id is resolved like a proxied request, placed first when it
//! has no live owner (recorded in moves as made `by` the operator), and
//! the owner acts as owner. An owner without the route is refused with
//! 409: its ids can be inspected, not acted on.
//!
//! Records every control in the audit ring ([`super::audit`]) and never
//! writes a row itself.

use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{header, HeaderValue, Method, Request, StatusCode, Version};
use http_body_util::{BodyExt, Limited};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use pinned_wire::headers::{EPOCH, PROXY_SECRET};
use serde::Deserialize;
use serde_json::{json, Value};

pub use super::audit::{AuditEntry, StateAudit, AUDIT_CAPACITY, DEFAULT_AUDIT_LIMIT};
use crate::app::App;
use crate::operator::moves::MovedBy;
use crate::placement::PlacementStore;
use crate::routes::Avoid;
use crate::upstream::worker::WorkerConn;
use crate::world::Scope;

/// Longest a call to a worker's state route may take.
pub const STATE_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest worker answer relayed (a `show` of an id with many rows).
pub const MAX_STATE_ANSWER_BYTES: usize = 4 * 1024 * 1024;
/// Longest `by` (who asked) kept.
pub const MAX_BY_CHARS: usize = 64;

/// The answer of a state call: a status and a JSON body (`detail` on
/// errors), relayed as they are.
pub type Answer = (StatusCode, Value);

fn detail(status: StatusCode, text: impl Into<String>) -> Answer {
    (status, json!({ "detail": text.into() }))
}

/// A control, as `POST /registry/state/act` takes it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ActRequest {
    /// The namespace, with its slash.
    pub ns: String,
    /// The instance id.
    pub id: String,
    /// `unpark`, `skip`, `pause`, `resume` or `delete`.
    pub action: String,
    /// The tray (for `unpark` and `skip`).
    #[serde(default)]
    pub tray: Option<String>,
    /// The tray's key (`~`, a singleton tray's, when absent).
    #[serde(default)]
    pub key: Option<String>,
    /// Who asks, for the audit list (at most [`MAX_BY_CHARS`]); `operator`
    /// when absent.
    #[serde(default)]
    pub by: Option<String>,
}

fn encode(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", utf8_percent_encode(v, NON_ALPHANUMERIC)))
        .collect::<Vec<_>>()
        .join("&")
}

/// `GET|POST <worker>/_pinned/state/<op>?<query>` with the worker's
/// secret (and `epoch` as `Pinboard-Epoch`).
async fn call<S>(
    app: &App<S>,
    worker: &WorkerConn,
    method: Method,
    op: &str,
    query: &str,
    epoch: Option<&HeaderValue>,
) -> Result<Answer, String> {
    let path = PathAndQuery::try_from(format!("/_pinned/state/{op}?{query}"))
        .map_err(|e| format!("bad request path: {e}"))?;
    let uri = worker
        .absolute_uri(&path)
        .map_err(|e| format!("bad worker URL: {e}"))?;
    let secret = HeaderValue::from_str(&worker.record.secret)
        .map_err(|_| "the worker's secret is not a header value".to_owned())?;
    let mut builder = Request::builder()
        .method(method)
        .uri(uri)
        .version(Version::HTTP_11)
        .header(header::HOST, worker.host.clone())
        .header(header::CONTENT_LENGTH, HeaderValue::from_static("0"))
        .header(PROXY_SECRET, secret);
    if let Some(epoch) = epoch {
        builder = builder.header(EPOCH, epoch.clone());
    }
    let request = builder
        .body(crate::upstream::empty())
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let res = app
            .outbound
            .call(&worker.record.advertise_url, request)
            .await
            .map_err(|e| format!("worker unreachable: {e}"))?;
        let status = res.status();
        let body: Bytes = Limited::new(res.into_body(), MAX_STATE_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the worker's answer failed: {e}"))?
            .to_bytes();
        let value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        Ok::<_, String>((status, value))
    };
    tokio::time::timeout(STATE_CALL_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("the worker did not answer within {STATE_CALL_TIMEOUT:?}"))?
}

/// Whether an answer says the worker has no state routes: the Python
/// reference answers unknown `/_pinned` paths 404 `Not Found`.
fn lacks_state_routes(answer: &Answer) -> bool {
    answer.0 == StatusCode::NOT_FOUND && answer.1["detail"] == json!("Not Found")
}

/// A view (`ids` or `show`) of namespace `ns`, with `query` (which names
/// `ns` too), from the first live worker hosting it that has the route.
pub async fn view<S: PlacementStore>(
    app: &App<S>,
    op: &str,
    ns: &str,
    query: &[(&str, &str)],
) -> Answer {
    let now = app.clock.now();
    let workers = match app.store.list_workers(now).await {
        Ok(workers) => workers,
        Err(e) => {
            return detail(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("placement store unavailable: {e}"),
            )
        }
    };
    let mut hosting: Vec<_> = workers
        .into_iter()
        .filter(|w| w.record.namespaces.iter().any(|n| n == ns))
        .collect();
    if hosting.is_empty() {
        return detail(
            StatusCode::NOT_FOUND,
            format!("unknown namespace {ns:?}: no live worker hosts it"),
        );
    }
    // Workers taking new ids first: a draining one may be on its way out.
    hosting.sort_by_key(|w| w.record.refuses_new_ids());
    let query = encode(query);
    let mut last_error = None;
    for live in hosting {
        let Ok(Some(worker)) = app.routes.worker(&live.record.session_id).await else {
            continue;
        };
        match call(app, &worker, Method::GET, op, &query, None).await {
            Ok(answer) if lacks_state_routes(&answer) => continue,
            Ok(answer) => return answer,
            Err(error) => last_error = Some(error),
        }
    }
    match last_error {
        Some(error) => detail(StatusCode::BAD_GATEWAY, error),
        None => detail(
            StatusCode::CONFLICT,
            format!("every worker hosting {ns} lacks the state routes (Python reference workers): nothing can read its rows"),
        ),
    }
}

/// One id's rows decoded, with its current placement (`owner`, `epoch`,
/// `live`) when it has one.
pub async fn show<S: PlacementStore>(app: &App<S>, ns: &str, id: &str) -> Answer {
    let (status, mut body) = view(app, "show", ns, &[("ns", ns), ("id", id)]).await;
    if status.is_success() {
        let placement = app
            .store
            .placement(crate::placement::InstanceKey::new(ns, id), app.clock.now())
            .await
            .ok()
            .flatten();
        body["placement"] = match placement {
            Some(entry) => json!({
                "owner": entry.placement.session_id,
                "epoch": entry.placement.epoch,
                "live": entry.live,
            }),
            None => Value::Null,
        };
    }
    (status, body)
}

/// Runs control `request` through the id's owner (placing it first when
/// it has none) and records it in the audit list.
pub async fn act<S: PlacementStore>(app: &App<S>, request: ActRequest) -> Answer {
    let by: String = request
        .by
        .clone()
        .filter(|by| !by.is_empty())
        .unwrap_or_else(|| "operator".to_owned())
        .chars()
        .take(MAX_BY_CHARS)
        .collect();
    let mut entry = AuditEntry {
        at_ms: 0,
        ns: request.ns.clone(),
        id: request.id.clone(),
        action: request.action.clone(),
        tray: request
            .tray
            .as_ref()
            .map(|tray| format!("{tray}/{}", request.key.as_deref().unwrap_or("~"))),
        by: by.clone(),
        owner: None,
        epoch: None,
        status: 0,
        detail: None,
    };
    let answer = act_at_owner(app, &request, &by, &mut entry).await;
    entry.at_ms = app.clock.now().wall_ms;
    entry.status = answer.0.as_u16();
    if !answer.0.is_success() {
        entry.detail = answer.1["detail"].as_str().map(str::to_owned);
    }
    tracing::info!(target: "pinboard::operator", ns = %entry.ns, id = %entry.id, action = %entry.action, by = %entry.by, owner = ?entry.owner, status = entry.status, "operator state action");
    app.state_audit.record(entry);
    answer
}

async fn act_at_owner<S: PlacementStore>(
    app: &App<S>,
    request: &ActRequest,
    by: &str,
    entry: &mut AuditEntry,
) -> Answer {
    let (ns, id) = (request.ns.as_str(), request.id.as_str());
    if let Err(invalid) = pinned_wire::ids::validate_namespace(ns) {
        return detail(StatusCode::BAD_REQUEST, format!("malformed ns: {invalid}"));
    }
    if let Err(invalid) = pinned_wire::ids::validate_id(id) {
        return detail(
            StatusCode::BAD_REQUEST,
            format!("malformed id: {}", invalid.detail()),
        );
    }
    const ACTIONS: [&str; 5] = ["unpark", "skip", "pause", "resume", "delete"];
    if !ACTIONS.contains(&request.action.as_str()) {
        return detail(
            StatusCode::BAD_REQUEST,
            format!(
                "unknown action {:?}: one of {}",
                request.action,
                ACTIONS.join(", ")
            ),
        );
    }
    let key = format!("{ns}/{id}");
    let route = match app
        .routes
        .resolve_as(
            MovedBy::Operator,
            &key,
            ns,
            id,
            Scope::Any,
            Avoid::default(),
        )
        .await
    {
        Ok(route) => route,
        Err(crate::routes::ResolveError::NoWorker) => {
            return detail(
                StatusCode::NOT_FOUND,
                format!("unknown namespace {ns:?}: no live worker hosts it"),
            )
        }
        Err(error) => return detail(StatusCode::SERVICE_UNAVAILABLE, error.to_string()),
    };
    entry.owner = Some(route.worker.record.session_id.clone());
    entry.epoch = Some(route.epoch);
    let mut query = vec![
        ("ns", ns),
        ("id", id),
        ("action", request.action.as_str()),
        ("by", by),
    ];
    if let Some(tray) = &request.tray {
        query.push(("tray", tray));
    }
    if let Some(key) = &request.key {
        query.push(("key", key));
    }
    match call(
        app,
        &route.worker,
        Method::POST,
        "act",
        &encode(&query),
        Some(&route.epoch_header),
    )
    .await
    {
        Ok(answer) if lacks_state_routes(&answer) => detail(
            StatusCode::CONFLICT,
            format!(
                "the owner of {key} (session {}) has no state routes (a Python reference worker): its ids can be inspected, not acted on",
                route.worker.record.session_id
            ),
        ),
        Ok(answer) => answer,
        Err(error) => {
            app.routes.lose_sight(&key, &route.worker.record.session_id);
            detail(StatusCode::BAD_GATEWAY, error)
        }
    }
}
