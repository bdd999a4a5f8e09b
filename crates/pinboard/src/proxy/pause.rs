//! The longest pause in a worker's answer body: a relayed body that sends
//! nothing for `--upstream-body-timeout-ms` is aborted.
//!
//! Owns [`PauseBound`], a body wrapper, and its one deadline. Never ends a
//! body cleanly on the worker's behalf: past the deadline it yields an
//! error, so the client's answer is cut (chunked: no last chunk; a known
//! length: the connection closes short), never passed off as complete.
//!
//! # What counts as a pause
//!
//! The time the body is polled and has nothing, from the first such poll
//! after a frame (or after the head) until the next frame: nginx's
//! `proxy_read_timeout`, which bounds the time between two reads. While
//! the client is slow to take what came, the body is not polled and no
//! pause runs: backpressure from the client is not the worker's stall.
//! Upgraded connections (WebSockets) are spliced, not relayed as a body,
//! and have no such bound.
//!
//! # Hot path
//!
//! Most answers arrive whole with their head and are never pending: no
//! timer is made for them. A body that pauses gets one timer, reset at
//! each later pause.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use tokio::time::{Instant, Sleep};

use crate::upstream::BodyError;

/// The worker's answer body paused longer than the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the worker sent nothing of its answer body for {0:?}")]
pub struct BodyStalled(pub Duration);

pin_project_lite::pin_project! {
    /// `body`, aborted when it pauses longer than `limit` (module doc);
    /// `stalls` counts the aborts.
    pub struct PauseBound<B> {
        #[pin]
        body: B,
        limit: Duration,
        stalls: Counter,
        // Made at the first pause, reset at each later one.
        timer: Option<Pin<Box<Sleep>>>,
        // A pause is running (`timer` is set for it).
        pausing: bool,
        // The bound was passed: the body is over, as an error.
        stalled: bool,
    }
}

impl<B> PauseBound<B> {
    /// `body` with at most `limit` between two of its frames.
    pub fn new(body: B, limit: Duration, stalls: Counter) -> Self {
        Self {
            body,
            limit,
            stalls,
            timer: None,
            pausing: false,
            stalled: false,
        }
    }
}

impl<B> Body for PauseBound<B>
where
    B: Body<Data = Bytes, Error = BodyError>,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.project();
        if *this.stalled {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = this.body.poll_frame(cx) {
            *this.pausing = false;
            if !matches!(frame, Some(Ok(_))) {
                // Over: a timer left armed would only wake the task for nothing.
                *this.timer = None;
            }
            return Poll::Ready(frame);
        }
        if !*this.pausing {
            *this.pausing = true;
            // A limit too far to represent never fires.
            let Some(deadline) = Instant::now().checked_add(*this.limit) else {
                return Poll::Pending;
            };
            match this.timer {
                Some(timer) => timer.as_mut().reset(deadline),
                None => *this.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        let Some(timer) = this.timer.as_mut() else {
            return Poll::Pending;
        };
        ready!(timer.as_mut().poll(cx));
        *this.stalled = true;
        *this.timer = None;
        this.stalls.inc();
        tracing::debug!(target: "pinboard::proxy", limit = ?this.limit, "worker answer body stalled; aborted");
        Poll::Ready(Some(Err(Box::new(BodyStalled(*this.limit)))))
    }

    fn is_end_stream(&self) -> bool {
        self.stalled || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    type Frames = futures_util::stream::BoxStream<'static, Result<Frame<Bytes>, BodyError>>;

    /// A body of `parts`, each after its delay.
    fn paced(parts: Vec<(u64, &'static str)>) -> StreamBody<Frames> {
        let stream = futures_util::stream::unfold(parts.into_iter(), |mut rest| async move {
            let (ms, text) = rest.next()?;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Some((Ok(Frame::data(Bytes::from_static(text.as_bytes()))), rest))
        });
        StreamBody::new(Box::pin(stream) as Frames)
    }

    #[tokio::test(start_paused = true)]
    async fn pauses_under_the_limit_pass_and_a_longer_one_aborts() {
        let stalls = Counter::default();
        let body = paced(vec![(0, "a"), (900, "b"), (999, "c"), (1001, "never")]);
        let mut bound = std::pin::pin!(PauseBound::new(
            body,
            Duration::from_secs(1),
            stalls.clone()
        ));
        let mut got = Vec::new();
        let error = loop {
            match bound.frame().await {
                Some(Ok(frame)) => got.extend_from_slice(&frame.into_data().expect("data")),
                Some(Err(e)) => break e,
                None => panic!("ended cleanly"),
            }
        };
        assert_eq!(got, b"abc");
        assert_eq!(
            error.downcast_ref::<BodyStalled>(),
            Some(&BodyStalled(Duration::from_secs(1)))
        );
        assert_eq!(stalls.get(), 1);
        assert!(bound.frame().await.is_none(), "nothing after the abort");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_is_never_pending_makes_no_timer() {
        let body = http_body_util::Full::new(Bytes::from_static(b"whole"))
            .map_err(|never| -> BodyError { match never {} });
        let mut bound = std::pin::pin!(PauseBound::new(
            body,
            Duration::from_secs(1),
            Counter::default()
        ));
        let frame = bound.frame().await.expect("frame").expect("data");
        assert_eq!(frame.into_data().expect("data"), "whole");
        assert!(bound.frame().await.is_none());
        assert!(bound.timer.is_none());
    }
}
