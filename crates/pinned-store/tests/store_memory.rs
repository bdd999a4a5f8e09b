//! The conformance suite on `MemoryStore`.

#![allow(clippy::unwrap_used)] // tests may panic on the unexpected

use std::sync::Arc;

use pinned_store::conformance::Fixture;
use pinned_store::MemoryStore;

async fn fixture() -> Fixture {
    Fixture::new(Arc::new(MemoryStore::new()))
}

pinned_store::conformance_tests!(fixture);

#[tokio::test]
async fn reclaim_fences_spares_written_and_recent_instances() {
    let fixture = fixture().await;
    pinned_store::conformance::reclaim_fences_spares_written_and_recent_instances(
        fixture.store.clone(),
        &fixture.ns,
    )
    .await;
}
