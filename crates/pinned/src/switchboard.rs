//! In-process cluster calls: an instance calling `/<ns>/<id>/...` on a
//! namespace this worker hosts reaches it without leaving the process.
//!
//! The hosts never point at each other or at the worker. Each host is
//! created holding a [`Switchboard`], the sending half of a bounded
//! channel; the worker owns the receiving half and the namespace table,
//! and serves calls in one task ([`serve`]) that it starts with itself and
//! that ends when the worker is dropped (its stop token) or every sender
//! is gone. A call the switchboard does not serve here (a namespace hosted
//! elsewhere, an id not resident behind pinboard) is handed back untouched,
//! for the caller to send through pinboard.
//!
//! The switchboard never decides lifecycle: the target's own dispatch and
//! admission do, exactly as for a request from the network.

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, Request};
use pinned_wire::{attestation, headers};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::dispatch::dispatch;
use crate::hosts::Hosts;

/// Calls waiting for the switchboard task; a burst beyond this many waits
/// (the sender's `send` applies backpressure) rather than growing a queue.
const CAPACITY: usize = 1_024;

/// How a call to the switchboard ended.
pub(crate) enum Routed {
    /// Served in process: the target's answer.
    Served(Response),
    /// Not served here: the request, handed back untouched.
    Elsewhere(Request<Body>),
    /// The worker is gone (dropped, or its switchboard never started).
    Gone,
}

/// One in-process call.
pub(crate) struct Call {
    /// The target namespace, with its leading slash.
    pub(crate) ns: String,
    /// The target id.
    pub(crate) id: String,
    /// The request, already stripped of `pinboard-*` and `Host` headers.
    pub(crate) request: Request<Body>,
    /// `<ns>/<id>` of the calling instance.
    pub(crate) caller: String,
    /// The depth of this call.
    pub(crate) depth: i64,
    reply: oneshot::Sender<Result<Response, Request<Body>>>,
}

/// The sending half, held by every host.
#[derive(Clone)]
pub(crate) struct Switchboard {
    calls: mpsc::Sender<Call>,
}

/// The receiving half, owned by the worker until its switchboard starts.
pub(crate) struct Exchange {
    calls: mpsc::Receiver<Call>,
}

/// A connected pair.
pub(crate) fn switchboard() -> (Switchboard, Exchange) {
    let (calls, receiver) = mpsc::channel(CAPACITY);
    (Switchboard { calls }, Exchange { calls: receiver })
}

impl Switchboard {
    /// Offers `request` to the worker's own namespaces.
    pub(crate) async fn call(
        &self,
        ns: String,
        id: String,
        request: Request<Body>,
        caller: String,
        depth: i64,
    ) -> Routed {
        let (reply, answer) = oneshot::channel();
        let call = Call {
            ns,
            id,
            request,
            caller,
            depth,
            reply,
        };
        if self.calls.send(call).await.is_err() {
            return Routed::Gone;
        }
        match answer.await {
            Ok(Ok(response)) => Routed::Served(response),
            Ok(Err(request)) => Routed::Elsewhere(request),
            Err(_) => Routed::Gone,
        }
    }
}

/// Serves in-process calls for `hosts` until `stop` is cancelled or every
/// sender is dropped.
pub(crate) async fn serve(hosts: Hosts, exchange: Exchange, stop: CancellationToken) {
    let mut calls = exchange.calls;
    loop {
        let call = tokio::select! {
            () = stop.cancelled() => return,
            call = calls.recv() => match call {
                Some(call) => call,
                None => return,
            },
        };
        route(&hosts, call);
    }
}

/// Serves `call` in its own task, or hands it back.
fn route(hosts: &Hosts, call: Call) {
    let Call {
        ns,
        id,
        request,
        caller,
        depth,
        reply,
    } = call;
    let Some(target) = hosts.find(&ns) else {
        let _ = reply.send(Err(request));
        return;
    };
    if !(target.control.calls_every_id_in_process() || target.is_resident(&id)) {
        let _ = reply.send(Err(request));
        return;
    }
    let (mut parts, body) = request.into_parts();
    // A fresh attestation for the target's local audience: the target sees
    // the calling instance as its attested caller.
    let token = attestation::mint(
        &target.secret,
        &target.local_aud,
        target.domain.unix_secs(),
        Some(&caller),
        Some(depth),
    );
    if let Ok(value) = HeaderValue::from_str(&token) {
        parts.headers.insert(headers::ATTESTATION, value);
    }
    let request = Request::from_parts(parts, body);
    let hosts = hosts.clone();
    // Its own task: nested calls would otherwise poll each other on one
    // ever-deeper stack, and the switchboard keeps taking calls.
    target.domain.spawn(async move {
        let response = dispatch(&hosts, request).await;
        let _ = reply.send(Ok(response));
    });
}
