//! Cluster calls: a worker instance calling another instance through
//! pinboard with `Pinboard-From`, `Pinboard-Session`,
//! `Pinboard-Session-Secret` and `Pinboard-Subrequest-Depth`.
//!
//! Owns the verification of those headers; never forwards them (the proxy
//! strips every inbound `pinboard-*` header) and never trusts `Pinboard-From`
//! without a matching session secret.
//!
//! Rules (wire.md §11, inferred where the reference is silent): the session
//! must be live and its secret must match (constant time), else 403
//! `invalid cluster credentials`; `Pinboard-From` must be `<ns>/<id>` with a
//! namespace that session hosts, else 403; the depth must be a decimal
//! integer (absent = 1), and above 50 the call is refused with 400
//! `subrequest depth exceeds 50`. A request with none of the session headers
//! is ordinary client traffic (anonymous); one with only some is refused 403.
//!
//! A verified call stays in its caller's world (`crate::world::cluster_world`):
//! naming another hostname or env answers 403.
//!
//! A session longer than [`MAX_SESSION_ID_LEN`] is refused before any
//! lookup (pinboard mints 32 hex characters), so forged sessions are small
//! wherever they are remembered; forged sessions cost at most one store
//! read per forced-refresh interval (see `resolve`'s "Unknown sessions").

use std::sync::Arc;

use http::HeaderMap;
use pinned_wire::headers::{FROM, MAX_SUBREQUEST_DEPTH, SESSION, SESSION_SECRET, SUBREQUEST_DEPTH};
use subtle::ConstantTimeEq;

use crate::placement::{PlacementStore, StoreError};
use crate::routes::Routes;
use crate::upstream::WorkerConn;

/// Longest `Pinboard-Session` looked up (pinboard's session ids are 32
/// hex characters; this leaves room, and bounds what a forged one costs).
pub const MAX_SESSION_ID_LEN: usize = 64;

/// A verified calling instance.
#[derive(Debug, Clone)]
pub struct Caller {
    /// `<ns>/<id>` of the calling instance.
    pub from: String,
    /// Depth of this call.
    pub depth: i64,
    /// The calling worker (its registration is the call's world).
    pub worker: Arc<WorkerConn>,
}

/// A refused cluster call.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Unknown session, wrong secret, or a caller outside the session. 403.
    #[error("invalid cluster credentials")]
    Credentials,
    /// The depth header is not a decimal integer. 400.
    #[error("malformed subrequest depth")]
    MalformedDepth,
    /// Depth above the limit. 400.
    #[error("subrequest depth exceeds {MAX_SUBREQUEST_DEPTH}")]
    TooDeep,
    /// The store failed. 503.
    #[error("placement store unavailable: {0}")]
    Store(#[from] StoreError),
}

fn text<'a>(headers: &'a HeaderMap, name: &http::HeaderName) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Verify the cluster headers of an inbound request.
///
/// # Errors
///
/// See [`ClusterError`].
pub async fn verify<S: PlacementStore>(
    headers: &HeaderMap,
    routes: &Routes<S>,
) -> Result<Option<Caller>, ClusterError> {
    let session = text(headers, &SESSION);
    let secret = text(headers, &SESSION_SECRET);
    let from = text(headers, &FROM);
    if session.is_none() && secret.is_none() && from.is_none() {
        return Ok(None);
    }
    let (Some(session), Some(secret), Some(from)) = (session, secret, from) else {
        return Err(ClusterError::Credentials);
    };
    let depth = match text(headers, &SUBREQUEST_DEPTH) {
        None => 1,
        Some(d) => d
            .trim()
            .parse::<i64>()
            .map_err(|_| ClusterError::MalformedDepth)?,
    };
    if depth > i64::from(MAX_SUBREQUEST_DEPTH) {
        return Err(ClusterError::TooDeep);
    }
    if depth < 0 {
        return Err(ClusterError::MalformedDepth);
    }
    if session.len() > MAX_SESSION_ID_LEN {
        return Err(ClusterError::Credentials);
    }
    let Some(worker) = routes.worker(session).await? else {
        return Err(ClusterError::Credentials);
    };
    if !bool::from(worker.record.secret.as_bytes().ct_eq(secret.as_bytes())) {
        return Err(ClusterError::Credentials);
    }
    let Some(cut) = from.rfind('/').filter(|c| *c > 0 && *c + 1 < from.len()) else {
        return Err(ClusterError::Credentials);
    };
    if !worker.record.hosts(&from[..cut]) {
        return Err(ClusterError::Credentials);
    }
    Ok(Some(Caller {
        from: from.to_owned(),
        depth,
        worker,
    }))
}
