//! The conformance suite on `MemoryStore`.

#![allow(clippy::unwrap_used)] // tests may panic on the unexpected

use std::sync::Arc;

use pinned_store::conformance::Fixture;
use pinned_store::MemoryStore;

async fn fixture() -> Fixture {
    Fixture::new(Arc::new(MemoryStore::new()))
}

pinned_store::conformance_tests!(fixture);
