//! Shared harness: a worker served on a real loopback socket, a client, and
//! a few test objects.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::routing::{get, post};
use axum::{Json, Router};
use pinned::{BoxError, Context, Object, Options, Worker};
use serde_json::{json, Value};
use tokio::net::TcpListener;

pub struct TestWorker {
    pub url: String,
    pub worker: Worker,
    pub client: reqwest::Client,
}

/// Builds `options` (with an empty environment, so the machine's variables
/// never leak in), serves it on 127.0.0.1:0 and starts it.
pub async fn start(options: Options) -> TestWorker {
    let worker = options
        .env_vars(Vec::<(String, String)>::new())
        .build()
        .expect("valid options");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let app = worker.router();
    worker.start();
    tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    TestWorker {
        url,
        worker,
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .build()
            .expect("client"),
    }
}

impl TestWorker {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.url, path)
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client.get(self.url(path)).send().await.expect("get")
    }

    pub async fn post(&self, path: &str) -> reqwest::Response {
        self.client.post(self.url(path)).send().await.expect("post")
    }

    /// `/_pinned/stats`, authenticated with the worker's secret.
    pub async fn stats(&self) -> Value {
        self.client
            .get(self.url("/_pinned/stats"))
            .header("pinboard-proxy-secret", self.worker.secret())
            .send()
            .await
            .expect("stats")
            .json()
            .await
            .expect("stats json")
    }

    pub async fn resident(&self) -> Vec<String> {
        self.stats().await["instances"]
            .as_array()
            .expect("instances")
            .iter()
            .map(|row| row["id"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// Waits until the first instance has been idle for `ms` (its last
    /// activity that long ago) and answers the stats of that moment.
    pub async fn wait_idle(&self, ms: u64) -> Value {
        self.wait_for(&format!("{ms} ms since the last activity"), |s| {
            s["instances"][0]["idleMs"]
                .as_u64()
                .is_some_and(|idle| idle >= ms)
        })
        .await
    }

    /// Polls `/_pinned/stats` until `done` holds (at most [`PATIENCE`]).
    pub async fn wait_for(&self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        eventually(what, PATIENCE, || async {
            let stats = self.stats().await;
            done(&stats).then_some(stats)
        })
        .await
    }
}

#[allow(unused_imports)] // not every suite uses every helper
pub use test_support::{eventually, json, until, PATIENCE};

/// A plain counter.
pub struct Counter {
    pub value: AtomicU64,
}

impl Object for Counter {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Counter {
            value: AtomicU64::new(0),
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route(
                "/increment",
                post(|this: pinned::This<Counter>| async move {
                    Json(json!({ "value": this.value.fetch_add(1, Ordering::SeqCst) + 1 }))
                }),
            )
            .route(
                "/value",
                get(|this: pinned::This<Counter>| async move {
                    Json(json!({ "value": this.value.load(Ordering::SeqCst) }))
                }),
            )
            .route(
                "/sleep/{ms}",
                post(
                    |axum::extract::Path(ms): axum::extract::Path<u64>| async move {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        Json(json!({ "slept": ms }))
                    },
                ),
            )
    }
}

/// The stored row `tray` of instance `id` under namespace `ns`:
/// `(marked, doc)`, `None` when there is none. Read at epoch 0, local
/// mode's: a read fences, and must not fence a live worker out.
pub async fn stored_tray(
    store: &dyn pinned::pinned_store::StateStore,
    ns: &str,
    id: &str,
    tray: pinned::pinned_store::TrayKey<'_>,
) -> Option<(bool, Value)> {
    store
        .get_tray(pinned::pinned_store::InstanceKey::new(ns, id), tray, 0)
        .await
        .expect("the store reads")
        .map(|row| (row.marked, Value::Object(row.doc)))
}
