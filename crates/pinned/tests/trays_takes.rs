//! `Queue::take` across a failed run: the takes of a handler run that
//! returned an error are back at the front for its redelivery in the same
//! activation, as a restore puts them after a crash, and land with the ack
//! of the run that succeeds.
#![allow(clippy::unwrap_used)] // tests may panic on the unexpected

mod support;

use std::sync::Arc;

use axum::routing::post;
use axum::Router;
use pinned::pinned_store::{MemoryStore, TrayKey};
use pinned::tray::{Fields, Queue, Tray, TrayCtx, TrayError, TrayHandler, Trays, Value};
use pinned::{BoxError, Context, Object, Options};
use serde_json::json;
use support::{eventually, start, PATIENCE};

/// One item whose handler takes a part from `parts` per run.
#[derive(Default)]
struct Assembly {
    queue: Queue<u32>,
    parts: Queue<String>,
    used: Value<Vec<String>>,
}

impl Tray for Assembly {
    const NAME: &'static str = "assembly";
    type Item = u32;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("queue", &mut self.queue);
        fields.field("parts", &mut self.parts);
        fields.field("used", &mut self.used);
    }

    fn head(&self) -> Option<u32> {
        self.queue.front().copied()
    }

    fn ack(&mut self, _item: &u32) {
        self.queue.pop_front();
    }
}

struct Plant;

async fn build(ctx: Context) -> Result<&'static str, TrayError> {
    let assembly = ctx.tray::<Assembly>().await?;
    assembly
        .admit(|assembly| {
            assembly.queue.push_back(1);
            assembly.parts.push_back("a".into());
            assembly.parts.push_back("b".into());
        })?
        .await?;
    Ok("admitted")
}

impl Object for Plant {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Plant)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route("/build", post(build))
    }

    fn trays() -> Trays<Self> {
        Trays::new().singleton::<Assembly>()
    }
}

impl TrayHandler<Assembly> for Plant {
    async fn handle(&self, ctx: TrayCtx<Assembly>, _item: u32) -> Result<(), BoxError> {
        let (taken, _) = ctx.tray().update(|assembly| assembly.parts.take(1))?;
        if ctx.attempts() == 1 {
            return Err("the first run fails after its take".into());
        }
        ctx.on_ack(move |assembly| assembly.used.extend(taken));
        Ok(())
    }
}

#[tokio::test]
async fn a_failed_runs_takes_are_back_at_the_front_for_its_redelivery() {
    let store = Arc::new(MemoryStore::new());
    let w = start(Options::new().host::<Plant>("/plants").store(store.clone())).await;
    assert_eq!(w.post("/plants/p/build").await.status(), 200);
    let doc = eventually("the item acked", PATIENCE, || async {
        let (marked, doc) =
            support::stored_tray(&*store, "/plants", "p", TrayKey::singleton("assembly"))
                .await
                .expect("the assembly row");
        (!marked).then_some(doc)
    })
    .await;
    assert_eq!(
        doc,
        json!({"parts": ["b"], "used": ["a"]}),
        "the redelivery took the part the failed run took, and its take landed with the ack"
    );
    w.worker.close().await;
}
