//! `set_tray` throughput of the stores with many instances writing concurrently, next to
//! the Python reference's `PostgresStateStore` on the same database in the same run.
//!
//! ```text
//! cargo bench -p pinned-store --bench store -- [--instances 1000] [--ops 5] [--pool 8]
//!     [--url postgresql://…] [--python .venv/bin/python] [--skip-python] [--skip-sqlite]
//! ```
//!
//! Every instance runs its `--ops` writes one after another (as an instance's effect log
//! does); all instances run at once. Figures are total ops / wall time after a short pool
//! warm-up. The URL defaults to `PINNED_TEST_DATABASE_URL`, else the local test database.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use anyhow::{bail, Context};
use pinned_store::conformance::{database_url, doc, unique_ns};
use pinned_store::{
    InstanceKey, PostgresOptions, PostgresStore, SqliteOptions, SqliteStore, StateStore, SyncMode,
    TrayKey,
};
use serde_json::{json, Value};
use tokio::time::Instant;

struct Args {
    instances: usize,
    ops: usize,
    pool: usize,
    url: String,
    python: PathBuf,
    skip_python: bool,
    skip_sqlite: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        instances: 1000,
        ops: 5,
        pool: 8,
        url: database_url(),
        python: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python"),
        skip_python: false,
        skip_sqlite: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--instances" => args.instances = value()?.parse()?,
            "--ops" => args.ops = value()?.parse()?,
            "--pool" => args.pool = value()?.parse()?,
            "--url" => args.url = value()?,
            "--python" => args.python = PathBuf::from(value()?),
            "--skip-python" => args.skip_python = true,
            "--skip-sqlite" => args.skip_sqlite = true,
            "--bench" => {} // passed by `cargo bench`
            other => bail!("unknown flag {other}"),
        }
    }
    if args.instances == 0 || args.ops == 0 || args.pool == 0 {
        bail!("--instances, --ops and --pool must be at least 1");
    }
    Ok(args)
}

/// Throughput figures of one run.
struct Figures {
    ops: usize,
    seconds: f64,
    p50_ms: f64,
    p99_ms: f64,
}

impl Figures {
    fn per_second(&self) -> f64 {
        self.ops as f64 / self.seconds
    }

    fn print(&self, name: &str) {
        println!(
            "{name:<28} {:>9.0} ops/s   ({} ops in {:.2} s, p50 {:.2} ms, p99 {:.2} ms)",
            self.per_second(),
            self.ops,
            self.seconds,
            self.p50_ms,
            self.p99_ms
        );
    }
}

async fn run_rust(store: Arc<dyn StateStore>, ns: &str, args: &Args) -> anyhow::Result<Figures> {
    // Warm-up: dial the pool (one concurrent op per slot, twice).
    let warm: Vec<_> = (0..args.pool * 2)
        .map(|i| {
            let store = store.clone();
            let ns = ns.to_owned();
            tokio::spawn(async move {
                store
                    .set_tray(
                        InstanceKey::new(&ns, &format!("warm{i}")),
                        TrayKey::singleton("bench"),
                        false,
                        doc(json!({})),
                        1,
                    )
                    .await
            })
        })
        .collect();
    for task in warm {
        task.await??;
    }
    let start = Instant::now();
    let tasks: Vec<_> = (0..args.instances)
        .map(|i| {
            let store = store.clone();
            let ns = ns.to_owned();
            let ops = args.ops;
            tokio::spawn(async move {
                let id = format!("i{i}");
                let mut latencies = Vec::with_capacity(ops);
                for n in 0..ops {
                    let d = doc(json!({"n": n, "i": i, "pad": "x".repeat(64)}));
                    let t0 = Instant::now();
                    store
                        .set_tray(
                            InstanceKey::new(&ns, &id),
                            TrayKey::singleton("bench"),
                            n + 1 < ops,
                            d,
                            1,
                        )
                        .await?;
                    latencies.push(t0.elapsed().as_secs_f64() * 1000.0);
                }
                anyhow::Ok(latencies)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let seconds = start.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let pick = |q: f64| latencies[((q * latencies.len() as f64) as usize).min(latencies.len() - 1)];
    Ok(Figures {
        ops: args.instances * args.ops,
        seconds,
        p50_ms: pick(0.5),
        p99_ms: pick(0.99),
    })
}

fn run_python(ns: &str, args: &Args) -> anyhow::Result<Figures> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/py/store_bench.py");
    let out = Command::new(&args.python)
        .arg(script)
        .arg(&args.url)
        .arg(ns)
        .arg(args.instances.to_string())
        .arg(args.ops.to_string())
        .arg(args.pool.to_string())
        .output()
        .with_context(|| format!("run {}", args.python.display()))?;
    if !out.status.success() {
        bail!(
            "python bench failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: Value = serde_json::from_slice(&out.stdout)?;
    let num = |k: &str| {
        v[k].as_f64()
            .with_context(|| format!("python output lacks {k}: {v}"))
    };
    Ok(Figures {
        ops: num("ops")? as usize,
        seconds: num("seconds")?,
        p50_ms: num("p50_ms")?,
        p99_ms: num("p99_ms")?,
    })
}

async fn cleanup(url: &str, namespaces: &[String]) -> anyhow::Result<()> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    for ns in namespaces {
        client
            .execute("DELETE FROM pinned_tray_index WHERE ns = $1", &[ns])
            .await?;
        client
            .execute("DELETE FROM pinned_epoch WHERE ns = $1", &[ns])
            .await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    println!(
        "set_tray: {} instances x {} sequential ops each, all instances concurrent, pool {}",
        args.instances, args.ops, args.pool
    );
    let rust_ns = unique_ns("bench-rs");
    let py_ns = unique_ns("bench-py");

    let pg = PostgresStore::open(
        &args.url,
        PostgresOptions {
            pool_size: args.pool,
            ..PostgresOptions::default()
        },
    )
    .await
    .context("open Postgres")?;
    let rust = run_rust(Arc::new(pg), &rust_ns, &args).await?;
    rust.print("rust PostgresStore");

    if !args.skip_python {
        let python = run_python(&py_ns, &args)?;
        python.print("python PostgresStateStore");
        println!(
            "{:<28} {:>9.2}x",
            "ratio rust / python",
            rust.per_second() / python.per_second()
        );
    }
    cleanup(&args.url, &[rust_ns, py_ns]).await?;

    if !args.skip_sqlite {
        for (name, sync) in [
            ("rust SqliteStore (FULL)", SyncMode::Full),
            ("rust SqliteStore (NORMAL)", SyncMode::Normal),
        ] {
            let dir = tempfile::tempdir()?;
            let store = SqliteStore::open(
                dir.path().join("bench.db"),
                SqliteOptions {
                    sync,
                    ..SqliteOptions::default()
                },
            )
            .await?;
            let figures = run_rust(Arc::new(store), "/bench", &args).await?;
            figures.print(name);
        }
    }
    Ok(())
}
