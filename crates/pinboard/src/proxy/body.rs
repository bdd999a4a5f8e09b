//! The client's request body on its way to a worker: buffered when it may
//! have to be re-sent, streamed otherwise, and watched either way so that a
//! body the *client* broke is answered as the client's fault.
//!
//! Owns [`ReqBody`], the read deadline of a buffered body (the whole body
//! within `--body-timeout-ms`), the pause deadline of a streamed one (no
//! gap between two chunks longer than `--body-timeout-ms`, counted only
//! while the worker side is waiting for more, so a worker that reads slowly
//! never trips it), and [`BodyFault`]: what went wrong on the client side.
//! Never decides the status of a worker failure.
//!
//! A streamed body reports its progress on a shared [`BodyWatch`]: the
//! send phase counts the upstream deadline from the last chunk the
//! worker side took (a worker cannot answer an upload before it has it, and
//! a frozen one stops taking chunks), and after a failed send it asks
//! whether the client was the cause.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::{BodyExt, Either, Full};
use parking_lot::Mutex;
use tokio::time::{Instant, Sleep};

use crate::upstream::UpstreamBody;

/// What went wrong with a client's request body: the front's (it reads
/// buffered bodies itself), shared with the streamed ones here.
pub use pinned_edge::front::BodyFault;

/// How far a streamed body got, as seen from the send phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEnd {
    /// Still being sent (or dropped unsent: the worker connection failed).
    Sending,
    /// Sent in full.
    Sent,
    /// The client broke it.
    Fault(BodyFault),
}

/// A streamed body's progress, as the send phase sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyState {
    /// How far it got.
    pub end: BodyEnd,
    /// When it last moved: a chunk taken by the worker side, or its end.
    pub moved: Instant,
    /// The worker side asked for the next chunk and the client has not
    /// sent it yet: any wait now is the client's (and its own deadline
    /// settles it), not the worker's.
    pub awaiting_client: bool,
}

/// A streamed body's progress, shared with the send phase.
#[derive(Debug, Clone)]
pub struct BodyWatch(Arc<Mutex<BodyState>>);

impl BodyWatch {
    fn new() -> Self {
        Self(Arc::new(Mutex::new(BodyState {
            end: BodyEnd::Sending,
            moved: Instant::now(),
            awaiting_client: false,
        })))
    }

    fn record(&self, end: BodyEnd) {
        *self.0.lock() = BodyState {
            end,
            moved: Instant::now(),
            awaiting_client: false,
        };
    }

    fn awaiting_client(&self) {
        self.0.lock().awaiting_client = true;
    }

    /// The body's progress now.
    pub fn state(&self) -> BodyState {
        *self.0.lock()
    }

    /// The client-side fault the body ended with, if any.
    pub fn fault(&self) -> Option<BodyFault> {
        match self.state().end {
            BodyEnd::Fault(f) => Some(f),
            _ => None,
        }
    }
}

/// The request body across attempts.
pub enum ReqBody {
    /// Buffered: can be sent again.
    Replay(Bytes),
    /// Streamed ([`ClientBody`], boxed once here): one attempt only.
    Once(Option<Body>),
}

impl ReqBody {
    /// Whether the body can be sent more than once.
    pub fn replayable(&self) -> bool {
        matches!(self, ReqBody::Replay(_))
    }

    /// The body for the next attempt (a streamed body only once; empty
    /// after that).
    pub fn for_attempt(&mut self) -> UpstreamBody {
        match self {
            ReqBody::Replay(b) => Either::Left(Full::new(b.clone())),
            ReqBody::Once(b) => match b.take() {
                Some(b) => Either::Right(b),
                None => crate::upstream::empty(),
            },
        }
    }
}

/// Buffer `body` when its length is known and at most `limit` (reading it
/// whole within `timeout`); stream it otherwise, returning its
/// [`BodyWatch`].
///
/// # Errors
///
/// [`BodyFault`] when a buffered body could not be read in time or at all.
pub async fn prepare(
    body: Body,
    limit: usize,
    timeout: Duration,
) -> Result<(ReqBody, Option<BodyWatch>), BodyFault> {
    match body.size_hint().exact() {
        Some(0) => Ok((ReqBody::Replay(Bytes::new()), None)),
        Some(n) if n <= limit as u64 => match tokio::time::timeout(timeout, body.collect()).await {
            Ok(Ok(c)) => Ok((ReqBody::Replay(c.to_bytes()), None)),
            Ok(Err(_)) => Err(BodyFault::Unreadable),
            Err(_) => Err(BodyFault::TimedOut),
        },
        _ => {
            let (body, end) = ClientBody::new(body, timeout);
            Ok((ReqBody::Once(Some(Body::new(body))), Some(end)))
        }
    }
}

pin_project_lite::pin_project! {
    /// A streamed client body that fails when the client pauses longer
    /// than its deadline, and reports how it ended.
    pub struct ClientBody {
        #[pin]
        inner: Body,
        pause: Duration,
        // Armed while waiting for the client's next chunk.
        #[pin]
        sleep: Sleep,
        waiting: bool,
        watch: BodyWatch,
    }
}

impl ClientBody {
    /// Watch `inner`, allowing pauses up to `pause`.
    pub fn new(inner: Body, pause: Duration) -> (Self, BodyWatch) {
        let watch = BodyWatch::new();
        (
            Self {
                inner,
                pause,
                sleep: tokio::time::sleep(pause),
                waiting: false,
                watch: watch.clone(),
            },
            watch,
        )
    }
}

impl http_body::Body for ClientBody {
    type Data = Bytes;
    type Error = BodyFault;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyFault>>> {
        let mut this = self.project();
        if !*this.waiting {
            this.sleep.as_mut().reset(Instant::now() + *this.pause);
            *this.waiting = true;
            this.watch.awaiting_client();
        }
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                *this.waiting = false;
                let end = if this.inner.is_end_stream() {
                    BodyEnd::Sent
                } else {
                    BodyEnd::Sending
                };
                this.watch.record(end);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(_))) => {
                this.watch.record(BodyEnd::Fault(BodyFault::Unreadable));
                Poll::Ready(Some(Err(BodyFault::Unreadable)))
            }
            Poll::Ready(None) => {
                this.watch.record(BodyEnd::Sent);
                Poll::Ready(None)
            }
            Poll::Pending => match this.sleep.poll(cx) {
                Poll::Ready(()) => {
                    this.watch.record(BodyEnd::Fault(BodyFault::TimedOut));
                    Poll::Ready(Some(Err(BodyFault::TimedOut)))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_stalled_stream_times_out_and_a_broken_one_is_unreadable() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
        let inner = Body::new(http_body_util::StreamBody::new(tokio_stream_from(rx)));
        let (body, watch) = ClientBody::new(inner, Duration::from_millis(100));
        tx.send(Ok(Frame::data(Bytes::from_static(b"a"))))
            .await
            .expect("send");
        let mut body = std::pin::pin!(body);
        let first = body.frame().await.expect("frame").expect("ok");
        assert_eq!(first.into_data().expect("data"), "a");
        assert_eq!(watch.state().end, BodyEnd::Sending);
        assert!(!watch.state().awaiting_client);
        // A worker that reads late does not count against the client.
        tokio::time::advance(Duration::from_secs(5)).await;
        tx.send(Ok(Frame::data(Bytes::from_static(b"b"))))
            .await
            .expect("send");
        assert!(body.frame().await.expect("frame").is_ok());
        // The client stalls.
        assert_eq!(
            body.frame().await.expect("frame").expect_err("stalled"),
            BodyFault::TimedOut
        );
        assert_eq!(watch.fault(), Some(BodyFault::TimedOut));

        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
        let inner = Body::new(http_body_util::StreamBody::new(tokio_stream_from(rx)));
        let (body, watch) = ClientBody::new(inner, Duration::from_millis(100));
        tx.send(Err(std::io::Error::other("bad chunk")))
            .await
            .expect("send");
        let mut body = std::pin::pin!(body);
        assert_eq!(
            body.frame().await.expect("frame").expect_err("broken"),
            BodyFault::Unreadable
        );
        assert_eq!(watch.fault(), Some(BodyFault::Unreadable));
    }

    fn tokio_stream_from<T>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
