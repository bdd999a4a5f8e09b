//! The spans of one proxied request (all at debug): `proxy` for the
//! request, and under it one `resolve` per route resolution and one
//! `attempt` per send; the attempt's trace context goes to the worker in
//! its `traceparent` while traces are exported (`pinned_edge::trace`).
//!
//! Owns when spans are made and closed, never what the request does. Made
//! only when debug spans are wanted at all (the console at debug, or the
//! OTLP layer's filter), behind one box: with them off a request pays one
//! level check and carries one null pointer (`proxy-bench` counts every
//! byte of the per-request future, copied per request). Spans time
//! themselves from creation to drop, so none is entered across an await.

use http::HeaderMap;
use tracing::Span;

use super::Inbound;

/// The request's span and the step (resolution or attempt) under way.
#[derive(Debug)]
pub struct RequestSpans {
    request: Span,
    step: Span,
}

impl RequestSpans {
    /// The request's spans, when debug spans of `pinboard::proxy` are
    /// wanted; `proxy` continues the client's `traceparent` while traces
    /// are exported.
    #[inline]
    pub fn open(inbound: &Inbound) -> Option<Box<Self>> {
        if !tracing::enabled!(target: "pinboard::proxy", tracing::Level::DEBUG) {
            return None;
        }
        Self::open_cold(inbound)
    }

    #[cold]
    fn open_cold(inbound: &Inbound) -> Option<Box<Self>> {
        let request = tracing::debug_span!(
            target: "pinboard::proxy",
            "proxy",
            method = tracing::field::Empty,
            ns = tracing::field::Empty,
            id = tracing::field::Empty,
            status = tracing::field::Empty,
        );
        if let Inbound::Request(req) | Inbound::HostChecked(req) = inbound {
            request.record("method", req.method().as_str());
            pinned_edge::trace::continue_from(&request, req.headers());
        }
        Some(Box::new(Self {
            request,
            step: Span::none(),
        }))
    }

    /// The id the request names.
    pub fn target(&self, ns: &str, id: &str) {
        self.request.record("ns", ns);
        self.request.record("id", id);
    }

    /// A resolution starts (the step before, if any, is over).
    pub fn resolving(&mut self) {
        self.step =
            tracing::debug_span!(target: "pinboard::proxy", parent: &self.request, "resolve");
    }

    /// Attempt `attempt` to the worker `session` starts: its span, and its
    /// trace context written onto the worker's request `headers`.
    pub fn attempt(&mut self, attempt: u32, session: &str, headers: &mut HeaderMap) {
        self.step = tracing::debug_span!(
            target: "pinboard::proxy",
            parent: &self.request,
            "attempt",
            attempt,
            worker = session,
        );
        pinned_edge::trace::inject(&self.step, headers);
    }

    /// The step under way is over (an attempt failed; a backoff may
    /// follow).
    pub fn step_done(&mut self) {
        self.step = Span::none();
    }

    /// The answer's status.
    pub fn answered(&self, status: u16) {
        self.request.record("status", status);
    }
}
