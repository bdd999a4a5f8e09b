//! The proxy benchmark (issue: pinboard): a warm counter behind the Rust
//! worker in control-plane mode, reached (a) directly, (b) through pinboard
//! on the memory store, (c) through pinboard on Redis and (d) through nginx,
//! plus new-id placements per second through pinboard on Redis (end to end,
//! the worker activating each) and on pinboard's Redis placement store
//! alone (no HTTP, no worker: the Redis side of a placement); all in one
//! run, on loopback, with the same closed-loop load. A paced run of each
//! path at a fixed rate (`--paced-rate`, open loop) then measures what each
//! proxy adds to a request's latency when it is not saturated: under the
//! closed loop, p99 is mostly queueing and tracks throughput.
//!
//! The direct path and nginx carry what pinboard would add: a valid
//! `Pinboard-Attestation` (minted with the worker's secret for its session,
//! fresh for each scenario) and the placement's `Pinboard-Epoch`, so all four
//! paths end in the same worker code (attestation check included).
//!
//! ```text
//! cargo build --release -p pinned-bench
//! target/release/proxy-bench                          # about 1.5 minutes
//! target/release/proxy-bench --rounds 1 --seconds 3   # quicker
//! target/release/proxy-bench --no-instructions        # skip callgrind
//! target/release/proxy-bench instructions             # the worker's callgrind figures alone
//! ```
//!
//! It ends with instructions per request under callgrind (the same figure
//! whatever else the machine does) of nginx and pinboard, and of the bare
//! axum counter and the pinned worker on their own, then one table of the
//! four hot paths: req/s, the server's CPU per request and instructions per
//! request, with the ratios and the targets of issue 23 (issue 14's
//! before it).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use http::Method;
use pinned_bench::child::Server;
use pinned_bench::deploy::{self, Operator, Serve};
use pinned_bench::instructions::{self, Lengths, Logging, Probe, Run};
use pinned_bench::load::{self, load_average, Load, Paths, Report};
use pinned_bench::{nginx, placements};

/// The allocator pinboard and the worker run with in this benchmark (the
/// `pinboard` binary uses it too).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Attestations live 30 s plus the worker's 30 s skew allowance; one is
/// minted per scenario, which must end well inside that.
const MAX_SCENARIO_SECS: u64 = 50;

/// The warm counter's id.
const WARM_ID: &str = "warm";

#[derive(Parser)]
#[command(about = "pinboard proxy benchmark: direct, pinboard (memory, Redis) and nginx")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Measured seconds per scenario and round.
    #[arg(long, default_value_t = 8)]
    seconds: u64,
    /// Warm-up seconds per scenario and round.
    #[arg(long, default_value_t = 1)]
    warmup: u64,
    /// Rounds of the four warm scenarios (the best round of each is summarised).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Rounds of the new-id placement scenario.
    #[arg(long, default_value_t = 2)]
    placement_rounds: usize,
    /// Concurrent keep-alive client connections.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Requests/s of the paced (open-loop) latency run of each path; 0
    /// skips it.
    #[arg(long, default_value_t = 5000.0)]
    paced_rate: f64,
    /// Connections of the paced latency run.
    #[arg(long, default_value_t = 16)]
    paced_connections: usize,
    /// Redis for scenario (c) and the placements (a unique key prefix, wiped after).
    #[arg(long, default_value = "redis://127.0.0.1:6379/0")]
    redis_url: String,
    /// Redis Cluster for the store-alone placements on a cluster (its
    /// nodes, comma-separated; `scripts/services` starts this one: 3
    /// masters, one replica each). Unreachable: those runs are skipped.
    #[arg(
        long,
        default_value = "redis://127.0.0.1:17000,redis://127.0.0.1:17001,redis://127.0.0.1:17002,redis://127.0.0.1:17003,redis://127.0.0.1:17004,redis://127.0.0.1:17005"
    )]
    redis_cluster_url: String,
    /// The nginx binary.
    #[arg(long, default_value = nginx::DEFAULT_NGINX)]
    nginx: PathBuf,
    /// Skip the instructions-per-request figures (callgrind; they take a
    /// few minutes and need valgrind).
    #[arg(long)]
    no_instructions: bool,
    /// Keep the callgrind outputs of the instructions section in this
    /// directory (`nginx/`, `pinboard/`, `bare/`, `pinned-0/` (no
    /// subscriber), `pinned-1/` (info), each a short and a long run), for `callgrind_annotate`; by default they go with
    /// the scratch directory.
    #[arg(long)]
    callgrind_dir: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Serve(Serve),
    /// The pinned worker's and the bare axum counter's instructions per
    /// warm request alone (callgrind, about a minute; outputs kept with
    /// `--callgrind-dir`).
    Instructions,
}

/// CPU time per measured request, microseconds.
#[derive(Clone, Copy, Debug, Default)]
struct Cost {
    /// The proxy process(es): pinboard, or nginx's master and worker.
    proxy: Option<f64>,
    /// The worker process.
    worker: f64,
    /// Redis, when the path uses it.
    redis: Option<f64>,
}

impl std::fmt::Display for Cost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.proxy {
            Some(proxy) => write!(
                f,
                "cpu/req proxy {proxy:>3.0} us, worker {:>3.0} us",
                self.worker
            )?,
            None => write!(f, "cpu/req proxy   -, worker {:>3.0} us", self.worker)?,
        }
        if let Some(redis) = self.redis {
            write!(f, ", Redis {redis:>4.1} us")?;
        }
        Ok(())
    }
}

/// The processes one scenario runs through, whose CPU it reports.
#[derive(Clone, Copy)]
struct Target<'a> {
    /// The proxy, if any.
    proxy: Option<&'a Server>,
    /// The worker.
    worker: &'a Server,
    /// Whether the path uses Redis (then its CPU is reported too).
    redis: bool,
}

/// One scenario's results across rounds.
#[derive(Default)]
struct Series(Vec<(Report, Cost)>);

impl Series {
    /// The round with the most requests/s: interference from a shared
    /// machine only ever slows a round down.
    fn best(&self) -> (Report, Cost) {
        self.0
            .iter()
            .max_by(|a, b| a.0.rps.total_cmp(&b.0.rps))
            .cloned()
            .unwrap_or((
                Report {
                    ok: 0,
                    errors: 0,
                    rps: 0.0,
                    p50_us: 0,
                    p99_us: 0,
                },
                Cost::default(),
            ))
    }
}

struct Bench<'a> {
    cli: &'a Cli,
    exe: PathBuf,
    dir: PathBuf,
    /// A connection of its own to the benchmark's Redis, for its CPU time.
    redis: redis::aio::MultiplexedConnection,
}

impl Bench<'_> {
    /// One run against `addr` (closed loop, or open loop at `rate`
    /// requests/s over `--paced-connections`), with the CPU time the
    /// `target`'s processes spent per request while it was measured.
    async fn measure(
        &self,
        addr: std::net::SocketAddr,
        (method, paths): (Method, Paths),
        headers: Vec<(String, String)>,
        target: Target<'_>,
        rate: Option<f64>,
    ) -> anyhow::Result<(Report, Cost)> {
        let warmup = Duration::from_secs(self.cli.warmup);
        let Target {
            proxy,
            worker,
            redis,
        } = target;
        let cpu = || async {
            let redis = match redis {
                true => placements::redis_cpu(&mut self.redis.clone())
                    .await
                    .map(Duration::from_secs_f64),
                false => None,
            };
            (proxy.and_then(Server::cpu_time), worker.cpu_time(), redis)
        };
        let (report, before, after) = load::run_sampled(
            Load {
                addr,
                connections: if rate.is_some() {
                    self.cli.paced_connections
                } else {
                    self.cli.connections
                },
                warmup,
                duration: Duration::from_secs(self.cli.seconds),
                method,
                paths,
                headers,
                body: None,
                rate,
            },
            cpu,
        )
        .await?;
        let cost = Cost {
            proxy: report.per_request_us(before.0, after.0),
            worker: report.per_request_us(before.1, after.1).unwrap_or(0.0),
            redis: report.per_request_us(before.2, after.2),
        };
        Ok((report, cost))
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }
}

fn line(label: &str, (report, cost): &(Report, Cost)) {
    println!("  {label:<22} {report}  {cost}  [load {}]", load_average());
}

async fn run(cli: &Cli) -> anyhow::Result<()> {
    anyhow::ensure!(
        cli.warmup + cli.seconds <= MAX_SCENARIO_SECS,
        "--warmup + --seconds must stay within {MAX_SCENARIO_SECS} s (one attestation per scenario)"
    );
    let dir = std::env::temp_dir().join(format!("pinned-proxy-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let redis = redis::Client::open(cli.redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await
        .context("connect to the benchmark's Redis")?;
    let bench = Bench {
        cli,
        exe: std::env::current_exe()?,
        dir,
        redis,
    };
    let prefix = deploy::unique_prefix("proxy");
    let outcome = scenarios(&bench, &prefix).await;
    let wiped = deploy::redis_wipe(&cli.redis_url, &prefix).await;
    match &wiped {
        Ok(n) => println!("\nRedis: removed {n} keys under {prefix}"),
        Err(e) => println!("\nRedis: could not remove keys under {prefix}: {e:#}"),
    }
    if outcome.is_ok() {
        let _ = std::fs::remove_dir_all(&bench.dir);
    } else {
        eprintln!("logs kept in {}", bench.dir.display());
    }
    outcome
}

/// Starts everything, measures, and stops every child before returning (so
/// the Redis keys can be wiped after).
async fn scenarios(bench: &Bench<'_>, prefix: &str) -> anyhow::Result<()> {
    let cli = bench.cli;
    let quarantine = ["--quarantine-ms".to_owned(), "0".to_owned()];
    let mut pb_mem =
        deploy::start_pinboard(&bench.exe, &quarantine, &bench.log("pinboard-memory")).await?;
    let redis_flags = [
        &quarantine[..],
        &[
            "--redis-url".to_owned(),
            cli.redis_url.clone(),
            "--redis-prefix".to_owned(),
            prefix.to_owned(),
        ],
    ]
    .concat();
    let mut pb_redis =
        deploy::start_pinboard(&bench.exe, &redis_flags, &bench.log("pinboard-redis")).await?;
    let (heartbeat, buffer) = (Duration::from_secs(1), Duration::from_secs(2));
    let mut worker_mem = deploy::start_rust_worker(
        &bench.exe,
        &pb_mem.url(),
        heartbeat,
        buffer,
        &bench.log("worker-memory"),
    )
    .await?;
    let mut worker_redis = deploy::start_rust_worker(
        &bench.exe,
        &pb_redis.url(),
        heartbeat,
        buffer,
        &bench.log("worker-redis"),
    )
    .await?;
    let op_mem = Operator::new(pb_mem.url())?;
    let op_redis = Operator::new(pb_redis.url())?;
    let patience = Duration::from_secs(15);
    let session = op_mem.session_of(worker_mem.addr, patience).await?;
    op_redis.session_of(worker_redis.addr, patience).await?;
    let warm_path = format!("{}/{WARM_ID}/hit", deploy::NAMESPACE);
    op_mem.get_ok(&warm_path, patience).await?;
    op_redis.get_ok(&warm_path, patience).await?;
    let (owner, epoch) = op_mem
        .placement(deploy::NAMESPACE, WARM_ID)
        .await?
        .context("the warm counter has no placement")?;
    anyhow::ensure!(
        owner == session,
        "warm counter placed on {owner}, not {session}"
    );
    let secret = worker_mem
        .printed("secret")
        .context("the worker printed no secret")?
        .to_owned();
    let warm = Warm {
        bench,
        path: warm_path.clone(),
        secret,
        session: session.clone(),
        epoch,
        worker_mem: &worker_mem,
        worker_redis: &worker_redis,
        pb_mem: &pb_mem,
        pb_redis: &pb_redis,
    };

    println!(
        "proxy-bench: warm GET {warm_path}; {} connections; {} round(s) of {} s per scenario after {} s warm-up; loopback, {} CPUs",
        cli.connections,
        cli.rounds,
        cli.seconds,
        cli.warmup,
        std::thread::available_parallelism().map_or(0, usize::from),
    );
    println!(
        "direct path: the same control-plane worker, with an attestation minted from its printed secret \
         for session {session} (fresh per scenario) and Pinboard-Epoch {epoch}; nginx injects the same two headers"
    );
    println!("load average at start: {}\n", load_average());

    let [mut direct, mut via_mem, mut via_redis, mut via_nginx]: [Series; 4] = Default::default();
    for round in 1..=cli.rounds {
        println!("round {round}");
        let [a, b, c, d] = warm.pass(None).await?;
        direct.0.push(a);
        via_mem.0.push(b);
        via_redis.0.push(c);
        via_nginx.0.push(d);
    }

    let paced = if cli.paced_rate > 0.0 {
        println!(
            "paced: {} requests/s over {} connections (open loop, latency from each request's scheduled time)",
            cli.paced_rate, cli.paced_connections
        );
        Some(warm.pass(Some(cli.paced_rate)).await?)
    } else {
        None
    };

    let mut placements = Series::default();
    println!("new ids through pinboard on Redis (each request a new id)");
    let grown_from = Grown::measure(&pb_redis, &worker_redis).await;
    for round in 1..=cli.placement_rounds {
        let report = bench
            .measure(
                pb_redis.addr,
                (
                    Method::GET,
                    Paths::Unique {
                        prefix: format!("{}/p{round}-", deploy::NAMESPACE),
                        suffix: "/hit".into(),
                    },
                ),
                Vec::new(),
                Target {
                    proxy: Some(&pb_redis),
                    worker: &worker_redis,
                    redis: true,
                },
                None,
            )
            .await?;
        line(&format!("round {round}"), &report);
        placements.0.push(report);
    }
    let grown = Grown::measure(&pb_redis, &worker_redis)
        .await
        .per_route(&grown_from);

    let mut store_rounds = Vec::new();
    println!(
        "new ids on pinboard's Redis placement store alone (this process, {} tasks, one connection; \
         each placement = claim + settle, the two store calls pinboard makes per new id; no HTTP, no worker)",
        cli.connections
    );
    for round in 1..=cli.placement_rounds {
        let report = placements::run_store(
            &cli.redis_url,
            &format!("{prefix}store:"),
            round,
            cli.connections,
            Duration::from_secs(cli.warmup),
            Duration::from_secs(cli.seconds),
        )
        .await?;
        println!("  round {round:<16} {report}  [load {}]", load_average());
        store_rounds.push(report);
    }

    let cluster_rounds = cluster_placements(cli, prefix).await;
    let heartbeats = heartbeats(cli, prefix).await?;
    summary(
        [&direct, &via_mem, &via_redis, &via_nginx],
        &placements,
        &store_rounds,
    );
    cluster_summary(&store_rounds, &cluster_rounds);
    if let Some((pinboard, worker)) = grown {
        println!(
            "  memory per new id, end to end: pinboard +{pinboard:.0} B per cached route \
             (RSS / pinboard_cached_routes), the worker +{worker:.0} B per instance (RSS / new ids; mimalloc)"
        );
    }
    for (what, report) in &heartbeats {
        println!("  heartbeats, store alone on {what}: {report}");
    }
    if let Some([a, b, c, d]) = &paced {
        println!(
            "  added p99 over (a), paced at {} req/s: (b) {:+.2} ms, (c) {:+.2} ms, (d) {:+.2} ms  (target < 1 ms); \
             added p50: (b) {:+.2} ms, (c) {:+.2} ms, (d) {:+.2} ms",
            cli.paced_rate,
            ms(b.0.added_p99_us(&a.0)),
            ms(c.0.added_p99_us(&a.0)),
            ms(d.0.added_p99_us(&a.0)),
            ms(b.0.p50_us as i64 - a.0.p50_us as i64),
            ms(c.0.p50_us as i64 - a.0.p50_us as i64),
            ms(d.0.p50_us as i64 - a.0.p50_us as i64),
        );
    }
    let workers = worker_pair(bench).await?;
    let instructions = if cli.no_instructions {
        None
    } else {
        instructions_per_request(&warm).await?
    };
    hot_paths(&workers, [&via_nginx, &via_mem], instructions);
    for server in [
        &mut worker_mem,
        &mut worker_redis,
        &mut pb_mem,
        &mut pb_redis,
    ] {
        stop(server).await;
    }
    Ok(())
}

/// Instructions per proxied request of nginx and of pinboard (memory
/// store) in front of the same kind of warm counter worker, each proxy under
/// callgrind (the worker is not measured); see [`instructions`].
async fn instructions_per_request(warm: &Warm<'_>) -> anyhow::Result<Option<[f64; 4]>> {
    let lengths = Lengths::default();
    println!(
        "\ninstructions per proxied request (callgrind, counted from after a warm-up request; Δ between {} and {} sequential requests on one connection, the load from this process; the worker not measured)",
        lengths.short, lengths.long
    );
    if !instructions::available() {
        println!("  skipped: valgrind not found");
        return Ok(None);
    }
    let bench = warm.bench;
    let scratch = match &bench.cli.callgrind_dir {
        Some(dir) => dir.clone(),
        None => bench.dir.join("callgrind"),
    };
    let (nginx_out, pinboard_out) = (scratch.join("nginx"), scratch.join("pinboard"));
    std::fs::create_dir_all(&nginx_out)?;
    std::fs::create_dir_all(&pinboard_out)?;
    let probe = |_| Probe {
        method: Method::GET,
        path: warm.path.clone(),
        headers: Vec::new(),
    };
    // nginx as one process, to the bench's worker, adding the headers
    // pinboard would (a fresh attestation per run).
    let nginx = instructions::per_request_with(
        |out| async move {
            let server = nginx::start_measured(
                &bench.cli.nginx,
                &bench.dir.join("nginx-callgrind"),
                warm.worker_mem.addr,
                &warm.stamped(),
                &out,
            )
            .await?;
            Ok(Run {
                server,
                company: Vec::new(),
            })
        },
        probe,
        lengths,
        &nginx_out,
    )
    .await?;
    // A fresh pinboard under callgrind with a worker of its own. Leases and
    // refreshes far apart, so no background work lands in the window.
    let pinboard = instructions::per_request_with(
        |out| async move {
            let server = instructions::under_callgrind(&out)
                .arg_os(&bench.exe)
                .args(["serve-pinboard", "--", "--listen", "127.0.0.1:0"])
                .args(["--token", deploy::TOKEN, "--quarantine-ms", "0"])
                .args(["--lease-ttl-ms", "120000", "--worker-refresh-ms", "60000"])
                .log(bench.log("pinboard-callgrind"))
                .start()
                .await?;
            let worker = deploy::start_rust_worker(
                &bench.exe,
                &server.url(),
                Duration::from_secs(30),
                Duration::from_secs(10),
                &bench.log("worker-callgrind"),
            )
            .await?;
            Operator::new(server.url())?
                .get_ok(&warm.path, Duration::from_secs(60))
                .await?;
            Ok(Run {
                server,
                company: vec![worker],
            })
        },
        probe,
        lengths,
        &pinboard_out,
    )
    .await?;
    println!(
        "  nginx {nginx:>7.0}   pinboard {pinboard:>7.0}   ratio {:.2}  (target <= 1.05)",
        pinboard / nginx
    );
    let exe = bench.exe.to_str().context("exe path")?;
    let (bare, pinned) = worker_instructions(exe, lengths, &scratch).await?;
    Ok(Some([bare, pinned, nginx, pinboard]))
}

/// The worker's side of the issue: the counter served by a pinned worker
/// on its own against the bare axum counter, warm, one id, the worker with
/// no subscriber listening at `info` and with the examples' default
/// logging; prints both ratios and answers the bare count and the first
/// worker count. The callgrind outputs go to `scratch`.
async fn worker_instructions(
    exe: &str,
    lengths: Lengths,
    scratch: &std::path::Path,
) -> anyhow::Result<(f64, f64)> {
    let warm_counter = |_: usize| "/counter/a/increment".to_owned();
    let both = [Logging::Quiet, Logging::Info];
    let (bare, pinned) = instructions::bare_and_pinned(
        exe,
        &[],
        (warm_counter, warm_counter),
        &both,
        lengths,
        scratch,
    )
    .await?;
    for (log, count) in both.iter().zip(&pinned) {
        println!(
            "  bare axum {bare:>7.0}   pinned worker {count:>7.0}   ratio {:.3}  (target <= 1.00; {log})",
            count / bare
        );
    }
    Ok((bare, pinned[0]))
}

/// The `instructions` subcommand: [`worker_instructions`] alone, its
/// callgrind outputs in `--callgrind-dir` (kept) or a scratch directory
/// (removed after).
async fn worker_instructions_alone(cli: &Cli) -> anyhow::Result<()> {
    let lengths = Lengths::default();
    println!(
        "instructions per warm request, pinned worker and bare axum counter (callgrind, counted from after a warm-up request; Δ between {} and {} sequential requests on one connection; mimalloc)",
        lengths.short, lengths.long
    );
    anyhow::ensure!(instructions::available(), "valgrind not found");
    let scratch = match &cli.callgrind_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("proxy-bench-{}", std::process::id())),
    };
    std::fs::create_dir_all(&scratch)?;
    let exe = std::env::current_exe()?;
    let counted = worker_instructions(exe.to_str().context("exe path")?, lengths, &scratch).await;
    if cli.callgrind_dir.is_none() {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    counted.map(drop)
}

/// The worker's closed-loop figures for the hot-paths table: the counter
/// through a pinned worker on its own, and the bare axum counter, warm on
/// one id (`POST /counter/a/increment`), each server alone.
async fn worker_pair(bench: &Bench<'_>) -> anyhow::Result<[(Report, Cost); 2]> {
    println!("\nworker alone: warm POST /counter/a/increment, pinned worker and bare axum counter");
    Ok([
        worker_alone(bench, "bare axum", "serve-bare").await?,
        worker_alone(bench, "pinned worker", "serve-pinned").await?,
    ])
}

/// One of [`worker_pair`]'s servers (`exe <command>`), measured alone.
async fn worker_alone(
    bench: &Bench<'_>,
    label: &str,
    command: &str,
) -> anyhow::Result<(Report, Cost)> {
    let exe = bench.exe.to_str().context("exe path")?;
    let mut server = Server::start(exe, &[command]).await?;
    let measured = bench
        .measure(
            server.addr,
            (Method::POST, Paths::Fixed("/counter/a/increment".into())),
            Vec::new(),
            Target {
                proxy: None,
                worker: &server,
                redis: false,
            },
            None,
        )
        .await;
    stop(&mut server).await;
    let measured = measured?;
    line(label, &measured);
    Ok(measured)
}

/// Issue 14's table: req/s, the server's CPU per request and its
/// instructions per request for bare axum and the pinned worker (each
/// alone), and for nginx and pinboard (memory store) in front of the same
/// worker; ratios against the baseline of each pair.
fn hot_paths(workers: &[(Report, Cost); 2], proxies: [&Series; 2], counts: Option<[f64; 4]>) {
    let [nginx, pinboard] = proxies.map(Series::best);
    let rows = [
        ("bare axum", &workers[0], workers[0].1.worker),
        ("pinned worker", &workers[1], workers[1].1.worker),
        ("nginx", &nginx, nginx.1.proxy.unwrap_or(f64::NAN)),
        (
            "pinboard, memory",
            &pinboard,
            pinboard.1.proxy.unwrap_or(f64::NAN),
        ),
    ];
    println!(
        "\nhot paths (issues 14 and 23; each figure from this run; proxies: best round, their own CPU)"
    );
    println!(
        "  {:<18} {:>9} {:>14} {:>14}",
        "", "req/s", "cpu/req (us)", "instr/req"
    );
    for (i, (label, (report, _), cpu)) in rows.iter().enumerate() {
        let instr = counts.map_or("-".to_owned(), |c| format!("{:.0}", c[i]));
        println!("  {label:<18} {:>9.0} {cpu:>14.1} {instr:>14}", report.rps);
    }
    let ratio = |a: usize, b: usize| {
        let (ra, rb) = (rows[a].1, rows[b].1);
        let instr = counts.map_or("-".to_owned(), |c| format!("{:.2}", c[a] / c[b]));
        println!(
            "  {} / {}: req/s {:.2}, cpu/req {:.2}, instr/req {instr}",
            rows[a].0,
            rows[b].0,
            ra.0.ratio(&rb.0),
            rows[a].2 / rows[b].2,
        );
    };
    ratio(1, 0);
    ratio(3, 2);
    println!("  targets: worker req/s >= 0.90 and instr <= 1.00 of bare axum; pinboard req/s >= 1.0, cpu/req <= 1.10 and instr <= 1.05 of nginx");
}

/// The four warm paths to one counter: (a) direct to the worker, (b)
/// through pinboard on the memory store, (c) through pinboard on Redis, (d)
/// through nginx.
struct Warm<'a> {
    bench: &'a Bench<'a>,
    path: String,
    secret: String,
    session: String,
    epoch: u64,
    worker_mem: &'a Server,
    worker_redis: &'a Server,
    pb_mem: &'a Server,
    pb_redis: &'a Server,
}

impl Warm<'_> {
    /// The two headers pinboard would add, for the direct path and nginx:
    /// a fresh attestation for the worker's session and its epoch.
    fn stamped(&self) -> Vec<(String, String)> {
        vec![
            (
                "pinboard-attestation".to_owned(),
                deploy::attestation(&self.secret, &self.session),
            ),
            ("pinboard-epoch".to_owned(), self.epoch.to_string()),
        ]
    }

    /// Measures (a) to (d) once each, closed loop or at `rate`, printing
    /// each line.
    async fn pass(&self, rate: Option<f64>) -> anyhow::Result<[(Report, Cost); 4]> {
        let bench = self.bench;
        let a = self
            .one(
                "(a) direct to worker",
                self.worker_mem.addr,
                self.stamped(),
                Target {
                    proxy: None,
                    worker: self.worker_mem,
                    redis: false,
                },
                rate,
            )
            .await?;
        let b = self
            .one(
                "(b) pinboard, memory",
                self.pb_mem.addr,
                Vec::new(),
                Target {
                    proxy: Some(self.pb_mem),
                    worker: self.worker_mem,
                    redis: false,
                },
                rate,
            )
            .await?;
        let c = self
            .one(
                "(c) pinboard, Redis",
                self.pb_redis.addr,
                Vec::new(),
                Target {
                    proxy: Some(self.pb_redis),
                    worker: self.worker_redis,
                    redis: true,
                },
                rate,
            )
            .await?;
        let mut proxy = nginx::start(
            &bench.cli.nginx,
            &bench.dir.join("nginx"),
            self.worker_mem.addr,
            &self.stamped(),
        )
        .await?;
        let d = self
            .one(
                "(d) nginx",
                proxy.addr,
                Vec::new(),
                Target {
                    proxy: Some(&proxy),
                    worker: self.worker_mem,
                    redis: false,
                },
                rate,
            )
            .await?;
        proxy.kill().await?;
        Ok([a, b, c, d])
    }

    /// One path, printed as `label`.
    async fn one(
        &self,
        label: &str,
        addr: std::net::SocketAddr,
        headers: Vec<(String, String)>,
        target: Target<'_>,
        rate: Option<f64>,
    ) -> anyhow::Result<(Report, Cost)> {
        let paths = Paths::Fixed(self.path.clone());
        let report = self
            .bench
            .measure(addr, (Method::GET, paths), headers, target, rate)
            .await?;
        line(label, &report);
        Ok(report)
    }
}

async fn stop(server: &mut Server) {
    let _ = server.kill().await;
}

/// What pinboard (routes cached) and the worker (instances) hold, and their
/// resident memory, at one moment of the new-id rounds.
struct Grown {
    routes: Option<f64>,
    instances: Option<f64>,
    pinboard_rss: Option<u64>,
    worker_rss: Option<u64>,
}

impl Grown {
    async fn measure(pinboard: &Server, worker: &Server) -> Self {
        let gauge = |server: &Server, family: &'static str| {
            let url = format!("{}/metrics", server.url());
            async move {
                let text = reqwest::get(url).await.ok()?.text().await.ok()?;
                text.lines()
                    .find_map(|line| line.strip_prefix(family)?.strip_prefix(' '))
                    .and_then(|value| value.trim().parse::<f64>().ok())
            }
        };
        Self {
            routes: gauge(pinboard, "pinboard_cached_routes").await,
            instances: gauge(worker, "pinned_active_instances").await,
            pinboard_rss: pinboard.rss_bytes(),
            worker_rss: worker.rss_bytes(),
        }
    }

    /// Bytes per cached route (pinboard) and per instance (the worker)
    /// grown since `from`.
    fn per_route(&self, from: &Self) -> Option<(f64, f64)> {
        let routes = self.routes? - from.routes?;
        let instances = self.instances? - from.instances?;
        if routes <= 0.0 || instances <= 0.0 {
            return None;
        }
        Some((
            self.pinboard_rss?.saturating_sub(from.pinboard_rss?) as f64 / routes,
            self.worker_rss?.saturating_sub(from.worker_rss?) as f64 / instances,
        ))
    }
}

/// The Redis side of worker heartbeats: on one Redis, then on the cluster
/// (`WAIT 1`) when it answers.
async fn heartbeats(
    cli: &Cli,
    prefix: &str,
) -> anyhow::Result<Vec<(&'static str, placements::HeartbeatReport)>> {
    let (warmup, seconds) = (
        Duration::from_secs(cli.warmup),
        Duration::from_secs(cli.seconds),
    );
    println!(
        "worker heartbeats on pinboard's Redis store alone ({} sessions, each renewing back to back: \
         supersession check, record read, renewal, pending messages; no HTTP, no challenge)",
        cli.connections
    );
    let mut out = Vec::new();
    let one = placements::run_heartbeats(
        &cli.redis_url,
        &format!("{prefix}heartbeat:"),
        cli.connections,
        warmup,
        seconds,
    )
    .await?;
    println!("  one Redis              {one}  [load {}]", load_average());
    out.push(("one Redis", one));
    match placements::run_cluster_heartbeats(
        &cli.redis_cluster_url,
        &format!("{prefix}heartbeat-cluster:"),
        1,
        cli.connections,
        warmup,
        seconds,
    )
    .await
    {
        Ok(cluster) => {
            println!(
                "  3-master cluster, WAIT 1 {cluster}  [load {}]",
                load_average()
            );
            out.push(("the 3-master cluster, WAIT 1", cluster));
        }
        Err(e) => println!(
            "  cluster skipped: {} did not answer: {e:#}",
            cli.redis_cluster_url
        ),
    }
    match deploy::redis_cluster_wipe(&cli.redis_cluster_url, prefix).await {
        Ok(n) => println!("Redis Cluster: removed {n} keys under {prefix}"),
        Err(e) => println!("Redis Cluster: could not remove keys under {prefix}: {e:#}"),
    }
    Ok(out)
}

/// The store-alone placements on the Redis Cluster, without and with the
/// `WAIT` for one replica after each claim: `(wait_replicas, rounds)`;
/// empty when the cluster does not answer. Keys go under the run's
/// prefix and are removed after.
async fn cluster_placements(cli: &Cli, prefix: &str) -> Vec<(u32, Vec<placements::StoreReport>)> {
    let mut out = Vec::new();
    for wait in [0u32, 1] {
        println!(
            "new ids on pinboard's Redis Cluster store alone (64 virtual shards over the cluster's masters,              {} tasks, WAIT for {wait} replica(s) after each claim; Redis CPU summed over every node)",
            cli.connections
        );
        let mut rounds = Vec::new();
        for round in 1..=cli.placement_rounds {
            match placements::run_cluster_store(
                &cli.redis_cluster_url,
                &format!("{prefix}cluster{wait}:"),
                wait,
                round,
                cli.connections,
                Duration::from_secs(cli.warmup),
                Duration::from_secs(cli.seconds),
            )
            .await
            {
                Ok(report) => {
                    println!("  round {round:<16} {report}  [load {}]", load_average());
                    rounds.push(report);
                }
                Err(e) => {
                    println!(
                        "  skipped: the cluster at {} did not answer: {e:#}",
                        cli.redis_cluster_url
                    );
                    return out;
                }
            }
        }
        out.push((wait, rounds));
    }
    match deploy::redis_cluster_wipe(&cli.redis_cluster_url, prefix).await {
        Ok(n) => println!("Redis Cluster: removed {n} keys under {prefix}"),
        Err(e) => println!("Redis Cluster: could not remove keys under {prefix}: {e:#}"),
    }
    out
}

fn cluster_summary(
    single: &[placements::StoreReport],
    cluster: &[(u32, Vec<placements::StoreReport>)],
) {
    let best = |rounds: &[placements::StoreReport]| {
        rounds
            .iter()
            .copied()
            .max_by(|a, b| a.rate.total_cmp(&b.rate))
    };
    let Some(one) = best(single) else { return };
    for (wait, rounds) in cluster {
        let Some(c) = best(rounds) else { continue };
        println!(
            "  placements, store alone on the 3-master cluster, WAIT {wait}: {:.0}/s ({:.2} x one Redis);              Redis CPU/placement {:.1} us ({:.2} x one Redis, all nodes), client {:.1} us;              {:.1} calls/batch; p50 {} us, p99 {} us",
            c.rate,
            c.rate / one.rate,
            c.redis_cpu_us.unwrap_or(f64::NAN),
            c.redis_cpu_us.unwrap_or(f64::NAN) / one.redis_cpu_us.unwrap_or(f64::NAN),
            c.client_cpu_us.unwrap_or(f64::NAN),
            c.ops_per_batch,
            c.p50_us,
            c.p99_us,
        );
    }
}

fn summary(warm: [&Series; 4], placements: &Series, store: &[placements::StoreReport]) {
    println!("\nsummary (best round of each scenario by requests/s)");
    if !warm[0].0.is_empty() {
        let [a, b, c, d] = warm.map(Series::best);
        let [ra, rb, rc, rd] = [&a.0, &b.0, &c.0, &d.0];
        line("(a) direct to worker", &a);
        line("(b) pinboard, memory", &b);
        line("(c) pinboard, Redis", &c);
        line("(d) nginx", &d);
        println!(
            "  ratio (b)/(d)          {:.2}  (target >= 1.0)",
            rb.ratio(rd)
        );
        println!(
            "  ratio (c)/(d)          {:.2}  (target >= 1.0)",
            rc.ratio(rd)
        );
        println!(
            "  added p99 over (a)     (b) {:+.2} ms, (c) {:+.2} ms, (d) {:+.2} ms  (closed loop: mostly queueing at saturation)",
            ms(rb.added_p99_us(ra)),
            ms(rc.added_p99_us(ra)),
            ms(rd.added_p99_us(ra)),
        );
    }
    if !placements.0.is_empty() {
        let p = placements.best();
        println!(
            "  placements, end to end {:.0}/s through pinboard on Redis, each a new id the worker activates \
             (HTTP load, proxy, Redis, worker on this machine); {}",
            p.0.rps, p.1
        );
    }
    if let Some(best) = store.iter().max_by(|a, b| a.rate.total_cmp(&b.rate)) {
        println!(
            "  placements, store alone {:.0}/s on pinboard's Redis store, no HTTP or worker (target >= 40 000/s); \
             cpu/placement client {:.1} us, Redis {:.1} us; {:.1} calls/batch; p50 {} us, p99 {} us",
            best.rate,
            best.client_cpu_us.unwrap_or(f64::NAN),
            best.redis_cpu_us.unwrap_or(f64::NAN),
            best.ops_per_batch,
            best.p50_us,
            best.p99_us,
        );
    }
    println!("load average at end: {}", load_average());
}

fn ms(us: i64) -> f64 {
    us as f64 / 1000.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match &cli.command {
        Some(Command::Serve(serve)) => serve.run().await,
        Some(Command::Instructions) => worker_instructions_alone(&cli).await,
        None => run(&cli).await,
    }
}
