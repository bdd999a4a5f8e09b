//! The fleet benchmark (issue: fleet): in one run,
//!
//! 1. warm requests/s and p50/p99 through one pinboard to a counter on the
//!    Rust worker and to a counter on the Python reference worker (both
//!    registered with that pinboard, same load), and their ratio;
//! 2. failover: SIGKILL the owner of a warm counter and time until the first
//!    successful answer from its replacement, over `--trials` trials (median
//!    and max). A fresh Rust worker replaces the killed one between trials.
//!
//! The failover figure is dominated by the lease TTL (`--lease-ttl-ms`,
//! default 2000 ms): pinboard re-places an id only once its owner's lease
//! has lapsed, i.e. between TTL minus one heartbeat interval and TTL after
//! the kill, plus the proxy's retry back-off (50, 100, 200 ms) on the
//! client's request in flight when it lapses. Each kill waits a random
//! 0 to 2 heartbeat intervals after the id was placed, so it lands at a
//! random phase of the owner's heartbeat.
//!
//! ```text
//! cargo build --release -p pinned-bench
//! target/release/fleet-bench                           # about 1.2 minutes
//! target/release/fleet-bench --trials 5 --seconds 3    # quicker
//! ```

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use http::Method;
use pinned_bench::child::Server;
use pinned_bench::deploy::{self, Operator, Serve};
use pinned_bench::load::{self, load_average, Load, Paths, Report};
use serde_json::Value;
use tokio::time::Instant;

/// The allocator the `pinboard` binary uses (pinboard and the Rust worker
/// run from this binary).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Ids probed to find one placed on a given worker.
const PROBES: usize = 500;

#[derive(Parser)]
#[command(about = "fleet benchmark: Rust vs Python worker through pinboard, and failover time")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Measured seconds per warm scenario.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Warm-up seconds per warm scenario.
    #[arg(long, default_value_t = 1)]
    warmup: u64,
    /// Concurrent keep-alive client connections.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Failover trials.
    #[arg(long, default_value_t = 20)]
    trials: usize,
    /// Lease TTL pinboard grants, milliseconds (bounds the failover time).
    #[arg(long, default_value_t = 2000)]
    lease_ttl_ms: u64,
    /// Workers' heartbeat interval, milliseconds.
    #[arg(long, default_value_t = 500)]
    heartbeat_ms: u64,
    /// Workers' lease buffer, milliseconds.
    #[arg(long, default_value_t = 500)]
    lease_buffer_ms: u64,
    /// Pause between polls of a failing id, milliseconds.
    #[arg(long, default_value_t = 5)]
    poll_ms: u64,
    /// Placement in Redis at this URL (unique key prefix, wiped after);
    /// default: pinboard's memory store.
    #[arg(long)]
    redis_url: Option<String>,
    /// Python interpreter with `pinned==0.16.0` and uvicorn.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.venv/bin/python"))]
    python: PathBuf,
    /// Directory of the Python reference test app (`app.py`).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../pinboard/tests/py"))]
    py_app_dir: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Serve(Serve),
}

struct Fleet<'a> {
    cli: &'a Cli,
    exe: PathBuf,
    dir: PathBuf,
    pinboard: Server,
    op: Operator,
    spawned: usize,
}

impl Fleet<'_> {
    fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.cli.heartbeat_ms)
    }

    fn lease_buffer(&self) -> Duration {
        Duration::from_millis(self.cli.lease_buffer_ms)
    }

    async fn rust_worker(&mut self) -> anyhow::Result<Server> {
        self.spawned += 1;
        let log = self.dir.join(format!("rust-worker-{}.log", self.spawned));
        deploy::start_rust_worker(
            &self.exe,
            &self.pinboard.url(),
            self.heartbeat(),
            self.lease_buffer(),
            &log,
        )
        .await
    }

    async fn measure(&self, path: String) -> anyhow::Result<Report> {
        load::run(Load {
            addr: self.pinboard.addr,
            connections: self.cli.connections,
            warmup: Duration::from_secs(self.cli.warmup),
            duration: Duration::from_secs(self.cli.seconds),
            method: Method::GET,
            paths: Paths::Fixed(path),
            headers: Vec::new(),
            body: None,
            rate: None,
        })
        .await
    }

    /// A counter path placed on the worker whose process token `pick` accepts.
    async fn placed_on(&self, tag: &str, pick: impl Fn(&str) -> bool) -> anyhow::Result<String> {
        for i in 0..PROBES {
            let path = format!("{}/{tag}-{i}/hit", deploy::NAMESPACE);
            let body = self.op.get_ok(&path, Duration::from_secs(10)).await?;
            if pick(process(&body)) {
                return Ok(path);
            }
        }
        anyhow::bail!("no {tag} id placed on the wanted worker in {PROBES} probes")
    }
}

fn process(body: &Value) -> &str {
    body["process"].as_str().unwrap_or_default()
}

fn token(server: &Server) -> anyhow::Result<String> {
    Ok(server
        .printed("process")
        .context("worker printed no process token")?
        .to_owned())
}

async fn run(cli: &Cli) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("pinned-fleet-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let exe = std::env::current_exe()?;
    let prefix = deploy::unique_prefix("fleet");
    let mut flags = vec![
        "--lease-ttl-ms".to_owned(),
        cli.lease_ttl_ms.to_string(),
        "--quarantine-ms".to_owned(),
        "0".to_owned(),
    ];
    if let Some(url) = &cli.redis_url {
        flags.extend(["--redis-url".to_owned(), url.clone()]);
        flags.extend(["--redis-prefix".to_owned(), prefix.clone()]);
    }
    let pinboard = deploy::start_pinboard(&exe, &flags, &dir.join("pinboard.log")).await?;
    let op = Operator::new(pinboard.url())?;
    let mut fleet = Fleet {
        cli,
        exe,
        dir: dir.clone(),
        pinboard,
        op,
        spawned: 0,
    };
    let outcome = benches(&mut fleet).await;
    let _ = fleet.pinboard.kill().await;
    if let Some(url) = &cli.redis_url {
        match deploy::redis_wipe(url, &prefix).await {
            Ok(n) => println!("Redis: removed {n} keys under {prefix}"),
            Err(e) => println!("Redis: could not remove keys under {prefix}: {e:#}"),
        }
    }
    if outcome.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("logs kept in {}", dir.display());
    }
    outcome
}

async fn benches(fleet: &mut Fleet<'_>) -> anyhow::Result<()> {
    let cli = fleet.cli;
    println!(
        "fleet-bench: pinboard on the {} store, lease TTL {} ms, worker heartbeat {} ms, lease buffer {} ms; \
         {} connections, {} s per warm scenario after {} s warm-up; loopback, {} CPUs",
        if cli.redis_url.is_some() { "Redis" } else { "memory" },
        cli.lease_ttl_ms,
        cli.heartbeat_ms,
        cli.lease_buffer_ms,
        cli.connections,
        cli.seconds,
        cli.warmup,
        std::thread::available_parallelism().map_or(0, usize::from),
    );
    println!("load average at start: {}\n", load_average());

    // 1. Rust and Python workers behind the same pinboard.
    let mut rust = fleet.rust_worker().await?;
    let mut python = deploy::start_python_worker(
        &cli.python,
        &cli.py_app_dir,
        &fleet.pinboard.url(),
        fleet.heartbeat(),
        fleet.lease_buffer(),
        &fleet.dir.join("python-worker.log"),
    )
    .await
    .with_context(|| format!("Python worker ({})", cli.python.display()))?;
    fleet.op.wait_workers(2, Duration::from_secs(30)).await?;
    let rust_token = token(&rust)?;
    let rust_path = fleet.placed_on("rust", |p| p == rust_token).await?;
    let python_path = fleet
        .placed_on("python", |p| !p.is_empty() && p != rust_token)
        .await?;
    println!("1. warm GET through pinboard ({rust_path} on Rust, {python_path} on Python)");
    let on_rust = fleet.measure(rust_path).await?;
    println!("   Rust worker     {on_rust}  [load {}]", load_average());
    let on_python = fleet.measure(python_path).await?;
    println!("   Python worker   {on_python}  [load {}]", load_average());
    println!(
        "   ratio Rust/Python  {:.1}x  (target >= 20x)\n",
        on_rust.ratio(&on_python)
    );
    python.kill().await?;

    // 2. Failover between two Rust workers.
    let mut workers = vec![rust, fleet.rust_worker().await?];
    fleet.op.wait_workers(2, Duration::from_secs(30)).await?;
    println!(
        "2. failover: SIGKILL the owner of a warm counter, poll it through pinboard (every {} ms after a failure) \
         until its replacement answers; {} trials",
        cli.poll_ms, cli.trials
    );
    let mut times = Vec::with_capacity(cli.trials);
    let mut stale_state = 0;
    for trial in 1..=cli.trials {
        let path = format!("{}/failover-{trial}/hit", deploy::NAMESPACE);
        let body = fleet.op.get_ok(&path, Duration::from_secs(10)).await?;
        let victim_token = process(&body).to_owned();
        let victim = workers
            .iter()
            .position(|w| w.printed("process") == Some(victim_token.as_str()))
            .context("no worker owns the failover counter")?;
        let mut victim = workers.swap_remove(victim);
        // The newest worker usually owns the new id (most headroom) and
        // has just registered: kill at a random phase of its heartbeat,
        // not right after one.
        let phase = rand::random_range(0..2 * cli.heartbeat_ms.max(1));
        tokio::time::sleep(Duration::from_millis(phase)).await;
        let killed = Instant::now();
        victim.kill().await?;
        let (elapsed, body) =
            first_answer(&fleet.op, &path, &victim_token, cli.poll_ms, killed).await?;
        if body["count"].as_u64() != Some(1) {
            stale_state += 1;
        }
        times.push(elapsed);
        println!(
            "   trial {trial:>2}: {:>7.1} ms  [load {}]",
            elapsed.as_secs_f64() * 1e3,
            load_average()
        );
        rust = fleet.rust_worker().await?;
        workers.push(rust);
        fleet.op.wait_workers(2, Duration::from_secs(30)).await?;
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let median = if times.is_empty() {
        Duration::ZERO
    } else if times.len() % 2 == 1 {
        times[times.len() / 2]
    } else {
        (times[times.len() / 2 - 1] + times[times.len() / 2]) / 2
    };
    println!(
        "\nsummary\n   warm through pinboard: Rust {:.0} req/s (p99 {} us), Python {:.0} req/s (p99 {} us): {:.1}x (target >= 20x)",
        on_rust.rps,
        on_rust.p99_us,
        on_python.rps,
        on_python.p99_us,
        on_rust.ratio(&on_python)
    );
    println!(
        "   failover over {} trials (lease TTL {} ms): median {:.0} ms, min {:.0} ms, max {:.0} ms; \
         {stale_state} answers with carried-over state (expected 0)",
        times.len(),
        cli.lease_ttl_ms,
        ms(median),
        times.first().copied().map_or(0.0, ms),
        times.last().copied().map_or(0.0, ms),
    );
    println!("load average at end: {}", load_average());
    for mut worker in workers {
        let _ = worker.kill().await;
    }
    Ok(())
}

/// Polls `path` until a 2xx answer comes from a process other than
/// `victim`; returns the time since `killed` and that answer.
async fn first_answer(
    op: &Operator,
    path: &str,
    victim: &str,
    poll_ms: u64,
    killed: Instant,
) -> anyhow::Result<(Duration, Value)> {
    let deadline = killed + Duration::from_secs(60);
    loop {
        if let Ok((status, body)) = op.get(path).await {
            if (200..300).contains(&status) && process(&body) != victim {
                return Ok((killed.elapsed(), body));
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{path} never answered from a replacement"
        );
        tokio::time::sleep(Duration::from_millis(poll_ms)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match &cli.command {
        Some(Command::Serve(serve)) => serve.run().await,
        None => run(&cli).await,
    }
}
