//! The spans an instance's work runs in: the instance span (info, a root:
//! namespace, id, epoch) and, when debug spans are wanted (the console at
//! debug, or traces exported), the work's own debug span under it
//! (`request`, `activation`, `tray flush`, `alarm`, ...).
//!
//! Both are entered, instance first: a layer that filters the work's span
//! out (the console at info while the OTLP layer takes debug spans) still
//! finds the instance span among the entered ones, so a line logged in the
//! work names its instance. Owns no span's fields and never decides the
//! trace's parent (that is `pinned_edge::trace`).
//!
//! The instance span is the one the record keeps (made once per instance
//! and epoch, see `Record::shared_span`), shared by reference: a request
//! at `info` enters it without a span clone of its own, which cost the
//! subscriber about 600 instructions a warm request (`worker-bench`).

use std::future::Future;
use std::sync::{Arc, LazyLock};

use tracing::instrument::Instrumented;
use tracing::span::Entered;
use tracing::{Instrument as _, Span};

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

    /// `future`, entering both on every poll.
    pub(crate) fn instrument<F: Future>(self, future: F) -> Instrumented<Instrumented<F>> {
        future
            .instrument(self.work)
            .instrument(Span::clone(&self.instance))
    }
}
