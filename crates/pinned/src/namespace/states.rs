//! The application states of a worker, shared by every instance of every
//! namespace: keyed by type, one value per type, set before the worker is
//! built and read-only afterwards. The object layer's
//! [`State`](crate::State) extractor and
//! [`Context::state`](crate::Context::state) read them.

use http::Extensions;

/// The application states of one worker, by type.
#[derive(Clone, Default)]
pub(crate) struct States(Extensions);

impl States {
    pub(crate) fn insert<S: Clone + Send + Sync + 'static>(&mut self, state: S) {
        self.0.insert(state);
    }

    pub(crate) fn get<S: Clone + Send + Sync + 'static>(&self) -> Option<S> {
        self.0.get::<S>().cloned()
    }
}
