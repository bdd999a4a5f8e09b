//! The worker benchmark (issue: worker SDK): warm requests and activations
//! through a pinned worker against the same handler in a bare axum app,
//! measured in one run, plus resident memory per idle instance.
//!
//! ```text
//! cargo run --release -p pinned-bench --bin worker-bench            # everything
//! cargo run --release -p pinned-bench --bin worker-bench -- --seconds 10 --connections 64
//! cargo run --release -p pinned-bench --bin worker-bench -- --no-instructions   # skip callgrind
//! cargo run --release -p pinned-bench --bin worker-bench -- memory --instances 10000000   # memory and a sweep pass alone, 10 M resident (~3 GiB)
//! cargo run --release -p pinned-bench --bin worker-bench -- instructions   # section 5 alone (callgrind)
//! ```

use std::time::Duration;

use anyhow::Context as _;
use axum::routing::post;
use axum::Router;
use clap::{Parser, Subcommand};
use http::Method;
use pinned::{BoxError, Context, HostOptions, Object, Options};
use pinned_bench::child::Server;
use pinned_bench::counters::{post_all, resident_path, Counter};
use pinned_bench::deploy::Serve;
use pinned_bench::instructions::{self, Logging};
use pinned_bench::load::{self, Load, Paths, Report};

#[derive(Parser)]
#[command(about = "pinned worker benchmark")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Measured seconds per scenario.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Warm-up seconds per scenario.
    #[arg(long, default_value_t = 1)]
    warmup: u64,
    /// Concurrent connections.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Idle instances for the memory figure (the 10 million figure takes
    /// minutes: `memory --instances 10000000` runs that section alone).
    #[arg(long, default_value_t = 1_000_000)]
    instances: u64,
    /// Skip the instructions-per-request figures (callgrind; they take a
    /// few minutes and need valgrind).
    #[arg(long)]
    no_instructions: bool,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Serve(Serve),
    /// The instructions-per-request figures alone (section 5, callgrind).
    Instructions {
        /// Keep the callgrind outputs in this directory (`warm/`,
        /// `spread/`, `fresh/`, each with `bare/`, `pinned-0/` (no
        /// subscriber) and `pinned-1/` (info)), for `callgrind_annotate`;
        /// by default they go with a scratch directory.
        #[arg(long)]
        callgrind_dir: Option<std::path::PathBuf>,
    },
    /// Activate idle instances in process and report memory per instance.
    Memory {
        /// How many instances.
        #[arg(long, default_value_t = 1_000_000)]
        instances: u64,
    },
    /// Activate and evict instances whose state holds their own `Context`,
    /// in process, and report what stays resident per cycle.
    Churn {
        /// How many activate/evict cycles.
        #[arg(long, default_value_t = 100_000)]
        cycles: u64,
    },
}

/// The churned object: its state holds its own context (once a reference
/// cycle that leaked every evicted instance) and a 1 KiB payload, so a leak
/// shows as at least 1 KiB per cycle.
struct Churned {
    _ctx: Context,
    _payload: Vec<u8>,
}

impl Object for Churned {
    async fn activate(ctx: &Context) -> Result<Self, BoxError> {
        Ok(Churned {
            _ctx: ctx.clone(),
            _payload: vec![1; 1024],
        })
    }

    fn routes() -> pinned::Routes<Self> {
        // Closes as soon as the request is done.
        Router::new().route(
            "/visit",
            post(|call: pinned::Call| async move {
                call.ctx().wind_down(None);
                "bye"
            }),
        )
    }
}

fn rss_bytes() -> anyhow::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm.split_whitespace().nth(1).context("statm")?.parse()?;
    Ok(pages * 4096)
}

/// How often the memory run's namespace sweeps: often enough that the
/// passes measured after the activations take seconds, not minutes.
const MEMORY_SWEEP: Duration = Duration::from_millis(200);

/// Passes of the idle sweep measured once every instance is resident.
const MEASURED_PASSES: u64 = 50;

async fn memory(instances: u64) -> anyhow::Result<()> {
    // Every instance stays resident for the whole run: no idle close, room
    // for all of them (a 10 million run takes longer than the default idle
    // timeout would allow the first ones).
    let worker = Options::new()
        .env_vars(Vec::<(String, String)>::new())
        .host_with::<Counter>(
            "/counter",
            HostOptions::default()
                .max_instances(usize::try_from(instances)?.saturating_add(10_000))
                .idle_timeout(Duration::from_secs(86_400))
                .sweep_interval(MEMORY_SWEEP),
        )
        .build()?;
    let router = worker.router();
    let activate = |ids: std::ops::Range<u64>| ids.map(|i| format!("/counter/m{i}/increment"));
    // Warm the allocator and the router with a few instances first.
    post_all(&router, activate(u64::MAX - 1_000..u64::MAX)).await?;
    let before = rss_bytes()?;
    let started = std::time::Instant::now();
    // A tenth at a time, each with its wall time and this process's CPU
    // time: on a shared machine the CPU per activation shows whether the
    // work grows with what is resident, whatever else runs.
    let mut tenths = Vec::with_capacity(10);
    for tenth in 0..10 {
        let (from, to) = (instances * tenth / 10, instances * (tenth + 1) / 10);
        let cpu = pinned_bench::child::own_cpu_time().context("/proc/self/stat")?;
        let wall = std::time::Instant::now();
        post_all(&router, activate(from..to)).await?;
        let spent = pinned_bench::child::own_cpu_time()
            .context("/proc/self/stat")?
            .saturating_sub(cpu);
        tenths.push((to - from, wall.elapsed(), spent));
    }
    let elapsed = started.elapsed();
    let after = rss_bytes()?;
    let resident = active_instances(&worker);
    anyhow::ensure!(
        resident == Some(instances + 1_000),
        "expected {} resident instances, found {resident:?}",
        instances + 1_000
    );
    let per_instance = (after.saturating_sub(before)) as f64 / instances as f64;
    let state = std::mem::size_of::<Counter>() as f64;
    println!(
        "memory: {instances} idle instances activated in {:.1} s ({:.0} activations/s, the sweep every {} ms): \
         RSS +{:.1} MiB, {per_instance:.0} B/instance, {:.0} B/instance beyond the {state:.0}-byte state (target <= 300)",
        elapsed.as_secs_f64(),
        instances as f64 / elapsed.as_secs_f64(),
        MEMORY_SWEEP.as_millis(),
        (after - before) as f64 / 1_048_576.0,
        per_instance - state,
    );
    let rates: Vec<String> = tenths
        .iter()
        .map(|(count, wall, _)| format!("{:.0}", *count as f64 / wall.as_secs_f64() / 1_000.0))
        .collect();
    let cpu: Vec<String> = tenths
        .iter()
        .map(|(count, _, cpu)| format!("{:.1}", cpu.as_secs_f64() * 1e6 / *count as f64))
        .collect();
    println!(
        "by tenth: {} thousand activations/s; {} us of this process's CPU per activation",
        rates.join(" "),
        cpu.join(" ")
    );
    let pass = sweep_passes(&worker, MEASURED_PASSES).await?;
    // Under one clock tick over all the passes: say so, not 0.
    let tick_us = 10_000.0 / pass.passes as f64;
    let cpu_us = pass.cpu.as_secs_f64() / pass.passes as f64 * 1e6;
    let cpu = if pass.cpu.is_zero() {
        format!("under {tick_us:.0}")
    } else {
        format!("{cpu_us:.0}")
    };
    println!(
        "sweep: {} passes with {} resident and none due: {:.0} records visited, {:.1} us per pass \
         (pinned_idle_sweep_seconds); process CPU {cpu} us per pass (/proc ticks over the passes, \
         10 ms each: the process's whole CPU while it only sweeps)",
        pass.passes,
        instances + 1_000,
        pass.visits as f64 / pass.passes as f64,
        pass.seconds / pass.passes as f64 * 1e6,
    );
    Ok(())
}

/// What the idle sweep did over some passes.
struct SweepPasses {
    passes: u64,
    visits: u64,
    seconds: f64,
    cpu: Duration,
}

/// Waits out `count` passes of the idle sweep, with nothing else running in
/// this process, and reports what they cost.
async fn sweep_passes(worker: &pinned::Worker, count: u64) -> anyhow::Result<SweepPasses> {
    let read = || {
        let text = worker.metrics();
        let value = |family: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(family)?.strip_prefix(' '))
                .and_then(|value| value.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        (
            value("pinned_idle_sweep_passes_total"),
            value("pinned_idle_sweep_visits_total"),
            value("pinned_idle_sweep_seconds_total"),
        )
    };
    // From the end of a pass: the first tick after the activations may
    // find a pass under way.
    let (first, ..) = read();
    while read().0 == first {
        tokio::time::sleep(MEMORY_SWEEP / 10).await;
    }
    let (passes_before, visits_before, seconds_before) = read();
    let cpu_before = pinned_bench::child::own_cpu_time().context("/proc/self/stat")?;
    let passes = u32::try_from(count)?;
    let deadline = std::time::Instant::now() + MEMORY_SWEEP * passes * 4;
    // Asleep while they run: reading the metrics costs CPU of its own.
    tokio::time::sleep(MEMORY_SWEEP * passes).await;
    while read().0 < passes_before + count as f64 {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "{count} sweep passes did not run in time"
        );
        tokio::time::sleep(MEMORY_SWEEP / 2).await;
    }
    let cpu_after = pinned_bench::child::own_cpu_time().context("/proc/self/stat")?;
    let (passes, visits, seconds) = read();
    Ok(SweepPasses {
        passes: (passes - passes_before) as u64,
        visits: (visits - visits_before) as u64,
        seconds: seconds - seconds_before,
        cpu: cpu_after.saturating_sub(cpu_before),
    })
}

/// The `pinned_active_instances` gauge: the live instance count, read
/// without listing them (`stats()` would build a row per instance).
fn active_instances(worker: &pinned::Worker) -> Option<u64> {
    worker
        .metrics()
        .lines()
        .find_map(|line| line.strip_prefix("pinned_active_instances "))
        .and_then(|value| value.trim().parse().ok())
}

async fn churn(cycles: u64) -> anyhow::Result<()> {
    let worker = Options::new()
        .env_vars(Vec::<(String, String)>::new())
        .host_with::<Churned>("/churn", HostOptions::default().max_instances(1_000_000))
        .build()?;
    let router = worker.router();
    let round = |from: u64, count: u64| {
        let worker = worker.clone();
        let router = &router;
        async move {
            post_all(
                router,
                (from..from + count).map(|i| format!("/churn/c{i}/visit")),
            )
            .await?;
            // Every instance closed before memory is read.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while worker.stats()["instances"]
                .as_array()
                .is_some_and(|rows| !rows.is_empty())
            {
                anyhow::ensure!(
                    tokio::time::Instant::now() < deadline,
                    "instances never closed"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok::<(), anyhow::Error>(())
        }
    };
    // Warm the allocator first: its high-water mark is not a leak.
    let warmup = cycles / 10;
    round(0, warmup).await?;
    let before = rss_bytes()?;
    let started = std::time::Instant::now();
    round(warmup, cycles).await?;
    let elapsed = started.elapsed();
    let after = rss_bytes()?;
    let (activations, evictions) = {
        let stats = worker.stats();
        let ns = &stats["namespaces"]["/churn"];
        (
            ns["activations"].as_u64().unwrap_or(0),
            ns["evictions"].as_u64().unwrap_or(0),
        )
    };
    println!(
        "churn: {cycles} activate/evict cycles of a state holding its Context and 1 KiB \
         ({activations} activations, {evictions} evictions in all) in {:.1} s: RSS {:.1} -> {:.1} MiB, \
         {:+.1} B retained per cycle (a leak would be >= 1024)",
        elapsed.as_secs_f64(),
        before as f64 / 1_048_576.0,
        after as f64 / 1_048_576.0,
        (after as f64 - before as f64) / cycles as f64,
    );
    Ok(())
}

/// One closed-loop run against `server`, with the server's CPU time per
/// request over the measured part (its `/proc` ticks; the load runs in
/// this process, not the server's).
async fn measure(cli: &Cli, server: &Server, paths: Paths) -> anyhow::Result<Measured> {
    let (report, before, after) = load::run_sampled(
        Load {
            addr: server.addr,
            connections: cli.connections,
            warmup: Duration::from_secs(cli.warmup),
            duration: Duration::from_secs(cli.seconds),
            method: Method::POST,
            paths,
            headers: Vec::new(),
            body: None,
            rate: None,
        },
        || async { server.cpu_time() },
    )
    .await?;
    let cpu_us = report.per_request_us(before, after);
    Ok(Measured { report, cpu_us })
}

/// A run's report and the server's CPU time per request.
struct Measured {
    report: Report,
    cpu_us: Option<f64>,
}

impl Measured {
    fn ratio(&self, base: &Self) -> f64 {
        self.report.ratio(&base.report)
    }
}

impl std::fmt::Display for Measured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.cpu_us {
            Some(us) => write!(f, "{}  server cpu/req {us:.1} us", self.report),
            None => write!(f, "{}  server cpu/req -", self.report),
        }
    }
}

async fn run(cli: &Cli) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let exe = exe.to_str().context("exe path")?;
    println!(
        "worker-bench: {} connections, {} s per scenario after {} s warm-up, loopback\n",
        cli.connections, cli.seconds, cli.warmup
    );

    let bare = Server::start(exe, &["serve-bare"]).await?;
    let bare_warm = measure(cli, &bare, Paths::Fixed("/counter/a/increment".into())).await?;
    let bare_fresh = measure(
        cli,
        &bare,
        Paths::Unique {
            prefix: "/fresh/".into(),
            suffix: "/increment".into(),
        },
    )
    .await?;
    drop(bare);

    let pinned = Server::start(exe, &["serve-pinned"]).await?;
    let pinned_warm = measure(cli, &pinned, Paths::Fixed("/counter/a/increment".into())).await?;
    drop(pinned);
    // A fresh worker, so activations do not share the map with the warm run.
    let pinned = Server::start(exe, &["serve-pinned"]).await?;
    let pinned_fresh = measure(
        cli,
        &pinned,
        Paths::Unique {
            prefix: "/counter/".into(),
            suffix: "/increment".into(),
        },
    )
    .await?;
    drop(pinned);

    println!("1. warm requests to one counter instance");
    println!("   bare axum handler   {bare_warm}");
    println!("   pinned worker       {pinned_warm}");
    println!(
        "   ratio pinned/bare   {:.2}  (target >= 0.90)\n",
        pinned_warm.ratio(&bare_warm)
    );
    println!("2. activations (a new id per request)");
    println!("   bare map insert     {bare_fresh}");
    println!("   pinned worker       {pinned_fresh}");
    println!(
        "   ratio pinned/bare   {:.2}  (target >= 0.50)\n",
        pinned_fresh.ratio(&bare_fresh)
    );
    println!("3. memory");
    let status = tokio::process::Command::new(exe)
        .args(["memory", "--instances", &cli.instances.to_string()])
        .status()
        .await?;
    anyhow::ensure!(status.success(), "memory run failed");
    println!("4. activate/evict churn");
    let status = tokio::process::Command::new(exe)
        .args(["churn"])
        .status()
        .await?;
    anyhow::ensure!(status.success(), "churn run failed");
    if cli.no_instructions {
        return Ok(());
    }
    instructions_section(exe, None).await
}

/// Resident ids the spread figure cycles over.
const SPREAD: usize = 10_000;

/// Section 5: instructions per request, pinned against bare axum, for warm
/// requests to one id, warm requests spread over [`SPREAD`] resident ids,
/// and new ids.
async fn instructions_section(exe: &str, keep: Option<&std::path::Path>) -> anyhow::Result<()> {
    let lengths = instructions::Lengths::default();
    println!(
        "5. user-space instructions per request (callgrind, counted from after a warm-up request; Δ between {} and {} sequential requests on one connection, the load from this process)",
        lengths.short, lengths.long
    );
    if !instructions::available() {
        println!("   valgrind not found: skipped");
        return Ok(());
    }
    let scratch = match keep {
        Some(dir) => dir.to_owned(),
        None => std::env::temp_dir().join(format!("worker-bench-{}", std::process::id())),
    };
    std::fs::create_dir_all(&scratch)?;
    // Both configurations of the worker (the bare counter has no
    // subscriber in either): nothing listening at `info`, and the
    // examples' default logging.
    let both = [Logging::Quiet, Logging::Info];
    let warm = |_: usize| "/counter/a/increment".to_owned();
    let (bare_warm, pinned_warm) = instructions::bare_and_pinned(
        exe,
        &[],
        (warm, warm),
        &both,
        lengths,
        &scratch.join("warm"),
    )
    .await?;
    for (log, pinned) in both.iter().zip(&pinned_warm) {
        println!(
            "   warm       bare axum {bare_warm:>8.0}   pinned {pinned:>8.0}   ratio {:.2}  (target <= 1.00; {log})",
            pinned / bare_warm
        );
    }
    // Every id activated (or present) before the runs, each request to the
    // next one: the directory and the allocator see a populated map, not a
    // single hot entry.
    let spread = |i: usize| resident_path("/counter", i % SPREAD);
    let resident = SPREAD.to_string();
    let (bare_spread, pinned_spread) = instructions::bare_and_pinned(
        exe,
        &["--resident", &resident],
        (spread, spread),
        &[Logging::Quiet],
        lengths,
        &scratch.join("spread"),
    )
    .await?;
    println!(
        "   {SPREAD} ids  bare axum {bare_spread:>8.0}   pinned {:>8.0}   ratio {:.2}  (target <= 1.00; {})",
        pinned_spread[0],
        pinned_spread[0] / bare_spread,
        Logging::Quiet
    );
    let fresh = |base: &'static str| move |i: usize| format!("{base}/i{i}/increment");
    let (bare_fresh, pinned_fresh) = instructions::bare_and_pinned(
        exe,
        &[],
        (fresh("/fresh"), fresh("/counter")),
        &both,
        lengths,
        &scratch.join("fresh"),
    )
    .await?;
    for (log, pinned) in both.iter().zip(&pinned_fresh) {
        println!(
            "   new ids    bare axum {bare_fresh:>8.0}   pinned {pinned:>8.0}   ratio {:.2}  (target <= 1.50; {log})",
            pinned / bare_fresh
        );
    }
    if keep.is_none() {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match &cli.command {
        Some(Command::Serve(serve)) => serve.run().await,
        Some(Command::Instructions { callgrind_dir }) => {
            let exe = std::env::current_exe()?;
            instructions_section(exe.to_str().context("exe path")?, callgrind_dir.as_deref()).await
        }
        Some(Command::Memory { instances }) => memory(*instances).await,
        Some(Command::Churn { cycles }) => churn(*cycles).await,
        None => run(&cli).await,
    }
}
