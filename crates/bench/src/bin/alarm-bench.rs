//! Alarm delivery lag (issue 5): `--alarms` instances each set one alarm
//! due at a random time within `--window-secs`; the handler records fire
//! time minus due time. Local mode, in process, on the embedded SQLite
//! store (`--store memory` to take the disk out).
//!
//! ```text
//! cargo run --release -p pinned-bench --bin alarm-bench -- --alarms 10000 --window-secs 60
//! ```

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use axum::routing::post;
use axum::Router;
use clap::Parser;
use futures_util::StreamExt;
use hdrhistogram::Histogram;
use pinned::pinned_store::{MemoryStore, SqliteOptions, SqliteStore, StateStore};
use pinned::{BoxError, Call, Context, HostOptions, Object, Options};
use tokio::sync::mpsc;
use tower::ServiceExt;

#[derive(Parser)]
#[command(about = "pinned alarm delivery lag")]
struct Cli {
    /// Alarms (one per instance).
    #[arg(long, default_value_t = 10_000)]
    alarms: u64,
    /// Alarms come due uniformly within this window from the start.
    #[arg(long, default_value_t = 60)]
    window_secs: u64,
    /// `sqlite` (a temporary file) or `memory`.
    #[arg(long, default_value = "sqlite")]
    store: String,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The alarm's due time travels in the id (`t<n>-<due ms>`): while its own
/// handler runs, `get` hides the alarm.
/// Fire lags in ms, reported by every handler run.
static LAGS: std::sync::OnceLock<mpsc::UnboundedSender<i64>> = std::sync::OnceLock::new();

fn routes() -> pinned::Routes<Lagging> {
    Router::new().route(
        "/at/{due}",
        post(
            |call: Call, axum::extract::Path(due): axum::extract::Path<i64>| async move {
                let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(due).unwrap_or(0));
                match call.ctx().alarm().set(Some(at)).await {
                    Ok(()) => "set".to_owned(),
                    Err(e) => e.to_string(),
                }
            },
        ),
    )
}

struct Lagging;

impl Object for Lagging {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Lagging)
    }

    async fn alarm(&self, ctx: &Context) -> Result<(), BoxError> {
        let due: i64 = ctx
            .id()
            .rsplit('-')
            .next()
            .and_then(|d| d.parse().ok())
            .unwrap_or(0);
        if let Some(lags) = LAGS.get() {
            let _ = lags.send(now_ms() - due);
        }
        Ok(())
    }

    fn routes() -> pinned::Routes<Self> {
        routes()
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let (tx, mut rx) = mpsc::unbounded_channel();
    LAGS.set(tx).ok().context("lags channel")?;
    let dir = std::env::temp_dir().join(format!("alarm-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store: Arc<dyn StateStore> = match cli.store.as_str() {
        "memory" => Arc::new(MemoryStore::new()),
        _ => Arc::new(SqliteStore::open(dir.join("alarms.db"), SqliteOptions::default()).await?),
    };
    let worker = Options::new()
        .env_vars(Vec::<(String, String)>::new())
        .host_with::<Lagging>(
            "/a",
            HostOptions::default()
                .max_instances(usize::MAX / 2)
                .idle_timeout(Duration::from_secs(5)),
        )
        .store(store)
        .build()?;
    worker.start();
    let router = worker.router();
    // Alarms are set concurrently (the SQLite store commits concurrent
    // writes together); the first comes due after a head start long enough
    // for all of them to be written.
    let head_start = 5_000;
    let start = now_ms() + head_start;
    let window = i64::try_from(cli.window_secs * 1000)?;
    println!(
        "alarm-bench: {} alarms due within {} s, {} store",
        cli.alarms, cli.window_secs, cli.store
    );
    let began = std::time::Instant::now();
    let mut sets = futures_util::stream::iter(0..cli.alarms)
        .map(|n| {
            // Spread deterministically over the window.
            let due = start + (n as i64 * 7919) % window.max(1);
            let router = router.clone();
            async move {
                let request = http::Request::post(format!("/a/t{n}-{due}/at/{due}"))
                    .body(axum::body::Body::empty())?;
                let response = router.oneshot(request).await?;
                anyhow::ensure!(response.status().is_success(), "set failed");
                Ok::<(), anyhow::Error>(())
            }
        })
        .buffer_unordered(256);
    while let Some(set) = sets.next().await {
        set?;
    }
    let setup = began.elapsed();
    println!("set {} alarms in {:.1} s", cli.alarms, setup.as_secs_f64());
    if setup.as_millis() as i64 > head_start {
        println!("warning: setting took longer than the {head_start} ms head start; early alarms lag by that");
    }
    let mut lags = Histogram::<u64>::new_with_bounds(1, 3_600_000, 3)?;
    let mut early = 0u64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(cli.window_secs + 60);
    while lags.len() + early < cli.alarms {
        let Ok(Some(lag)) = tokio::time::timeout_at(deadline, rx.recv()).await else {
            break;
        };
        if lag < 0 {
            early += 1;
        } else {
            lags.saturating_record(u64::try_from(lag).unwrap_or(0).max(1));
        }
    }
    println!(
        "fired {} of {} (early: {early}); lag p50 {} ms, p99 {} ms, max {} ms",
        lags.len() + early,
        cli.alarms,
        lags.value_at_quantile(0.5),
        lags.value_at_quantile(0.99),
        lags.max()
    );
    worker.close().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
