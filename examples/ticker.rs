//! Server-sent events: `/ticker/<id>/events?count=N` streams N ticks, one a
//! second. The open stream keeps its instance alive past the idle timeout.
//!
//! ```text
//! PORT=8080 cargo run --example ticker
//! curl -N 'localhost:8080/ticker/a/events?count=5'
//! ```

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::Query;
use axum::response::sse::{Event, Sse};
use axum::routing::get;
use axum::Router;
use futures_util::stream::{self, Stream};
use pinned::{BoxError, Context, HostOptions, Object, Options, This};
use serde::Deserialize;

struct Ticker {
    served: AtomicU64,
}

#[derive(Deserialize)]
struct Ticks {
    count: Option<u64>,
}

impl Object for Ticker {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Ticker {
            served: AtomicU64::new(0),
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route("/events", get(events))
    }
}

async fn events(
    this: This<Ticker>,
    Query(ticks): Query<Ticks>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let count = ticks.count.unwrap_or(10);
    let stream = stream::unfold(0u64, move |tick| {
        let this = this.clone();
        async move {
            if tick >= count {
                return None;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            let total = this.served.fetch_add(1, Ordering::SeqCst) + 1;
            let event = Event::default().data(format!("tick {tick} (instance total {total})"));
            Some((Ok(event), tick + 1))
        }
    });
    Sse::new(stream)
}

#[tokio::main]
async fn main() -> Result<(), pinned::ServeError> {
    // Text or JSON (`PINNED_LOG_FORMAT`, `--log-format`) on stderr, no
    // colours unless it is a terminal; `RUST_LOG` filters (default info).
    pinned::logging::init();
    // A short idle timeout shows that only the open stream keeps it alive.
    let options = HostOptions::default().idle_timeout(Duration::from_secs(2));
    pinned::serve(Options::from_env().host_with::<Ticker>("/ticker", options)).await
}
