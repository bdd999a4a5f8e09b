//! HTTP shell of the dashboard: the page, its assets, login and logout,
//! the JSON feed the page polls and the one action endpoint.
//!
//! Owns the cookie (`pinboard_dashboard`: `HttpOnly; SameSite=Strict;
//! Path=/dashboard`, no `Secure` since pinboard speaks plain HTTP: put TLS
//! in front of it outside a trusted network), the CSRF check of every POST
//! after login (header `X-Pinboard-Csrf`, which a cross-site form cannot
//! set) and the security headers of every answer (no caching, no framing,
//! scripts from this origin only).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Query, Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use percent_encoding::percent_decode_str;
use pinned_wire::registry::PushRequest;
use serde::{Deserialize, Serialize};

use crate::app::App;
use crate::operator::moves::Move;
use crate::operator::placements::{PlacementPage, PlacementQuery};
use crate::operator::sweeper_status::SweeperStatus;
use crate::operator::traffic::{NamespaceTraffic, LATENCY_BUCKETS_MS};
use crate::placement::PlacementStore;
use crate::registry::http::read_body;
use crate::registry::RegistryError;

/// The session cookie's name.
pub const COOKIE: &str = "pinboard_dashboard";
/// The header carrying the CSRF token on every POST after login.
pub const CSRF_HEADER: &str = "x-pinboard-csrf";
/// Placements the page shows per view (the search narrows them).
pub const PAGE_PLACEMENTS: usize = 200;
/// Moves the page shows.
pub const PAGE_MOVES: usize = 50;

const INDEX_HTML: &str = include_str!("assets/index.html");
const LOGIN_HTML: &str = include_str!("assets/login.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

fn secured(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    res
}

fn html(status: StatusCode, body: String) -> Response {
    secured(
        (
            status,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            body,
        )
            .into_response(),
    )
}

fn json_error(status: StatusCode, detail: &str) -> Response {
    secured((status, Json(serde_json::json!({ "detail": detail }))).into_response())
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn login_page(status: StatusCode, error: &str) -> Response {
    let error = if error.is_empty() {
        String::new()
    } else {
        format!("<p class=\"error\" role=\"alert\">{}</p>", escape(error))
    };
    html(status, LOGIN_HTML.replace("{{ERROR}}", &error))
}

/// The session id of the request's cookie, if any.
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .filter(|id| !id.is_empty())
}

/// The live session's CSRF token, if the request carries a live session.
fn session<S>(app: &App<S>, headers: &HeaderMap) -> Option<(String, String)> {
    let id = session_cookie(headers)?;
    let csrf = app.dashboard.sessions.csrf(id, Instant::now())?;
    Some((id.to_owned(), csrf))
}

/// The session of a request carrying a live session and its CSRF header;
/// else the status and reason to answer.
fn checked_post<S>(
    app: &App<S>,
    headers: &HeaderMap,
) -> Result<String, (StatusCode, &'static str)> {
    let Some((id, _)) = session(app, headers) else {
        return Err((StatusCode::UNAUTHORIZED, "log in first"));
    };
    let presented = headers
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !app
        .dashboard
        .sessions
        .check_csrf(&id, presented, Instant::now())
    {
        return Err((
            StatusCode::FORBIDDEN,
            "missing or wrong X-Pinboard-Csrf header",
        ));
    }
    Ok(id)
}

/// `GET /dashboard`: the page when logged in, else the login form.
pub async fn page<S: PlacementStore>(State(app): State<Arc<App<S>>>, req: Request) -> Response {
    match session(&app, req.headers()) {
        Some((_, csrf)) => html(StatusCode::OK, INDEX_HTML.replace("{{CSRF}}", &csrf)),
        None => login_page(StatusCode::OK, ""),
    }
}

/// `GET /dashboard/app.js`.
pub async fn script() -> Response {
    secured(
        (
            [(
                header::CONTENT_TYPE,
                "application/javascript; charset=utf-8",
            )],
            APP_JS,
        )
            .into_response(),
    )
}

/// `GET /dashboard/app.css`.
pub async fn style() -> Response {
    secured(([(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS).into_response())
}

/// The `token` field of a form body, percent-decoded.
fn form_token(body: &[u8]) -> Option<String> {
    let body = std::str::from_utf8(body).ok()?;
    body.split('&').find_map(|pair| {
        let value = pair.strip_prefix("token=")?.replace('+', " ");
        percent_decode_str(&value)
            .decode_utf8()
            .ok()
            .map(|v| v.trim().to_owned())
    })
}

/// `POST /dashboard/login` (form `token=<operator token>`): a session
/// cookie and a redirect to the page, or the form again with the reason.
pub async fn login<S: PlacementStore>(State(app): State<Arc<App<S>>>, req: Request) -> Response {
    let body = match read_body(req, app.registry_body).await {
        Ok(body) => body,
        Err(e) => return login_page(e.status(), &e.to_string()),
    };
    let Some(token) = form_token(&body).filter(|t| !t.is_empty()) else {
        return login_page(StatusCode::BAD_REQUEST, "enter the operator token");
    };
    if !app.credentials.operator.accepts(token.as_bytes()) {
        app.metrics.registry_errors.inc();
        return login_page(StatusCode::UNAUTHORIZED, "that is not the operator token");
    }
    let session = app.dashboard.sessions.login(Instant::now());
    let cookie = format!(
        "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/dashboard; Max-Age={}",
        session.id,
        super::sessions::SESSION_TTL.as_secs()
    );
    let mut res = secured(StatusCode::SEE_OTHER.into_response());
    res.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static("/dashboard"));
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    res
}

/// `POST /dashboard/logout` (CSRF header): ends the session, clears the cookie.
pub async fn logout<S: PlacementStore>(State(app): State<Arc<App<S>>>, req: Request) -> Response {
    let id = match checked_post(&app, req.headers()) {
        Ok(id) => id,
        Err((status, detail)) => return json_error(status, detail),
    };
    app.dashboard.sessions.logout(&id);
    let mut res = secured(StatusCode::NO_CONTENT.into_response());
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "pinboard_dashboard=; HttpOnly; SameSite=Strict; Path=/dashboard; Max-Age=0",
        ),
    );
    res
}

/// One worker as the page shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct WorkerView {
    #[serde(flatten)]
    row: pinned_wire::registry::WorkerRow,
    /// Milliseconds since its last renewal (lease TTL minus what is left).
    last_heartbeat_ago_ms: u64,
}

/// The feed the page polls.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct DashboardFeed {
    now_ms: u64,
    lease_ttl_ms: u64,
    workers: Vec<WorkerView>,
    placements: PlacementPage,
    moves: Vec<Move>,
    sweeper: SweeperStatus,
    traffic: Vec<NamespaceTraffic>,
    latency_buckets_ms: &'static [u64],
}

/// Query of `GET /dashboard/api/state`: the placements search.
#[derive(Debug, Default, Deserialize)]
pub struct StateQuery {
    /// Only this namespace.
    pub ns: Option<String>,
    /// Only this owner tag.
    pub tag: Option<String>,
    /// Only ids containing this.
    pub id: Option<String>,
}

fn blank_to_none(v: Option<String>) -> Option<String> {
    v.filter(|s| !s.trim().is_empty())
}

/// `GET /dashboard/api/state?ns=&tag=&id=` (session cookie).
pub async fn state<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    headers: HeaderMap,
    q: Result<Query<StateQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if session(&app, &headers).is_none() {
        return json_error(StatusCode::UNAUTHORIZED, "log in first");
    }
    let q = match q {
        Ok(Query(q)) => q,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, &e.body_text()),
    };
    let now = app.clock.now();
    let answer = async {
        let (workers, _) = app.registry.overview(None).await?;
        let live = app.store.list_workers(now).await?;
        let rows = app.store.list_placements(now).await?;
        let page = PlacementQuery {
            ns: blank_to_none(q.ns),
            tag: blank_to_none(q.tag),
            id: blank_to_none(q.id),
            owner: None,
            after: None,
            limit: Some(PAGE_PLACEMENTS),
        }
        .page(rows, &live)?;
        Ok::<_, RegistryError>((workers, page))
    }
    .await;
    let (workers, placements) = match answer {
        Ok(a) => a,
        Err(e) => return secured(e.into_response()),
    };
    let ttl = app.dashboard.lease_ttl_ms;
    let body = DashboardFeed {
        now_ms: now.wall_ms,
        lease_ttl_ms: ttl,
        workers: workers
            .workers
            .into_iter()
            .map(|row| WorkerView {
                last_heartbeat_ago_ms: ttl.saturating_sub(row.expires_in_ms),
                row,
            })
            .collect(),
        placements,
        moves: app.moves.recent(PAGE_MOVES),
        sweeper: SweeperStatus::read(app.sweeper_enabled, &app.metrics, now.wall_ms),
        traffic: app.traffic.read(),
        latency_buckets_ms: &LATENCY_BUCKETS_MS,
    };
    secured(Json(body).into_response())
}

/// `POST /dashboard/api/push` (session cookie and CSRF header): the body of
/// `/registry/push` (drain, undrain, wind_down).
pub async fn push<S: PlacementStore>(State(app): State<Arc<App<S>>>, req: Request) -> Response {
    if let Err((status, detail)) = checked_post(&app, req.headers()) {
        return json_error(status, detail);
    }
    let result = async {
        let body = read_body(req, app.registry_body).await?;
        let push: PushRequest = serde_json::from_slice(&body)
            .map_err(|e| RegistryError::Malformed(format!("malformed body: {e}")))?;
        app.registry.push(push).await
    }
    .await;
    match result {
        Ok(msg_id) => {
            app.routes.workers_changed();
            secured(Json(serde_json::json!({ "ok": true, "msgId": msg_id })).into_response())
        }
        Err(e) => {
            app.metrics.registry_errors.inc();
            secured(e.into_response())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_and_the_form_token_are_found_and_nothing_else() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; pinboard_dashboard=abc; b=2"),
        );
        assert_eq!(session_cookie(&h), Some("abc"));
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("pinboard_dashboardx=abc"),
        );
        assert_eq!(session_cookie(&h), None);
        assert_eq!(form_token(b"token=a%2Bb+c"), Some("a+b c".into()));
        assert_eq!(form_token(b"other=1"), None);
        assert_eq!(escape("<b>\"&"), "&lt;b&gt;&quot;&amp;");
    }
}
