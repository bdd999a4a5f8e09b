//! The counters the worker benchmarks compare: the counter object
//! served by a pinned worker, and the same handler in a bare axum app (the
//! baseline), each as a server a bench starts as a child process
//! (`serve-pinned`, `serve-bare` of [`crate::deploy::Serve`]).
//!
//! Owns the two servers and what preloads them; never measures anything.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::Path;
use axum::routing::post;
use axum::{Json, Router};
use dashmap::DashMap;
use futures_util::StreamExt;
use pinned::{BoxError, Context, HostOptions, Object, Options, This};
use serde_json::{json, Value};

/// The benchmarked object: the counter.
pub struct Counter {
    /// The count.
    value: AtomicU64,
}

async fn increment(this: This<Counter>) -> Json<Value> {
    Json(json!({ "value": this.value.fetch_add(1, Ordering::Relaxed) + 1 }))
}

impl Object for Counter {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Counter {
            value: AtomicU64::new(0),
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route("/increment", post(increment))
    }
}

/// The pinned worker hosting [`Counter`] at `/counter` (up to 50 million
/// instances), with no settings from the environment.
fn worker_options() -> Options {
    Options::new()
        .env_vars(Vec::<(String, String)>::new())
        .host_with::<Counter>("/counter", HostOptions::default().max_instances(50_000_000))
}

/// The ids the `--resident` instances and counters have: `r0`, `r1`, ….
fn resident_id(i: usize) -> String {
    format!("r{i}")
}

/// The increment path of resident id `i` under `base`.
pub fn resident_path(base: &str, i: usize) -> String {
    format!("{base}/{}/increment", resident_id(i))
}

/// Serves the pinned worker hosting [`Counter`] at `/counter` on
/// `127.0.0.1:0` with `resident` instances activated first; prints
/// `pinned worker listening on http://<addr>`.
///
/// # Errors
///
/// The worker cannot be built, preloaded or served.
pub async fn serve_pinned(resident: usize) -> anyhow::Result<()> {
    let worker = worker_options().build()?;
    post_all(
        &worker.router(),
        (0..resident).map(|i| resident_path("/counter", i)),
    )
    .await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!(
        "pinned worker listening on http://{}",
        listener.local_addr()?
    );
    pinned::serve(worker).listener(listener).await?;
    Ok(())
}

/// The bare baseline, the "minimal axum counter": a path
/// extractor, a `Mutex<HashMap>` of counters and a JSON answer for warm
/// requests (every id already present after its first request), and a
/// concurrent map insert per new id for activations.
///
/// # Errors
///
/// The listener cannot be bound or the server fails.
pub async fn serve_bare(resident: usize) -> anyhow::Result<()> {
    let warm: Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>> = Arc::new(
        std::sync::Mutex::new((0..resident).map(|i| (resident_id(i), 0)).collect()),
    );
    let map: Arc<DashMap<String, Arc<Counter>>> = Arc::new(DashMap::new());
    let app = Router::new()
        .route(
            "/counter/{id}/increment",
            post(move |Path(id): Path<String>| {
                let warm = warm.clone();
                async move {
                    let value = {
                        let mut counters = warm.lock().unwrap_or_else(|e| e.into_inner());
                        let value = counters.entry(id).or_insert(0);
                        *value += 1;
                        *value
                    };
                    Json(json!({ "value": value }))
                }
            }),
        )
        .route(
            "/fresh/{id}/increment",
            post(move |Path(id): Path<String>| {
                let map = map.clone();
                async move {
                    let counter = map
                        .entry(id)
                        .or_insert_with(|| {
                            Arc::new(Counter {
                                value: AtomicU64::new(0),
                            })
                        })
                        .clone();
                    Json(json!({ "value": counter.value.fetch_add(1, Ordering::Relaxed) + 1 }))
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("bare axum listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

/// POSTs every path through `router` in process, 256 at a time; every
/// answer must be a success.
///
/// # Errors
///
/// A request fails or answers other than 2xx.
pub async fn post_all(router: &Router, paths: impl Iterator<Item = String>) -> anyhow::Result<()> {
    use tower::ServiceExt;
    let post = |path: String| {
        let router = router.clone();
        async move {
            let request = http::Request::post(&path)
                .body(axum::body::Body::empty())
                .map_err(anyhow::Error::from)?;
            let response = router.oneshot(request).await.map_err(anyhow::Error::from)?;
            anyhow::ensure!(response.status().is_success(), "POST {path} failed");
            Ok::<(), anyhow::Error>(())
        }
    };
    let mut stream = futures_util::stream::iter(paths)
        .map(post)
        .buffer_unordered(256);
    while let Some(result) = stream.next().await {
        result?;
    }
    Ok(())
}
