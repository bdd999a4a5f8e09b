//! A worker took a socket offer (`pinned_wire::held`): pinboard completes
//! the client's WebSocket handshake itself and holds the socket
//! (`crate::held`); and the proxy is the door a held socket's events go
//! through.
//!
//! Owns reading the worker's hold answer (bounded, within the upstream
//! deadline), the client's `101` and handing the connection to a held
//! socket's task. Never reads or writes the socket itself.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use futures_util::future::BoxFuture;
use http::{header, HeaderValue, Request, StatusCode, Uri};
use http_body_util::BodyExt;
use pinned_wire::headers::HOSTNAME;
use pinned_wire::held::{Hold, EVENT_PATH};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use super::context::{Asker, RequestCtx};
use super::error::{ErrorKind, ProxyResult};
use super::Inbound;
use crate::app::App;
use crate::held::socket::{run, Spawn, Template};
use crate::held::Door;
use crate::outbound::ResBody;
use crate::placement::PlacementStore;
use crate::world::ENV_HEADER;

/// The largest hold answer read.
const MAX_HOLD_BODY: usize = 16 * 1024;

impl<S: PlacementStore> Door for App<S> {
    fn serve(&self, request: Request<Body>) -> BoxFuture<'_, Response> {
        Box::pin(super::serve(self, None, Inbound::Request(request), None))
    }
}

/// Completes the client's handshake for the socket the worker took and
/// starts holding it.
///
/// # Errors
///
/// [`ErrorKind::BadHold`] for a hold answer that is not one (or a
/// handshake without a key), [`ErrorKind::UpstreamTimeout`] when it is not
/// read in time, [`ErrorKind::NoUpgrade`] when the client's connection
/// cannot switch.
pub async fn take<S: PlacementStore>(
    app: &App<S>,
    ctx: &mut RequestCtx<'_>,
    res: http::Response<ResBody>,
) -> ProxyResult<Response> {
    let (head, body) = res.into_parts();
    let body = match tokio::time::timeout(
        app.proxy.upstream_timeout,
        http_body_util::Limited::new(body, MAX_HOLD_BODY).collect(),
    )
    .await
    {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(_)) => return Err(ErrorKind::BadHold.into()),
        Err(_) => return Err(ErrorKind::UpstreamTimeout.into()),
    };
    let hold: Hold = serde_json::from_slice(&body).map_err(|_| ErrorKind::BadHold)?;
    let key = ctx
        .head
        .headers
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or(ErrorKind::BadHold)?;
    let accept = HeaderValue::from_str(&derive_accept_key(key.as_bytes()))
        .map_err(|_| ErrorKind::BadHold)?;
    let template = template(ctx)?;
    let (Some(id), Some(upgrade)) = (ctx.held_offer.take(), ctx.client_upgrade.take()) else {
        return Err(ErrorKind::NoUpgrade.into());
    };
    let Some(door) = upgrade.door else {
        return Err(ErrorKind::NoUpgrade.into());
    };
    let socket = app
        .held
        .add(&id, ctx.target.key(), hold.tags, hold.attachment);
    tracing::debug!(target: "pinboard::held", socket = %id, key = %ctx.target.key(), "holding a socket");
    let spawn = Spawn {
        door: door.0,
        sockets: app.held.clone(),
        socket,
        template,
        auto: hold.auto_response,
        keep: upgrade.hold.map(|hold| hold.0 as Arc<dyn Send + Sync>),
    };
    tokio::spawn(run(spawn, upgrade.on));
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    if let Some(protocol) = head.headers.get(header::SEC_WEBSOCKET_PROTOCOL) {
        headers.insert(header::SEC_WEBSOCKET_PROTOCOL, protocol.clone());
    }
    Ok(response)
}

/// The socket's event requests: `/<ns>/<id>/_pinned/sockets/event` in the
/// client's world.
fn template(ctx: &RequestCtx<'_>) -> ProxyResult<Template> {
    let uri: Uri = format!("{}{EVENT_PATH}", ctx.target.raw_key())
        .parse()
        .map_err(|_| ErrorKind::BadHold)?;
    let mut headers = Vec::with_capacity(3);
    if let Some(host) = ctx.head.headers.get(header::HOST) {
        headers.push((header::HOST, owned(host)?));
    }
    if let Asker::Named(named) = &ctx.asker {
        if let Some(hostname) = &named.hostname {
            headers.push((HOSTNAME, owned(hostname)?));
        }
        if let Some(env) = &named.env {
            headers.push((ENV_HEADER, owned(env)?));
        }
    }
    Ok(Template {
        uri,
        headers: headers.into(),
    })
}

/// A copy of `value` in its own allocation: a field of the handshake is a
/// slice of the connection's whole read buffer (8 KiB and more), which a
/// clone would keep for as long as the socket is held.
fn owned(value: &HeaderValue) -> ProxyResult<HeaderValue> {
    HeaderValue::from_bytes(value.as_bytes()).map_err(|_| ErrorKind::BadHold.into())
}
