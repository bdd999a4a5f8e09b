//! The output gate of trays: a handler's `after_ack` hook runs only once
//! its item's ack (with its `on_ack` edits) is in the store. Checked where
//! it matters, with the store failing each write in turn: whenever a hook
//! runs (a reply pushed to a client), the store already holds what the
//! reply says, and no reply is pushed twice. (A reply whose ack landed but
//! whose answer was lost is never pushed: as after a crash between the
//! ack and the push, the client reads it from the store.)

mod support;

use std::sync::Arc;

use axum::extract::Path;
use axum::routing::post;
use axum::{Json, Router};
use parking_lot::Mutex;
use pinned::pinned_store::{FailingStore, MemoryStore, StateStore, TrayKey};
use pinned::tray::{Fields, Queue, Tray, TrayCtx, TrayError, TrayHandler, Trays, Value};
use pinned::{BoxError, Context, Object, Options};
use serde_json::json;
use support::{eventually, start, PATIENCE};

/// What the hooks saw: each pushed name, and whether the store held it in
/// `done` when its hook ran.
#[derive(Clone)]
struct Lab {
    store: Arc<MemoryStore>,
    pushed: Arc<Mutex<Vec<(String, bool)>>>,
}

#[derive(Default)]
struct Replies {
    queue: Queue<String>,
    done: Value<Vec<String>>,
}

impl Tray for Replies {
    const NAME: &'static str = "replies";
    type Item = String;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("queue", &mut self.queue);
        fields.field("done", &mut self.done);
    }

    fn head(&self) -> Option<String> {
        self.queue.front().cloned()
    }

    fn ack(&mut self, _item: &String) {
        self.queue.pop_front();
    }
}

/// The names in instance `id`'s `done`, as the store holds them now.
async fn stored(store: &MemoryStore, id: &str) -> Vec<String> {
    let row = support::stored_tray(store, "/rooms", id, TrayKey::singleton("replies")).await;
    row.and_then(|(_, doc)| serde_json::from_value(doc.get("done")?.clone()).ok())
        .unwrap_or_default()
}

struct Room {
    lab: Lab,
}

impl Object for Room {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        Ok(Room {
            lab: ctx.state().ok_or("no lab")?,
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route("/say/{name}", post(say))
    }

    fn trays() -> Trays<Self> {
        Trays::new().singleton::<Replies>()
    }
}

impl TrayHandler<Replies> for Room {
    async fn handle(&self, ctx: TrayCtx<Replies>, name: String) -> Result<(), BoxError> {
        let stored_name = name.clone();
        ctx.on_ack(move |replies| replies.done.push(stored_name));
        let lab = self.lab.clone();
        let id = ctx.context().id().to_owned();
        ctx.after_ack(move || {
            // The memory store answers without waiting on anything: read
            // it here, at the moment the reply would leave.
            let held = futures_util::FutureExt::now_or_never(stored(&lab.store, &id))
                .is_some_and(|done| done.contains(&name));
            lab.pushed.lock().push((name, held));
        });
        Ok(())
    }
}

async fn say(ctx: Context, Path(name): Path<String>) -> Result<Json<serde_json::Value>, TrayError> {
    let replies = ctx.tray::<Replies>().await?;
    replies
        .admit(|replies| replies.queue.push_back(name))?
        .await?;
    Ok(Json(json!({ "ok": true })))
}

/// One run: four items through a worker whose store fails write
/// `fail_at` (`applied`: after applying it), then a fresh worker on the
/// surviving rows. Answers the names pushed, with what the store held at
/// each push, and the final `done` list.
async fn run(fail_at: usize, applied: bool) -> (Vec<(String, bool)>, Vec<String>) {
    let inner = Arc::new(MemoryStore::new());
    let flaky = Arc::new(FailingStore::new(inner.clone(), fail_at, applied));
    let lab = Lab {
        store: inner.clone(),
        pushed: Arc::default(),
    };
    let first = start(
        Options::new()
            .host::<Room>("/rooms")
            .state(lab.clone())
            .store(flaky.clone()),
    )
    .await;
    let mut acknowledged = 0;
    for n in 0..4 {
        if first.post(&format!("/rooms/r/say/n{n}")).await.status() == 200 {
            acknowledged += 1;
        }
    }
    eventually("the first worker done or failed", PATIENCE, || async {
        let drained = inner.marked_instances(None, 1).await.ok()?.is_empty();
        let pushed = lab.pushed.lock().len();
        (flaky.failed() || (drained && pushed == acknowledged)).then_some(())
    })
    .await;
    first.worker.close().await;

    let second = start(
        Options::new()
            .host::<Room>("/rooms")
            .state(lab.clone())
            .store(inner.clone()),
    )
    .await;
    eventually("the second worker drained", PATIENCE, || async {
        inner
            .marked_instances(None, 1)
            .await
            .ok()?
            .is_empty()
            .then_some(())
    })
    .await;
    let done = stored(&inner, "r").await;
    second.worker.close().await;
    let pushed = lab.pushed.lock().clone();
    (pushed, done)
}

#[tokio::test]
async fn an_after_ack_hook_runs_only_once_its_ack_is_in_the_store() {
    // Without a failure: each of the four pushed once, each after its ack.
    let (pushed, done) = run(usize::MAX, false).await;
    assert_eq!(done, ["n0", "n1", "n2", "n3"]);
    assert_eq!(
        pushed,
        ["n0", "n1", "n2", "n3"].map(|n| (n.to_owned(), true)),
    );
    // A failure at every write, before and after it is applied: nothing is
    // ever pushed that the store does not hold, and nothing twice (an item
    // whose ack failed unapplied is redone by the second worker and pushed
    // there, once).
    for fail_at in 1..=12 {
        for applied in [false, true] {
            let (pushed, done) = run(fail_at, applied).await;
            let mut seen = std::collections::HashSet::new();
            for (name, held) in &pushed {
                assert!(
                    held,
                    "write {fail_at} (applied {applied}): {name} pushed before its ack landed"
                );
                assert!(
                    done.contains(name),
                    "write {fail_at}: {name} pushed, not done"
                );
                assert!(
                    seen.insert(name),
                    "write {fail_at} (applied {applied}): {name} pushed twice: {pushed:?}"
                );
            }
        }
    }
}
