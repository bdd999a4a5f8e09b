//! The answer a worker gave, as the client gets it: relayed with its
//! headers cleaned and its body's pauses bounded, or, for `101 Switching
//! Protocols`, the two upgraded connections spliced.
//!
//! Owns relaying and the splice; never decides whether an answer is
//! relayed (that is the classify phase) and never builds pinboard's own
//! error answers (that is `proxy::error`).

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use hyper_util::rt::TokioIo;

use bytes::Bytes;

use super::headers::sanitize_response;
use super::pause::PauseBound;
use crate::app::App;
use crate::outbound::ResBody;
use crate::placement::PlacementStore;

/// Something the server wants kept alive for as long as a connection it
/// handed over in an upgrade (a WebSocket) is spliced: its slot under the
/// connection cap. The accept loop puts it in the extensions of requests
/// that ask to upgrade; the splice holds it until it ends.
#[derive(Clone)]
pub struct UpgradeHold(pub Arc<dyn Send + Sync>);

impl std::fmt::Debug for UpgradeHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UpgradeHold")
    }
}

/// The client side of an upgrade request.
#[derive(Debug)]
pub struct ClientUpgrade {
    /// The client connection, once hyper hands it over.
    pub on: hyper::upgrade::OnUpgrade,
    /// What the server keeps alive while it is spliced.
    pub hold: Option<UpgradeHold>,
    /// The node's door, when the handshake may be offered for holding
    /// (`crate::held`).
    pub door: Option<crate::held::HeldDoor>,
}

/// The worker's answer as the client gets it: its headers cleaned, its
/// body relayed as it comes, with no pause longer than
/// `--upstream-body-timeout-ms` ([`pause`](super::pause)).
pub fn relay<S: PlacementStore>(app: &App<S>, res: http::Response<ResBody>) -> Response {
    let (mut parts, body) = res.into_parts();
    sanitize_response(&mut parts.headers);
    // Most answers came whole with their head: nothing to bound.
    if body.in_memory() {
        return Response::from_parts(parts, Body::new(body));
    }
    let stalls = app.metrics.proxy_upstream_body_stalls.clone();
    let body = PauseBound::new(body, app.proxy.upstream_body_timeout, stalls);
    Response::from_parts(parts, Body::new(body))
}

/// A worker's answer read whole (a refusal small enough to classify).
#[derive(Debug)]
pub struct Buffered {
    /// Its head.
    pub head: http::response::Parts,
    /// Its body.
    pub body: Bytes,
}

/// A buffered answer as the client gets it: its headers cleaned.
pub fn relay_buffered(answer: Buffered) -> Response {
    let Buffered { mut head, body } = answer;
    sanitize_response(&mut head.headers);
    Response::from_parts(head, Body::from(body))
}

/// Switch protocols: answer 101 and splice the two upgraded connections;
/// `None` when the client's connection cannot switch.
pub fn switch<S: PlacementStore>(
    app: &App<S>,
    mut res: http::Response<ResBody>,
    client: Option<ClientUpgrade>,
) -> Option<Response> {
    let upstream = hyper::upgrade::on(&mut res);
    let ClientUpgrade {
        on: client, hold, ..
    } = client?;
    app.metrics.proxy_upgrades.inc();
    tokio::spawn(async move {
        let _hold = hold;
        let (client, upstream) = tokio::join!(client, upstream);
        if let (Ok(client), Ok(upstream)) = (client, upstream) {
            let mut client = TokioIo::new(client);
            let mut upstream = TokioIo::new(upstream);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        }
    });
    let (parts, _) = res.into_parts();
    Some(Response::from_parts(parts, Body::empty()))
}
