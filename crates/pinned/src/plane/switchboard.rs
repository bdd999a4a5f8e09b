//! In-process cluster calls: an instance calling `/<ns>/<id>/...` on a
//! namespace this worker hosts reaches it without leaving the process.
//!
//! The hosts never point at each other or at the worker. Each host is
//! created holding a [`Switchboard`], the sending half of a bounded
//! channel; the worker owns the receiving half and the namespace table,
//! and serves calls in one task (`crate::serve::exchange::serve`, above this
//! layer) that it starts with itself and
//! that ends when the worker is dropped (its stop token) or every sender
//! is gone. A call the switchboard does not serve here (a namespace hosted
//! elsewhere, an id not resident behind pinboard) is handed back untouched,
//! for the caller to send through pinboard.
//!
//! The switchboard never decides lifecycle: the target's own dispatch and
//! admission do, exactly as for a request from the network.

use axum::body::Body;
use axum::response::Response;
use http::Request;
use tokio::sync::{mpsc, oneshot};

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

impl Exchange {
    /// The next call; `None` once every sender is gone.
    pub(crate) async fn next(&mut self) -> Option<Call> {
        self.calls.recv().await
    }
}

impl Call {
    /// Answers the caller: the target's response, or the request handed
    /// back for the caller to send through pinboard.
    pub(crate) fn answer(self, answer: Result<Response, Request<Body>>) {
        let _ = self.reply.send(answer);
    }
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
