//! The durable epoch mark in Postgres (`postgresql://postgres@127.0.0.1:5432/test`,
//! or `$DATABASE_URL`): shared by every node that opens it, and it never
//! goes down.

use pinboard::clock::{DurableMark, EpochFloor, Now};
use pinboard::epoch_mark::PostgresMark;
use std::sync::Arc;

fn url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:5432/test".into())
}

#[tokio::test]
async fn two_nodes_share_one_mark_that_never_goes_down() {
    let a = Arc::new(PostgresMark::connect(&url()).expect("url"));
    let b = Arc::new(PostgresMark::connect(&url()).expect("url"));
    let start = a.load().await.expect("postgres reachable");
    a.raise(start + 10).await.expect("raise");
    assert!(b.load().await.expect("load") >= start + 10);
    b.raise(start + 5).await.expect("raise");
    assert!(
        a.load().await.expect("load") >= start + 10,
        "the mark went down"
    );

    // A floor over the mark starts above it, whatever its clock says.
    let floor = EpochFloor::with_durable(b.clone());
    let high = a.load().await.expect("load");
    let f = floor
        .floor_for_claim(Now {
            wall_ms: 1,
            mono_ms: 0,
        })
        .await;
    assert!(f > high);
}
