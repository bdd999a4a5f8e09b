//! An instance's abort signal: raised once when its teardown begins, and
//! awaited by its requests, open streams, background work and
//! [`Context::cancelled`](crate::Context::cancelled).
//!
//! It is a flag and a [`Notify`] stored inline in the instance record, so a
//! resident instance pays no allocation for it (a `CancellationToken` is an
//! allocation of its own, 128 bytes with the allocator's rounding, for
//! every instance that ever served a request).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

/// The abort signal of one instance record.
#[derive(Default)]
pub(crate) struct Abort {
    raised: AtomicBool,
    waiters: Notify,
}

impl Abort {
    /// Raises the signal and wakes every waiter (idempotent).
    pub(crate) fn cancel(&self) {
        if !self.raised.swap(true, Ordering::SeqCst) {
            self.waiters.notify_waiters();
        }
    }

    /// Whether the signal was raised.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.raised.load(Ordering::SeqCst)
    }

    /// Completes once the signal is raised (at once if it was already).
    pub(crate) fn cancelled(&self) -> Cancelled<'_> {
        Cancelled {
            abort: self,
            notified: self.waiters.notified(),
        }
    }
}

pin_project_lite::pin_project! {
    /// Completes when the instance is being evicted: the future
    /// [`Context::cancelled`](crate::Context::cancelled) returns.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; create a new one to wait again.
    #[must_use = "futures do nothing unless polled"]
    pub struct Cancelled<'a> {
        abort: &'a Abort,
        // Created with the future: a raise between creation and the first
        // poll is still seen (`notify_waiters` counts for every `Notified`
        // created before it).
        #[pin]
        notified: Notified<'a>,
    }
}

impl std::fmt::Debug for Cancelled<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cancelled")
            .field("is_cancelled", &self.abort.is_cancelled())
            .finish()
    }
}

impl Future for Cancelled<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        loop {
            if this.abort.is_cancelled() {
                return Poll::Ready(());
            }
            if this.notified.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // Only a raise notifies, so the flag is set now; wait afresh
            // should it not be (the loop checks it first).
            this.notified.set(this.abort.waiters.notified());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_raise_wakes_waiters_and_later_waits_complete_at_once() {
        let abort = Arc::new(Abort::default());
        let waiter = tokio::spawn({
            let abort = abort.clone();
            async move { abort.cancelled().await }
        });
        // A future created before the raise and first polled after it.
        let early = abort.cancelled();
        assert!(!abort.is_cancelled());
        abort.cancel();
        abort.cancel();
        assert!(abort.is_cancelled());
        early.await;
        waiter.await.expect("the waiter completes");
        abort.cancelled().await;
    }

    #[test]
    fn no_raise_no_completion() {
        use futures_util::FutureExt;
        let abort = Abort::default();
        assert!(abort.cancelled().now_or_never().is_none());
    }
}
