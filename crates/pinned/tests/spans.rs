//! Everything an instance does runs in its tracing span: a handler's log
//! line carries the instance (namespace, id, epoch) and the request
//! (method, path); background work carries the instance. The instance span
//! is kept with the instance and made again when its epoch changes.

mod support;

use std::io::Write;
use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use parking_lot::Mutex;
use pinned::{BoxError, Call, Context, Object, Options};
use support::{eventually, start, PATIENCE};

/// Collects formatted log lines.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

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
    let lines = Lines::default();
    let writer = lines.clone();
    // The request span is at debug (as tower-http's).
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
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
        let text = String::from_utf8_lossy(&lines.0.lock()).into_owned();
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

/// At `info` the request span (debug) is left out, and a handler's lines
/// still name their instance.
#[tokio::test]
async fn at_info_handler_lines_carry_the_instance_without_a_request_span() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let w = start(Options::new().host::<Chatty>("/chatty")).await;
    let answer = w
        .client
        .get(w.url("/chatty/b/hello"))
        .header("pinboard-epoch", "3")
        .send()
        .await
        .expect("send");
    assert_eq!(answer.status(), 200);
    let handler = eventually("the handler's line", PATIENCE, || {
        let text = String::from_utf8_lossy(&lines.0.lock()).into_owned();
        std::future::ready(
            text.lines()
                .find(|l| l.contains("from the handler"))
                .map(str::to_owned),
        )
    })
    .await;
    assert!(
        handler.contains("instance{namespace=/chatty id=b epoch=3}")
            && !handler.contains("request{"),
        "{handler}"
    );
}

/// The instance span is made once and kept with the instance, and made
/// again when the instance adopts a newer placement epoch: each handler
/// line names the epoch its request was served under.
#[tokio::test]
async fn a_kept_instance_span_names_the_newest_epoch() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
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
        let text = String::from_utf8_lossy(&lines.0.lock()).into_owned();
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
