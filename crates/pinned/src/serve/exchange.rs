//! Serving the worker's in-process cluster calls: the receiving half of
//! the [`switchboard`](crate::plane::switchboard), run by the worker over its
//! namespace table. A call goes through the target's own dispatch and
//! admission, exactly as a request from the network.

use http::{HeaderValue, Request};
use pinned_wire::{attestation, headers};
use tokio_util::sync::CancellationToken;

use crate::plane::switchboard::{Call, Exchange};
use crate::serve::dispatch::dispatch;
use crate::serve::namespaces::Namespaces;

/// Serves in-process calls for `hosts` until `stop` is cancelled or every
/// sender is dropped.
pub(crate) async fn serve(hosts: Namespaces, mut exchange: Exchange, stop: CancellationToken) {
    loop {
        let call = tokio::select! {
            () = stop.cancelled() => return,
            call = exchange.next() => match call {
                Some(call) => call,
                None => return,
            },
        };
        route(&hosts, call);
    }
}

/// Serves `call` in its own task, or hands it back.
fn route(hosts: &Namespaces, mut call: Call) {
    let Some(target) = hosts.find(&call.ns) else {
        let request = std::mem::take(&mut call.request);
        call.answer(Err(request));
        return;
    };
    if !(target.control.calls_every_id_in_process() || target.is_resident(&call.id)) {
        let request = std::mem::take(&mut call.request);
        call.answer(Err(request));
        return;
    }
    let (mut parts, body) = std::mem::take(&mut call.request).into_parts();
    // A fresh attestation for the target's local audience: the target sees
    // the calling instance as its attested caller.
    let token = attestation::mint(
        &target.secret,
        &target.local_aud,
        target.domain.unix_secs(),
        Some(&call.caller),
        Some(call.depth),
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
        call.answer(Ok(response));
    });
}
