//! An instance's abort signal: raised once when its teardown begins, and
//! awaited by its requests, open streams, background work and
//! [`Context::cancelled`](crate::Context::cancelled).
//!
//! It is a flag and a [`Notify`] stored inline in the instance record (the
//! flag packed beside the record's other flags), so a resident instance
//! pays no allocation for it: a `CancellationToken` is an allocation of its
//! own, 128 bytes with the allocator's rounding, for every instance that
//! ever served a request.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

/// Raises the signal made of `raised` and `waiters`, waking every waiter
/// (idempotent).
pub(crate) fn raise(raised: &AtomicBool, waiters: &Notify) {
    if !raised.swap(true, Ordering::SeqCst) {
        waiters.notify_waiters();
    }
}

/// Completes once `raised` is set by [`raise`] (at once if it is already).
pub(crate) fn cancelled<'a>(raised: &'a AtomicBool, waiters: &'a Notify) -> Cancelled<'a> {
    Cancelled {
        raised,
        waiters,
        notified: waiters.notified(),
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
        raised: &'a AtomicBool,
        waiters: &'a Notify,
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
            .field("is_cancelled", &self.raised.load(Ordering::SeqCst))
            .finish()
    }
}

impl Future for Cancelled<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        loop {
            if this.raised.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            if this.notified.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // Only a raise notifies, so the flag is set now; wait afresh
            // should it not be (the loop checks it first).
            this.notified.set(this.waiters.notified());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;
    use std::sync::Arc;

    #[derive(Default)]
    struct Signal {
        raised: AtomicBool,
        waiters: Notify,
    }

    #[tokio::test]
    async fn a_raise_wakes_waiters_and_later_waits_complete_at_once() {
        let signal = Arc::new(Signal::default());
        let waiter = tokio::spawn({
            let signal = signal.clone();
            async move { cancelled(&signal.raised, &signal.waiters).await }
        });
        // A future created before the raise and first polled after it.
        let early = cancelled(&signal.raised, &signal.waiters);
        raise(&signal.raised, &signal.waiters);
        raise(&signal.raised, &signal.waiters);
        early.await;
        waiter.await.expect("the waiter completes");
        cancelled(&signal.raised, &signal.waiters).await;
    }

    #[test]
    fn no_raise_no_completion() {
        let signal = Signal::default();
        assert!(cancelled(&signal.raised, &signal.waiters)
            .now_or_never()
            .is_none());
    }
}
