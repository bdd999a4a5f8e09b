//! HTTP shell of the inspector on the worker, under `/_pinned/state/`
//! (authenticated by the caller, [`crate::serve`], like every `/_pinned`
//! route: pinboard's proxy secret or an attestation):
//!
//! | route | answer |
//! | --- | --- |
//! | `GET ids?ns=&filter=&after=&limit=` | a page of ids with durable state ([`super::view::list`]) |
//! | `GET show?ns=&id=` | one id's rows decoded ([`super::view::show`]) |
//! | `POST act?ns=&id=&action=&tray=&key=&by=` | one control ([`super::act`]); behind pinboard at the `Pinboard-Epoch` it sends |
//!
//! Owns the query checks: every bad input is a 4xx with a `detail`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Method, StatusCode};
use pinned_store::{InstanceKey, StateStore};
use pinned_wire::{epoch, headers, ids};

use super::act::{self, ActError, Action, Request};
use super::view::{self, Filter};
use super::{DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT};
use crate::durable::Durable;
use crate::namespace::Namespace;
use crate::response;

fn bad(detail: &str) -> Response {
    response::detail(StatusCode::BAD_REQUEST, detail)
}

fn store_failed(error: &pinned_store::StoreError) -> Response {
    response::detail(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("store failed: {error}"),
    )
}

/// The id in query parameter `name`, or the 400 `detail` saying why not.
fn id_param<'q>(query: &'q HashMap<String, String>, name: &str) -> Result<&'q str, String> {
    let Some(id) = query.get(name) else {
        return Err(format!("missing query parameter {name:?}"));
    };
    ids::validate_id(id).map_err(|invalid| format!("malformed {name}: {}", invalid.detail()))?;
    Ok(id)
}

/// Answers `/_pinned/state/<op>` for `host` (the namespace the `ns`
/// parameter named, already found).
pub(crate) async fn serve(
    host: &Arc<Namespace>,
    op: &str,
    method: &Method,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Response {
    let (Some(durable), Some(store)) = (Durable::of(host), host.store.as_deref()) else {
        return response::detail(
            StatusCode::NOT_FOUND,
            &format!("namespace {} has no state store", host.ns),
        );
    };
    let allowed = match op {
        "ids" | "show" => Method::GET,
        "act" => Method::POST,
        _ => return response::detail(StatusCode::NOT_FOUND, "Not Found"),
    };
    if method != allowed {
        return response::detail(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    }
    let now_ms = i64::try_from(host.domain.unix_ms()).unwrap_or(i64::MAX);
    match op {
        "ids" => ids_page(host, store, query, now_ms).await,
        "show" => {
            let id = match id_param(query, "id") {
                Ok(id) => id,
                Err(why) => return bad(&why),
            };
            match store.peek(InstanceKey::new(&host.ns, id)).await {
                Ok(peek) => axum::Json(view::show(
                    InstanceKey::new(&host.ns, id),
                    &peek,
                    host.is_resident(id),
                    now_ms,
                ))
                .into_response(),
                Err(error) => store_failed(&error),
            }
        }
        _ => act_on(host, durable, store, query, headers).await,
    }
}

async fn ids_page(
    host: &Arc<Namespace>,
    store: &dyn StateStore,
    query: &HashMap<String, String>,
    now_ms: i64,
) -> Response {
    let filter = match query.get("filter").map(String::as_str) {
        None | Some("") => Filter::All,
        Some(name) => match Filter::parse(name) {
            Some(filter) => filter,
            None => {
                return bad(&format!(
                    "unknown filter {name:?}: one of all, marked, parked, alarm-due"
                ))
            }
        },
    };
    let after = match query.get("after").filter(|after| !after.is_empty()) {
        None => None,
        Some(after) => match ids::validate_id(after) {
            Ok(()) => Some(after.as_str()),
            Err(_) => return bad("malformed cursor: pass the `next` of the previous page"),
        },
    };
    let limit = match query.get("limit") {
        None => DEFAULT_LIST_LIMIT,
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=MAX_LIST_LIMIT).contains(&n) => n,
            _ => {
                return bad(&format!(
                    "limit must be an integer from 1 to {MAX_LIST_LIMIT}, got {text:?}"
                ))
            }
        },
    };
    match view::list(store, &host.ns, filter, after, limit, now_ms).await {
        Ok(page) => axum::Json(page).into_response(),
        Err(error) => store_failed(&error),
    }
}

async fn act_on(
    host: &Arc<Namespace>,
    durable: &Durable,
    store: &dyn StateStore,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Response {
    let id = match id_param(query, "id") {
        Ok(id) => id,
        Err(why) => return bad(&why),
    };
    let action = match query.get("action").map(String::as_str) {
        Some(name) => match Action::parse(name) {
            Some(action) => action,
            None => {
                return bad(&format!(
                    "unknown action {name:?}: one of unpark, skip, pause, resume, delete"
                ))
            }
        },
        None => return bad("missing query parameter \"action\""),
    };
    let request = Request {
        tray: query.get("tray").filter(|tray| !tray.is_empty()).cloned(),
        key: query
            .get("key")
            .filter(|key| !key.is_empty())
            .cloned()
            .unwrap_or_else(|| pinned_store::SINGLETON_TRAY_ID.to_owned()),
        by: query
            .get("by")
            .map(|by| by.chars().take(128).collect())
            .unwrap_or_else(|| "operator".to_owned()),
    };
    if action.needs_tray() && request.tray.is_none() {
        return bad(&format!(
            "{} needs a tray (query parameter \"tray\")",
            action.name()
        ));
    }
    let epoch = match headers.get(headers::EPOCH) {
        Some(value) => match epoch::parse_epoch(value.as_bytes()) {
            Ok(epoch) => Some(epoch),
            Err(malformed) => return bad(&malformed.to_string()),
        },
        None if host.control.pinboard().is_some() => {
            return response::detail(
                StatusCode::CONFLICT,
                "behind pinboard an action needs the owner's Pinboard-Epoch: act through pinboard (`pinboard state …`)",
            )
        }
        None => None,
    };
    if let Some(epoch) = epoch {
        if let Err(refusal) = host.fences.admit(id, epoch, host.control.lease_ttl()) {
            return response::detail(StatusCode::CONFLICT, refusal.detail());
        }
    }
    match act::act(host, durable, store, id, epoch, action, &request).await {
        Ok(done) => axum::Json(done).into_response(),
        Err(error) => {
            let status = match &error {
                ActError::Busy | ActError::Inapplicable(_) | ActError::Superseded(_) => {
                    StatusCode::CONFLICT
                }
                ActError::StillResident(_) | ActError::Store(_) | ActError::NotEntered(_) => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
            };
            response::detail(status, &error.to_string())
        }
    }
}
