//! HTTP shell of the dashboard: the page, its assets, login and logout,
//! the JSON feed the page polls and the one action endpoint.
//!
//! Owns the cookie (`pinboard_dashboard`: `HttpOnly; SameSite=Strict;
//! Path=/dashboard`, plus `Secure` when pinboard serves TLS itself or
//! `--dashboard-secure-cookie` says a TLS front door does: a browser then
//! never sends it in clear text), the failed-login limit at the login (its
//! 429 comes before the body is read or the token compared), the CSRF
//! check of every POST after login (header `X-Pinboard-Csrf`, which a
//! cross-site form cannot set) and the security headers of every answer
//! (no caching, no framing, scripts from this origin only).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Query, Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use percent_encoding::percent_decode_str;
use pinned_wire::registry::PushRequest;
use serde::{Deserialize, Serialize};

use crate::app::App;
use crate::operator::http::{state_ids_answer, StateIdsQuery, StateShowQuery};
use crate::operator::moves::Move;
use crate::operator::placements::{PlacementPage, PlacementQuery};
use crate::operator::state::ActRequest;
use crate::operator::sweeper_status::SweeperStatus;
use crate::operator::traffic::{NamespaceTraffic, LATENCY_BUCKETS_MS};
use crate::placement::PlacementStore;
use crate::registry::http::{apply_push, read_body};
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

/// The `detail` of a login refused by the failed-login limit.
pub const LIMITED_DETAIL: &str = "too many failed logins from this address; try again later";

/// The session cookie's `Set-Cookie` value: `value` for `max_age` seconds
/// (0 clears it), `Secure` as configured.
fn cookie(value: &str, max_age: u64, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/dashboard; Max-Age={max_age}{secure}"
    )
}

/// The client address the failed-login limit counts: the connection's
/// peer (never a forwarding header, which the client writes). A request
/// without one (a router driven in-process) shares one unspecified address.
fn client_ip(req: &Request) -> IpAddr {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |ConnectInfo(a)| a.ip())
}

/// 429 for a limited login: `Retry-After` (whole seconds, rounded up) and
/// the reason, as the form again for a browser, else as JSON `detail`.
fn limited(headers: &HeaderMap, wait: Duration) -> Response {
    let browser = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/html"));
    let mut res = if browser {
        login_page(StatusCode::TOO_MANY_REQUESTS, LIMITED_DETAIL)
    } else {
        json_error(StatusCode::TOO_MANY_REQUESTS, LIMITED_DETAIL)
    };
    let secs = wait.as_millis().div_ceil(1000).max(1);
    if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
        res.headers_mut().insert(header::RETRY_AFTER, v);
    }
    res
}

/// `POST /dashboard/login` (form `token=<operator token>`): a session
/// cookie and a redirect to the page, or the form again with the reason;
/// 429 once the client's address used up its failures (see
/// [`login_limit`](super::login_limit)).
pub async fn login<S: PlacementStore>(State(app): State<Arc<App<S>>>, req: Request) -> Response {
    let ip = client_ip(&req);
    let limit = &app.dashboard.login_limit;
    if let Err(wait) = limit.check(ip, Instant::now()) {
        app.metrics.dashboard_logins_limited.inc();
        return limited(req.headers(), wait);
    }
    let body = match read_body(req, app.registry_body).await {
        Ok(body) => body,
        Err(e) => return login_page(e.status(), &e.to_string()),
    };
    let Some(token) = form_token(&body).filter(|t| !t.is_empty()) else {
        return login_page(StatusCode::BAD_REQUEST, "enter the operator token");
    };
    if !app.credentials.operator.accepts(token.as_bytes()) {
        app.metrics.registry_errors.inc();
        limit.failed(ip, Instant::now());
        return login_page(StatusCode::UNAUTHORIZED, "that is not the operator token");
    }
    limit.succeeded(ip);
    let session = app.dashboard.sessions.login(Instant::now());
    let cookie = cookie(
        &session.id,
        super::sessions::SESSION_TTL.as_secs(),
        app.dashboard.secure_cookie,
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
    if let Ok(v) = HeaderValue::from_str(&cookie("", 0, app.dashboard.secure_cookie)) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
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
        apply_push(&app, push).await
    }
    .await;
    match result {
        Ok(msg_id) => {
            secured(Json(serde_json::json!({ "ok": true, "msgId": msg_id })).into_response())
        }
        Err(e) => {
            app.metrics.registry_errors.inc();
            secured(e.into_response())
        }
    }
}

/// `GET /dashboard/api/inspect/ids?ns=&filter=&after=&limit=` (session):
/// as `GET /registry/state/ids`.
pub async fn inspect_ids<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    headers: HeaderMap,
    q: Result<Query<StateIdsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if session(&app, &headers).is_none() {
        return json_error(StatusCode::UNAUTHORIZED, "log in first");
    }
    match q {
        Ok(Query(q)) => {
            let (status, body) = state_ids_answer(&app, &q).await;
            secured((status, Json(body)).into_response())
        }
        Err(e) => json_error(StatusCode::BAD_REQUEST, &e.body_text()),
    }
}

/// `GET /dashboard/api/inspect/show?ns=&id=` (session): as
/// `GET /registry/state/show`.
pub async fn inspect_show<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    headers: HeaderMap,
    q: Result<Query<StateShowQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if session(&app, &headers).is_none() {
        return json_error(StatusCode::UNAUTHORIZED, "log in first");
    }
    match q {
        Ok(Query(q)) => {
            let (status, body) = crate::operator::state::show(&app, &q.ns, &q.id).await;
            secured((status, Json(body)).into_response())
        }
        Err(e) => json_error(StatusCode::BAD_REQUEST, &e.body_text()),
    }
}

/// `POST /dashboard/api/inspect/act` (session, CSRF header): as
/// `POST /registry/state/act`, recorded as asked by
/// `dashboard:<the session id's first 8 characters>`.
pub async fn inspect_act<S: PlacementStore>(
    State(app): State<Arc<App<S>>>,
    req: Request,
) -> Response {
    let session_id = match checked_post(&app, req.headers()) {
        Ok(id) => id,
        Err((status, detail)) => return json_error(status, detail),
    };
    let body = match read_body(req, app.registry_body).await {
        Ok(body) => body,
        Err(e) => return secured(e.into_response()),
    };
    let mut request: ActRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, &format!("malformed body: {e}")),
    };
    request.by = Some(format!(
        "dashboard:{}",
        session_id.chars().take(8).collect::<String>()
    ));
    let (status, body) = crate::operator::state::act(&app, request).await;
    secured((status, Json(body)).into_response())
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
        assert_eq!(
            cookie("abc", 60, true),
            "pinboard_dashboard=abc; HttpOnly; SameSite=Strict; Path=/dashboard; Max-Age=60; Secure"
        );
        assert!(!cookie("", 0, false).contains("Secure"));
    }
}
