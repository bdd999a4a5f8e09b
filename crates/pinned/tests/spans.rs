//! At `debug`, everything an instance does runs in its tracing span: a
//! handler's log line carries the instance (namespace, id, epoch) and the
//! request (method, path); background work carries the instance. The
//! instance span is kept with the instance and made again when its epoch
//! changes. At `info` there are no such spans (both are debug, as
//! tower-http's request spans): the lifecycle lines name the instance in
//! their own fields.
//! Churn lines (activations, evictions) are written at `info` up to the
//! namespace's budget a second, the rest counted in one line. The warning
//! of a library error answered to a request (a store outage, a tray write
//! cut short) names its instance in its own fields at `info` too.

mod support;

use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;
use pinned::pinned_store::{FailingStore, MemoryStore, Outage};
use pinned::tray::TrayError;
use pinned::{BoxError, Call, Context, HostOptions, InstanceStoreError, Object, Options};
use support::{eventually, start, PATIENCE};
use test_support::LogLines;

struct Chatty;

impl Object for Chatty {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        ctx.spawn(async {
            tracing::info!("from the background");
        });
        Ok(Chatty)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route(
            "/hello",
            get(|_call: Call| async {
                tracing::info!("from the handler");
                "hi"
            }),
        )
    }
}

#[tokio::test]
async fn log_lines_carry_the_instance_and_the_request() {
    // The request span is at debug (as tower-http's).
    let (lines, _guard) = LogLines::capture(tracing::Level::DEBUG);
    let w = start(Options::new().host::<Chatty>("/chatty")).await;
    let answer = w
        .client
        .get(w.url("/chatty/a/hello"))
        .header("pinboard-epoch", "7")
        .send()
        .await
        .expect("send");
    assert_eq!(answer.status(), 200);
    let (handler, background) = eventually("both log lines", PATIENCE, || {
        let text = lines.text();
        let line = |needle: &str| text.lines().find(|l| l.contains(needle)).map(str::to_owned);
        std::future::ready(line("from the handler").zip(line("from the background")))
    })
    .await;
    assert!(
        handler.contains("instance{namespace=/chatty id=a epoch=7}")
            && handler.contains("request{method=GET path=/hello}"),
        "{handler}"
    );
    assert!(
        background.contains("instance{namespace=/chatty id=a epoch=7}"),
        "{background}"
    );
}

/// At `info` neither span is made (both are debug): a handler's line
/// carries none, and the activation's line names its instance in its own
/// fields.
#[tokio::test]
async fn at_info_lines_carry_no_span_and_the_activation_names_its_instance() {
    let (lines, _guard) = LogLines::capture(tracing::Level::INFO);
    let w = start(Options::new().host::<Chatty>("/chatty")).await;
    let answer = w
        .client
        .get(w.url("/chatty/b/hello"))
        .header("pinboard-epoch", "3")
        .send()
        .await
        .expect("send");
    assert_eq!(answer.status(), 200);
    let (handler, activated) =
        eventually("the handler's and the activation's lines", PATIENCE, || {
            let text = lines.text();
            let find = |what: &str| text.lines().find(|l| l.contains(what)).map(str::to_owned);
            std::future::ready(find("from the handler").zip(find("activated instance")))
        })
        .await;
    assert!(
        !handler.contains("instance{") && !handler.contains("request{"),
        "{handler}"
    );
    assert!(
        !activated.contains("instance{")
            && activated.contains("namespace=/chatty")
            && activated.contains("id=b"),
        "{activated}"
    );
}

/// The instance span is made once and kept with the instance, and made
/// again when the instance adopts a newer placement epoch: each handler
/// line names the epoch its request was served under.
#[tokio::test]
async fn a_kept_instance_span_names_the_newest_epoch() {
    let (lines, _guard) = LogLines::capture(tracing::Level::DEBUG);
    let w = start(Options::new().host::<Chatty>("/chatty")).await;
    for epoch in ["3", "3", "5"] {
        let answer = w
            .client
            .get(w.url("/chatty/c/hello"))
            .header("pinboard-epoch", epoch)
            .send()
            .await
            .expect("send");
        assert_eq!(answer.status(), 200);
    }
    let handler = eventually("three handler lines", PATIENCE, || {
        let text = lines.text();
        let found: Vec<String> = text
            .lines()
            .filter(|l| l.contains("from the handler"))
            .map(str::to_owned)
            .collect();
        std::future::ready((found.len() == 3).then_some(found))
    })
    .await;
    let named = |line: &str, epoch: &str| {
        line.contains(&format!("instance{{namespace=/chatty id=c epoch={epoch}}}"))
    };
    assert!(
        named(&handler[0], "3") && named(&handler[1], "3") && named(&handler[2], "5"),
        "{handler:#?}"
    );
}

/// A durable object whose tray handler and alarm log a line each.
struct Durable;

#[derive(Default)]
struct Notes {
    queue: pinned::tray::Queue<String>,
}

impl pinned::tray::Tray for Notes {
    const NAME: &'static str = "notes";
    type Item = String;

    fn fields(&mut self, fields: &mut pinned::tray::Fields<'_>) {
        fields.field("queue", &mut self.queue);
    }

    fn head(&self) -> Option<String> {
        self.queue.front().cloned()
    }

    fn ack(&mut self, _note: &String) {
        self.queue.pop_front();
    }
}

impl Object for Durable {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Durable)
    }

    async fn alarm(&self, _ctx: &Context) -> Result<(), BoxError> {
        tracing::info!("from the alarm");
        Ok(())
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route(
                "/note",
                axum::routing::post(|call: Call| async move {
                    let notes = call
                        .ctx()
                        .tray::<Notes>()
                        .await
                        .map_err(|e| e.to_string())?;
                    let receipt = notes
                        .admit(|notes| notes.queue.push_back("n".into()))
                        .map_err(|e| e.to_string())?;
                    receipt.await.map_err(|e| e.to_string())?;
                    call.ctx()
                        .alarm()
                        .set_in(std::time::Duration::from_millis(10))
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok::<_, String>("noted")
                }),
            )
            .route("/read", get(read))
            .route("/admit", post(admit))
    }

    fn trays() -> pinned::tray::Trays<Self> {
        pinned::tray::Trays::new().singleton::<Notes>()
    }
}

impl pinned::tray::TrayHandler<Notes> for Durable {
    async fn handle(
        &self,
        _ctx: pinned::tray::TrayCtx<Notes>,
        _note: String,
    ) -> Result<(), BoxError> {
        tracing::info!("from the tray handler");
        Ok(())
    }
}

/// A store read answered with the library's error (`?`).
async fn read(ctx: Context) -> Result<String, InstanceStoreError> {
    let store = ctx.store().expect("a store is configured");
    let note: Option<String> = store.get("notes", "~").await?;
    Ok(note.unwrap_or_default())
}

/// A tray admission answered with the library's error (`?`).
async fn admit(ctx: Context) -> Result<&'static str, TrayError> {
    let notes = ctx.tray::<Notes>().await?;
    notes
        .admit(|notes| notes.queue.push_back("n".into()))?
        .await?;
    Ok("admitted")
}

/// A tray handler's lines and an alarm run's name their instance once
/// (the instance span is a root: work enlisted by a handler used to nest
/// it once per hop), and at debug carry the work's own span.
#[tokio::test]
async fn tray_handler_and_alarm_lines_name_their_instance_once() {
    let (lines, _guard) = LogLines::capture(tracing::Level::DEBUG);
    let store: Arc<dyn pinned::pinned_store::StateStore> =
        Arc::new(pinned::pinned_store::MemoryStore::new());
    let w = start(Options::new().host::<Durable>("/durable").store(store)).await;
    let answer = w
        .client
        .post(w.url("/durable/c/note"))
        .send()
        .await
        .expect("send");
    assert_eq!(answer.status(), 200, "{:?}", answer.text().await);
    let (tray, alarm) = eventually("the tray handler's and the alarm's lines", PATIENCE, || {
        let text = lines.text();
        let line = |needle: &str| text.lines().find(|l| l.contains(needle)).map(str::to_owned);
        std::future::ready(line("from the tray handler").zip(line("from the alarm")))
    })
    .await;
    for line in [&tray, &alarm] {
        assert_eq!(line.matches("instance{").count(), 1, "{line}");
        assert!(line.contains("instance{namespace=/durable id=c"), "{line}");
    }
    assert!(alarm.contains("}:alarm: "), "{alarm}");
}

/// The `name=value` field of a text-format line, as a number.
fn field(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

/// A burst of new ids writes the budget's `activated instance` lines at
/// `info` and counts the rest into an overflow line, so every activation
/// is accounted for once.
#[tokio::test]
async fn churn_past_the_budget_is_counted_not_written_line_by_line() {
    const IDS: u64 = 12;
    let (lines, _guard) = LogLines::capture(tracing::Level::INFO);
    let options = HostOptions::default()
        .churn_lines_per_second(3)
        .sweep_interval(std::time::Duration::from_millis(50));
    let w = start(Options::new().host_with::<Chatty>("/chatty", options)).await;
    for n in 0..IDS {
        let answer = w
            .client
            .get(w.url(&format!("/chatty/n{n}/hello")))
            .send()
            .await
            .expect("send");
        assert_eq!(answer.status(), 200);
    }
    // The last window's count comes with a sweep once it closed.
    let (written, counted) = eventually("every activation accounted for", PATIENCE, || {
        let text = lines.text();
        let written = text
            .lines()
            .filter(|l| l.contains("activated instance"))
            .count() as u64;
        let counted: u64 = text
            .lines()
            .filter(|l| l.contains("over the log budget"))
            .map(|l| field(l, "activated"))
            .sum();
        std::future::ready((written + counted == IDS).then_some((written, counted)))
    })
    .await;
    // Twelve requests take well under the four seconds it would take to
    // write them all within a budget of three a second.
    assert!(
        counted > 0 && written >= 3,
        "written {written}, counted {counted}"
    );
}

/// At `info` (no instance span) the warning of a library error that
/// answered a request names the instance in its own fields: a store outage
/// under a read (503 `state store unavailable; retry`) and a tray write the
/// outage cut short (503 `instance aborted`).
#[tokio::test]
async fn at_info_a_failed_answer_names_its_instance() {
    let (lines, _guard) = LogLines::capture(tracing::Level::INFO);
    let store = Arc::new(FailingStore::passing(Arc::new(MemoryStore::new())));
    let w = start(
        Options::new()
            .host::<Durable>("/durable")
            .store(store.clone()),
    )
    .await;
    assert_eq!(w.get("/durable/r/read").await.status(), 200);
    assert_eq!(w.post("/durable/t/admit").await.status(), 200);

    store.set_outage(Outage::All);
    assert_eq!(w.get("/durable/r/read").await.status(), 503);
    store.set_outage(Outage::Writes);
    assert_eq!(w.post("/durable/t/admit").await.status(), 503);
    store.set_outage(Outage::None);

    let (unavailable, cut) = eventually("both warnings", PATIENCE, || {
        let text = lines.text();
        let find = |what: &str| text.lines().find(|l| l.contains(what)).map(str::to_owned);
        std::future::ready(find("state store unavailable").zip(find("tray write cut short")))
    })
    .await;
    for (line, id) in [(&unavailable, "id=r"), (&cut, "id=t")] {
        assert!(
            line.contains(" WARN ")
                && line.contains("namespace=/durable")
                && line.split_whitespace().any(|word| word == id)
                && !line.contains("instance{"),
            "{line}"
        );
    }
    // The cause stays in the log, once.
    assert!(unavailable.contains("error="), "{unavailable}");
    let text = lines.text();
    assert_eq!(text.matches("state store unavailable").count(), 1, "{text}");
}
