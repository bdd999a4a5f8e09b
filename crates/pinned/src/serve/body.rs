//! A streaming response body that keeps its instance in flight.
//!
//! The body is pulled only as hyper writes to the client, so a slow client
//! slows its own stream and nothing is buffered here. The instance stays in
//! flight until the body ends or is dropped (the client went away); when the
//! instance is aborted the body fails at the next poll, so the connection is
//! cut rather than closed cleanly: a truncated download must never look
//! complete to the client.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body::{Frame, SizeHint};

use crate::namespace::Busy;

/// Why a tracked body failed: its instance was aborted mid-stream.
#[derive(Debug, thiserror::Error)]
#[error("instance aborted; the response body was cut short")]
pub(crate) struct Truncated;

pin_project_lite::pin_project! {
    /// A response body counted as an open stream of its instance.
    pub(crate) struct TrackedBody {
        #[pin]
        inner: Body,
        entry: Option<Busy>,
        // Owns the record whose inline abort signal it waits on, so it is
        // a boxed future.
        aborted: BoxFuture<'static, ()>,
    }
}

impl TrackedBody {
    pub(crate) fn new(inner: Body, entry: Busy) -> Self {
        let slot = entry.slot().clone();
        let aborted = Box::pin(async move { slot.cancelled().await });
        Self {
            inner,
            entry: Some(entry),
            aborted,
        }
    }
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.project();
        if this.entry.is_none() {
            return Poll::Ready(None);
        }
        if this.aborted.as_mut().poll(cx).is_ready() {
            this.entry.take();
            return Poll::Ready(Some(Err(axum::Error::new(Truncated))));
        }
        let frame = this.inner.poll_frame(cx);
        if matches!(frame, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.entry.take();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.entry.is_none() || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
