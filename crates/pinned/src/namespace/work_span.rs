//! The spans an instance's work runs in, when debug spans are wanted (the
//! console at debug, or traces exported): the instance span (a root:
//! namespace, id, epoch) and the work's own span under it (`request`,
//! `activation`, `tray flush`, `alarm`, ...). Both are at `debug`, as
//! tower-http's request spans: at the usual `info` there are none, and
//! the lifecycle lines name their instance in their own fields.
//!
//! Both are entered, instance first: a layer that filters the work's span
//! out still finds the instance span among the entered ones. Owns no
//! span's fields and never decides the trace's parent (that is
//! `pinned_edge::trace`).
//!
//! The instance span is the one the record keeps (made once per instance
//! and epoch, see `Record::shared_span`), shared by reference: a request
//! enters it without a span clone of its own, which cost the subscriber
//! about 600 instructions a request (`worker-bench`).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};

use tracing::span::Entered;
use tracing::Span;

/// The instance span and the work's own (`Span::none()` when disabled).
#[derive(Debug, Clone)]
pub(crate) struct WorkSpan {
    instance: Arc<Span>,
    work: Span,
}

/// The instance span of an instance nothing listens to.
static NO_INSTANCE: LazyLock<Arc<Span>> = LazyLock::new(|| Arc::new(Span::none()));

/// Both spans entered; the work's is left first.
pub(crate) struct EnteredWork<'a> {
    _work: Entered<'a>,
    _instance: Entered<'a>,
}

impl WorkSpan {
    /// `work` (a child of `instance`, or `Span::none()`) inside `instance`
    /// (`None`: nothing listens to the instance).
    pub(crate) fn new(instance: Option<Arc<Span>>, work: Span) -> Self {
        Self {
            instance: instance.unwrap_or_else(|| NO_INSTANCE.clone()),
            work,
        }
    }

    /// Enters both (the instance's first).
    pub(crate) fn enter(&self) -> EnteredWork<'_> {
        let instance = self.instance.enter();
        EnteredWork {
            _work: self.work.enter(),
            _instance: instance,
        }
    }

    /// Runs `f` inside both.
    pub(crate) fn in_scope<T>(&self, f: impl FnOnce() -> T) -> T {
        let _entered = self.enter();
        f()
    }

    /// `future`, entering both on every poll and when it is dropped.
    pub(crate) fn instrument<F: Future>(self, future: F) -> InSpan<F> {
        InSpan {
            span: self,
            future: Some(future),
        }
    }
}

pin_project_lite::pin_project! {
    /// A future run inside a [`WorkSpan`] ([`WorkSpan::instrument`]).
    ///
    /// Unlike tracing's `Instrumented`, a future that finished is dropped
    /// inside the poll that finished it, already in the spans: its drop
    /// needs no second entry (`worker-bench`: about 2 500 instructions of a
    /// new id at `info`). One dropped unfinished is dropped in the spans.
    pub(crate) struct InSpan<F> {
        span: WorkSpan,
        #[pin]
        future: Option<F>,
    }

    impl<F> PinnedDrop for InSpan<F> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            if this.future.is_some() {
                let _entered = this.span.enter();
                this.future.set(None);
            }
        }
    }
}

impl<F: Future> Future for InSpan<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        let _entered = this.span.enter();
        let Some(future) = this.future.as_mut().as_pin_mut() else {
            panic!("InSpan polled after it finished");
        };
        let output = std::task::ready!(future.poll(cx));
        this.future.set(None);
        Poll::Ready(output)
    }
}
