//! The prepare phase: a client request becomes a [`RequestCtx`], or is
//! refused before anything is resolved.
//!
//! Owns the checks a request passes before any worker is chosen, in this
//! order: its `Host` lines, its path (`/<ns>/<id>…`) and id, its cluster
//! credentials, its world, its body (buffered when it may be re-sent),
//! and the worker's request head built from its fields. Never resolves,
//! never sends: a request refused here costs no store call beyond the
//! cached worker view (and a cluster caller's session lookup).

use http::uri::PathAndQuery;
use http::{header, Version};
use pinned_wire::headers::HOSTNAME;
use pinned_wire::held::{SOCKET_EVENT, SOCKET_OFFER};
use pinned_wire::ids::decode_id_segment;

use super::body;
use super::cluster;
use super::context::{Asker, Attempts, IdTarget, NamedWorld, RequestCtx};
use super::error::{ErrorKind, ProxyError, ProxyResult};
use super::headers::{add_forwarded, sanitize_request, single_host, ClientAddr, Scan};
use super::path;
use super::respond::{ClientUpgrade, UpgradeHold};
use super::Inbound;
use crate::app::App;
use crate::held::{EventMark, HeldDoor};
use crate::placement::PlacementStore;
use crate::routes::{ResolveError, View};
use crate::world::{cluster_world, host_names, World, ENV_HEADER};

/// Check `inbound` and build its context (see the module doc).
///
/// # Errors
///
/// The first check the request fails, as a [`ProxyError`] of the client's
/// side (or pinboard's, when the store fails).
pub async fn prepare<'c, S: PlacementStore>(
    app: &App<S>,
    client: Option<&'c ClientAddr>,
    inbound: Inbound,
) -> ProxyResult<RequestCtx<'c>> {
    let req = match inbound {
        Inbound::Request(req) => {
            single_host(req.version(), req.headers()).map_err(ProxyError::bad_host)?;
            req
        }
        Inbound::HostChecked(req) => req,
        Inbound::Refused(e) => return Err(e),
    };
    let (mut parts, body) = req.into_parts();
    let arrived_mono_ms = app.clock.mono_ms();
    let target = id_target(&parts.uri)?;
    let scan = Scan::of(&parts.headers);
    // Cluster credentials and worlds are `pinboard-*` headers: a request
    // without any has neither.
    let caller = match scan.pinboard {
        false => None,
        true => cluster::verify(&parts.headers, &app.routes)
            .await
            .map_err(ErrorKind::Cluster)?,
    };
    let (asker, view) = match caller {
        Some(caller) => {
            cluster_world(&parts.headers, &caller.worker.record, target.ns())
                .map_err(ErrorKind::World)?;
            (Asker::Caller(Box::new(caller)), None)
        }
        None => named_world(app, &parts, scan, arrived_mono_ms).await?,
    };
    let upgrade = scan.is_upgrade(&parts.headers);
    let client_upgrade = if upgrade {
        parts
            .extensions
            .remove::<hyper::upgrade::OnUpgrade>()
            .map(|on| ClientUpgrade {
                on,
                hold: parts.extensions.remove::<UpgradeHold>(),
                door: parts.extensions.remove::<HeldDoor>(),
            })
    } else {
        None
    };
    let (body, watch) = body::prepare(body, app.proxy.retry_body_limit, app.proxy.body_timeout)
        .await
        .map_err(ProxyError::client_body)?;
    // The worker's request head is the client's, its fields cleaned once:
    // each attempt sets its target in place and stamps pinboard's fields on
    // the way out (`upstream::Stamp`). Its extensions are never sent.
    let mut head = parts;
    head.version = Version::HTTP_11;
    sanitize_request(&mut head.headers, &scan, upgrade);
    let held_offer = offer(app, &mut head, &asker, client_upgrade.as_ref());
    let forwarding = client.and_then(|c| add_forwarded(&mut head.headers, &scan, c));
    let retries = if body.replayable() {
        app.proxy.retries
    } else {
        0
    };
    Ok(RequestCtx {
        target,
        asker,
        view,
        head,
        forwarding,
        body,
        watch,
        upgrade,
        client_upgrade,
        held_offer,
        attempts: Attempts {
            retries,
            ..Attempts::default()
        },
        arrived_mono_ms,
        head_timer: None,
    })
}

/// Marks what this node adds after the client's `pinboard-*` fields are
/// gone (`crate::held`): a held socket's event names its socket; a
/// WebSocket handshake from a client (not a cluster caller) through a door
/// that can hold it is offered for holding, under a fresh socket id.
fn offer<S: PlacementStore>(
    app: &App<S>,
    head: &mut http::request::Parts,
    asker: &Asker,
    upgrade: Option<&ClientUpgrade>,
) -> Option<Box<str>> {
    if let Some(EventMark(socket)) = head.extensions.remove::<EventMark>() {
        head.headers.insert(SOCKET_EVENT, socket);
        return None;
    }
    let door = upgrade.and_then(|upgrade| upgrade.door.as_ref());
    let websocket = head.headers.contains_key(header::SEC_WEBSOCKET_KEY);
    if door.is_none() || !websocket || matches!(asker, Asker::Caller(_)) {
        return None;
    }
    let id = app.held.mint_id();
    let value = http::HeaderValue::from_str(&id).ok()?;
    head.headers.insert(SOCKET_OFFER, value);
    Some(id.into_boxed_str())
}

/// The id `uri` names.
fn id_target(uri: &http::Uri) -> ProxyResult<IdTarget> {
    let Some(split) = path::split(uri.path()) else {
        return Err(ErrorKind::NotAnId.into());
    };
    let id = decode_id_segment(split.raw_id).map_err(|e| ErrorKind::BadId(e.detail()))?;
    let decoded = match &id {
        std::borrow::Cow::Borrowed(_) => None,
        std::borrow::Cow::Owned(id) => Some(id.as_str()),
    };
    // The path is the start of the path and query: the offsets hold there.
    let path_and_query = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    Ok(IdTarget::new(
        path_and_query,
        split.ns.len(),
        split.key.len(),
        decoded,
    ))
}

/// The world a request without cluster credentials names, and the worker
/// view read for it (the first resolution's too: one read of it per
/// request). The `pinboard-*` values are read before they are stripped;
/// they are refcounted, so a hostless request copies nothing.
async fn named_world<S: PlacementStore>(
    app: &App<S>,
    parts: &http::request::Parts,
    scan: Scan,
    now_mono_ms: u64,
) -> ProxyResult<(Asker, Option<View>)> {
    let (hostname, env) = match scan.pinboard {
        false => (None, None),
        true => (
            parts.headers.get(HOSTNAME).cloned(),
            parts.headers.get(ENV_HEADER).cloned(),
        ),
    };
    // Without a `Pinboard-Hostname`, `Host` may name a bound hostname's
    // world (`crate::world`).
    let (by_host, view) = match &hostname {
        None => match app.routes.view_at(now_mono_ms).await {
            Ok(view) => (bound_host(&view, parts), Some(view)),
            Err(e) => return Err(ErrorKind::Unresolved(ResolveError::Store(e)).into()),
        },
        Some(_) => (None, None),
    };
    World::from_values(hostname.as_ref(), env.as_ref(), by_host.as_deref())
        .map_err(ErrorKind::World)?;
    let asker = match (&hostname, &env, &by_host) {
        (None, None, None) => Asker::Hostless,
        _ => Asker::Named(Box::new(NamedWorld {
            hostname,
            env,
            by_host,
        })),
    };
    Ok((asker, view))
}

/// The bound hostname (see `crate::world`) the request's target authority
/// or `Host` names in `view`, if any: the name with its port stripped, else
/// with its port (a hostname registered with one).
fn bound_host(view: &View, parts: &http::request::Parts) -> Option<String> {
    if view.binds_none() {
        return None;
    }
    let host = parts.headers.get(header::HOST);
    let (bare, with_port) = host_names(&parts.uri, host)?;
    [Some(bare), with_port]
        .into_iter()
        .flatten()
        .find(|name| view.binds(name))
        .map(str::to_owned)
}
