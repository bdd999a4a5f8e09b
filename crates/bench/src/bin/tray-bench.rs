//! The trays benchmark (durable work queues): the jobs example
//! (`examples/jobs.rs`, release build) on SQLite and on Postgres, and its
//! Python reference twin (`examples/tests/py/jobs_app.py`, pinned 0.16.0 under
//! uvicorn) on the same Postgres database, each a child process on loopback,
//! measured in one run:
//!
//! 1. **dispatches/s, by draining a backlog.** A first server whose handler
//!    never finishes (`JOBS_WORK_MS` of an hour) admits `--jobs` jobs spread
//!    over `--ids` runner ids, one client per id, in order; every job but
//!    each id's first waits in its queue. That server is SIGKILLed, and a
//!    second one with `JOBS_WORK_MS=0` starts on the same store. Once it
//!    listens, every id is read once (the Python reference resumes a tray
//!    when its id activates; the Rust example wakes marked ids itself), and
//!    the clock runs from there until every id's `done` list holds all its
//!    jobs (polled one unfinished id at a time, pausing `--poll-ms` while
//!    it is unfinished). Jobs
//!    already done at that first read are left out of the rate. A dispatch
//!    is the whole path: the durable attempt, the handler, and the ack with
//!    the handler's `done` edit in one row write. Every `done` list is then
//!    checked to hold exactly its jobs, in admission order. A 503 (the
//!    Python reference refuses activations beyond its queue, asking for a
//!    retry) is retried after `--poll-ms`, inside the clock, and counted.
//! 2. **admissions/s.** On that second server, `--clients` closed-loop
//!    keep-alive connections each enqueue into a runner id of their own,
//!    and move to a fresh runner after `--jobs-per-runner` jobs; every
//!    answer waits until the admission is durable. The handler does no
//!    work, so each job is also dispatched while admissions go on (its
//!    writes are part of the cost, as in service). Each id's `done` list
//!    grows by one name per job and every row write carries the whole doc
//!    (the reference's row), which Postgres parses again at each write, so
//!    a runner's cost per admission grows with the jobs it took. The
//!    turnover bounds every server's rows by the same size, whatever its
//!    speed (a server too slow to reach it in the run stays on its first
//!    runners, with smaller rows and no activation in the window: the
//!    Python reference takes about 90 jobs a client). A second run keeps one
//!    runner per client for the whole run, as this bench did before: there
//!    the faster server's rows grow faster (in one run the Rust example's
//!    runners ended near 1 500 names, the reference's near 90), so its
//!    figure mixes speed with row size. It is printed beside the first,
//!    never instead of it.
//! 3. **activations.** On the same server, one client reads `done` of a
//!    fresh runner id per request, one after another, for `--seconds`: the
//!    latency of an activation, its store round trips included (a runner
//!    with no rows: the reads before its object activates, then its tray's
//!    row).
//!
//! Each figure comes with the server's CPU time (user + system, from
//! `/proc/<pid>/stat`) per operation over the same window (for admissions
//! also this process's, the load generator's, and every `postgres`
//! process's), and the Rust / Python ratios on Postgres close the run.
//! On Postgres each window also shows the server's WAL flushes
//! (`pg_stat_wal.wal_sync`, the whole server's, so other users of it
//! count too) and `pinned_tray_index`'s row updates per operation and the
//! share of them that were HOT (`pg_stat_user_tables`); the statistics
//! reach those views up to a second late, so over a short window they are
//! approximate.
//! When the database server's autovacuum is off (the test database's),
//! `pinned_tray_index` and `pinned_epoch` are vacuumed before each server's
//! backlog and before its admissions, outside the clock, as autovacuum
//! would: otherwise each run's dead row versions slow every later one.
//! `--only rs-pg,py-pg` measures some of the servers. Ids start with a prefix unique to
//! the run (`bench-tray-<pid>-<ns>-`); its Postgres rows are deleted at the
//! end.
//!
//! ```text
//! cargo build --release -p pinned-bench --bin tray-bench
//! target/release/tray-bench --python "$(scripts/venv)"     # about 40 s
//! ```
//!
//! The example is built (`cargo build --release -p pinned-examples --example
//! jobs`, a no-op when fresh) into the bench's own target directory unless
//! `--jobs-bin` names one.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use futures_util::future::try_join_all;
use http::Method;
use pinned_bench::child::{self, Server, Spawn};
use pinned_bench::load::{self, load_average, Load, Paths, Report};
use serde_json::{json, Value};
use tokio::time::Instant;

/// The namespace the jobs example (and its Python twin) hosts runners under.
const NAMESPACE: &str = "/runners";

/// The gated server's handler time per job: longer than any run.
const GATED_WORK_MS: &str = "3600000";

/// Variables of the caller's environment the servers must not inherit.
const SCRUBBED: [&str; 9] = [
    "DATABASE_URL",
    "PINNED_DB_PATH",
    "PINBOARD_URL",
    "PINBOARD_TOKEN",
    "ADVERTISE_URL",
    "PINNED_HOSTNAME",
    "NODE_ENV",
    "ENVIRONMENT",
    "APP_ENV",
];

#[derive(Parser)]
#[command(about = "trays benchmark: jobs example (SQLite, Postgres) vs the Python reference")]
struct Cli {
    /// Concurrent clients of the admissions run, each with a runner id of its own.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Measured seconds of the admissions run.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Jobs an admissions client sends one runner before it moves to a
    /// fresh one (its activation is part of the run); 0 skips that run and
    /// keeps only the one with a runner per client for the whole run.
    #[arg(long, default_value_t = 200)]
    jobs_per_runner: u64,
    /// Warm-up seconds of the admissions run.
    #[arg(long, default_value_t = 1)]
    warmup: u64,
    /// Jobs in the backlog the dispatch run drains (enough that the Rust
    /// servers' drain lasts over a second).
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    /// Runner ids the backlog is spread over.
    #[arg(long, default_value_t = 20)]
    ids: usize,
    /// Pause between polls of an unfinished id while draining, milliseconds.
    #[arg(long, default_value_t = 10)]
    poll_ms: u64,
    /// Longest a drain may take before its figure is reported as partial,
    /// and longest a request refused with a 503 is retried.
    #[arg(long, default_value_t = 90)]
    drain_timeout_secs: u64,
    /// Postgres database (the Rust example and the Python reference alike).
    #[arg(long, default_value = "postgresql://postgres@127.0.0.1:5432/test")]
    database_url: String,
    /// Python interpreter with `pinned[postgres]==0.16.0` and uvicorn
    /// (`scripts/venv` prints one).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.venv/bin/python"))]
    python: PathBuf,
    /// Directory of the Python reference app (`jobs_app.py`).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/tests/py"))]
    py_app_dir: PathBuf,
    /// The jobs example binary; default: built (release) into this
    /// binary's target directory.
    #[arg(long)]
    jobs_bin: Option<PathBuf>,
    /// Servers to measure, by tag (`rs-sqlite`, `rs-pg`, `py-pg`); default:
    /// all three. The Rust/Python ratios need `rs-pg` and `py-pg`.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

/// Which server runs the jobs app, on which store.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    RustSqlite,
    RustPostgres,
    PythonPostgres,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::RustSqlite => "Rust, SQLite",
            Kind::RustPostgres => "Rust, Postgres",
            Kind::PythonPostgres => "Python, Postgres",
        }
    }

    /// Part of the ids of this kind's runners.
    fn tag(self) -> &'static str {
        match self {
            Kind::RustSqlite => "rs-sqlite",
            Kind::RustPostgres => "rs-pg",
            Kind::PythonPostgres => "py-pg",
        }
    }
}

/// Everything one run shares.
struct Bench<'a> {
    cli: &'a Cli,
    jobs_bin: PathBuf,
    dir: PathBuf,
    /// Every id of the run starts with it.
    prefix: String,
    http: reqwest::Client,
    /// 503 answers retried (see [`Bench::json`]).
    refusals: AtomicU64,
}

/// One server's figures.
struct Figures {
    kind: Kind,
    backlog: Backlog,
    drain: Drain,
    /// Admissions with runners of at most `--jobs-per-runner` jobs (`None`
    /// when that is 0).
    turnover: Option<(Report, OperationCpu)>,
    /// Admissions with one runner per client for the whole run.
    growing: (Report, OperationCpu),
    /// Postgres's counters over the drain.
    drain_pg: Option<PgCounters>,
    /// Activations of fresh ids, one client.
    activations: Report,
    /// CPU per activation.
    activation_cpu: OperationCpu,
}

impl Figures {
    /// The admissions figure that compares servers: runners of
    /// `--jobs-per-runner` jobs, else the run with a runner per client.
    fn admissions(&self) -> &(Report, OperationCpu) {
        self.turnover.as_ref().unwrap_or(&self.growing)
    }
}

/// One admissions run's lines: its figures and, on Postgres, its counters.
fn show_admissions(shape: &str, (report, cpu): &(Report, OperationCpu), on_postgres: bool) {
    println!(
        "  admission  {report}  cpu/admission {} (bench client {}, postgres {})  [{shape}; load {}]",
        show_cpu(cpu.server),
        show_cpu(cpu.client),
        show_cpu(cpu.postgres),
        load_average(),
    );
    if on_postgres {
        let operations = usize::try_from(report.ok + report.errors).unwrap_or(usize::MAX);
        println!(
            "            {}",
            PgCounters::show(cpu.counters, operations).trim_start_matches(", ")
        );
    }
}

/// CPU per operation over a measured window, microseconds.
struct OperationCpu {
    /// The server's.
    server: Option<f64>,
    /// This process's: the load generator (a figure counts only if it is
    /// well below a core's worth).
    client: Option<f64>,
    /// Every `postgres` process's (other users of the database included).
    postgres: Option<f64>,
    /// Postgres's counters over the same window.
    counters: Option<PgCounters>,
}

/// Postgres's counters over a window: WAL flushes (`pg_stat_wal.wal_sync`,
/// the whole server's: other users of it included) and the updates of
/// `pinned_tray_index` (`pg_stat_user_tables`), all as the statistics have
/// them, which backends report up to a second late.
#[derive(Clone, Copy, Default)]
struct PgCounters {
    wal_syncs: i64,
    updates: i64,
    hot_updates: i64,
}

impl PgCounters {
    /// Reads them; `None` when the server has no such views (before PG 14).
    async fn read(url: &str) -> Option<Self> {
        let client = postgres(url).await.ok()?;
        let row = client
            .query_one(
                "SELECT (SELECT wal_sync FROM pg_stat_wal), \
                 coalesce((SELECT n_tup_upd FROM pg_stat_user_tables \
                  WHERE relid = to_regclass('pinned_tray_index')), 0), \
                 coalesce((SELECT n_tup_hot_upd FROM pg_stat_user_tables \
                  WHERE relid = to_regclass('pinned_tray_index')), 0)",
                &[],
            )
            .await
            .ok()?;
        Some(Self {
            wal_syncs: row.try_get(0).ok()?,
            updates: row.try_get(1).ok()?,
            hot_updates: row.try_get(2).ok()?,
        })
    }

    /// `after` less `before`.
    fn delta(before: Option<Self>, after: Option<Self>) -> Option<Self> {
        let (before, after) = (before?, after?);
        Some(Self {
            wal_syncs: after.wal_syncs - before.wal_syncs,
            updates: after.updates - before.updates,
            hot_updates: after.hot_updates - before.hot_updates,
        })
    }

    /// `, WAL flushes/op 1.02, tray row updates HOT 35 %`, or nothing.
    fn show(counters: Option<Self>, operations: usize) -> String {
        let Some(counters) = counters else {
            return String::new();
        };
        let hot = if counters.updates > 0 {
            format!(
                "{:.0} %",
                counters.hot_updates as f64 * 100.0 / counters.updates as f64
            )
        } else {
            "-".to_owned()
        };
        format!(
            ", WAL flushes/op {:.2}, tray row updates/op {:.2}, HOT {hot}",
            counters.wal_syncs as f64 / operations.max(1) as f64,
            counters.updates as f64 / operations.max(1) as f64,
        )
    }
}

/// The gated server's admission of the backlog.
struct Backlog {
    jobs: usize,
    elapsed: Duration,
    /// 503 answers retried.
    refusals: u64,
}

/// The drain of the backlog.
struct Drain {
    /// Jobs done between the first read and the last.
    drained: usize,
    /// Jobs already done at the first read (left out of the rate).
    before: usize,
    elapsed: Duration,
    /// Server CPU per drained job, microseconds.
    cpu_us: Option<f64>,
    /// Ids whose `done` list was not exactly their jobs in order.
    wrong: Vec<String>,
    /// The drain did not finish within the timeout.
    partial: bool,
    /// 503 answers retried.
    refusals: u64,
}

impl Drain {
    fn rate(&self) -> f64 {
        self.drained as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

fn cpu_us(spent: Option<Duration>, operations: usize) -> Option<f64> {
    spent.map(|spent| spent.as_secs_f64() * 1e6 / operations.max(1) as f64)
}

/// `, N refusals (503) retried`, or nothing.
fn refused(refusals: u64) -> String {
    if refusals == 0 {
        String::new()
    } else {
        format!(", {refusals} refusals (503) retried")
    }
}

fn show_cpu(us: Option<f64>) -> String {
    us.map_or_else(|| "-".to_owned(), |us| format!("{us:.0} us"))
}

fn spent(before: Option<Duration>, after: Option<Duration>) -> Option<Duration> {
    after?.checked_sub(before?)
}

impl Bench<'_> {
    /// `kind`'s server with the handler taking `work_ms` per job (`role`
    /// names its log). The Rust example on SQLite keeps the run's one file.
    async fn start(&self, kind: Kind, work_ms: &str, role: &str) -> anyhow::Result<Server> {
        let log = self.dir.join(format!("{}-{role}.log", kind.tag()));
        let spawn = match kind {
            Kind::RustSqlite | Kind::RustPostgres => {
                let spawn = SCRUBBED
                    .iter()
                    .fold(Spawn::new(&self.jobs_bin), |spawn, key| {
                        spawn.env_remove(key)
                    })
                    .env("PORT", "0")
                    .env("HOST", "127.0.0.1")
                    .env("RUST_LOG", "warn")
                    .env("JOBS_WORK_MS", work_ms);
                if kind == Kind::RustSqlite {
                    spawn.env("PINNED_DB_PATH", self.dir.join("jobs.db"))
                } else {
                    spawn.env("DATABASE_URL", &self.cli.database_url)
                }
            }
            Kind::PythonPostgres => {
                let addr = child::free_addr()?;
                SCRUBBED
                    .iter()
                    .fold(Spawn::new(&self.cli.python), |spawn, key| {
                        spawn.env_remove(key)
                    })
                    .args(["-m", "uvicorn", "jobs_app:app", "--host", "127.0.0.1"])
                    .args(["--port", &addr.port().to_string(), "--log-level", "warning"])
                    .arg_os("--app-dir")
                    .arg_os(&self.cli.py_app_dir)
                    .env("DATABASE_URL", &self.cli.database_url)
                    .env("JOBS_WORK_MS", work_ms)
                    .listening_on(addr)
            }
        };
        spawn
            .log(&log)
            .start()
            .await
            .with_context(|| format!("{} server ({role}); log {}", kind.label(), log.display()))
    }

    fn url(addr: SocketAddr, id: &str, action: &str) -> String {
        format!("http://{addr}{NAMESPACE}/{id}/{action}")
    }

    /// Sends the request `make` builds, again after a pause while the
    /// answer is a 503 (the Python reference refuses activations beyond its
    /// queue with "retry"), counting those refusals; answers the JSON body
    /// of the first other answer, which must be a success.
    async fn json(
        &self,
        what: &str,
        make: impl Fn() -> reqwest::RequestBuilder,
    ) -> anyhow::Result<Value> {
        // As long as a drain may take: on a busy machine the reference
        // refuses an id's read for as long as its drain keeps it full.
        let deadline = Instant::now() + Duration::from_secs(self.cli.drain_timeout_secs);
        loop {
            let response = make().send().await.with_context(|| what.to_owned())?;
            if response.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE
                && Instant::now() < deadline
            {
                self.refusals.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(self.cli.poll_ms)).await;
                continue;
            }
            return response
                .error_for_status()
                .with_context(|| what.to_owned())?
                .json()
                .await
                .with_context(|| what.to_owned());
        }
    }

    /// Refusals retried since the last call.
    fn take_refusals(&self) -> u64 {
        self.refusals.swap(0, Ordering::Relaxed)
    }

    async fn enqueue(&self, addr: SocketAddr, id: &str, name: &str) -> anyhow::Result<()> {
        let what = format!("enqueue {name} into {id}");
        let answer = self
            .json(&what, || {
                self.http
                    .post(Self::url(addr, id, "enqueue"))
                    .json(&json!({ "name": name }))
            })
            .await?;
        anyhow::ensure!(answer == json!({ "admitted": name }), "{what}: {answer}");
        Ok(())
    }

    async fn done(&self, addr: SocketAddr, id: &str) -> anyhow::Result<Vec<String>> {
        let what = format!("done of {id}");
        let answer = self
            .json(&what, || self.http.get(Self::url(addr, id, "done")))
            .await?;
        serde_json::from_value(answer["done"].clone()).with_context(|| format!("{what}: {answer}"))
    }

    /// The dispatch run's ids and the names of each one's jobs, in order.
    fn backlog_plan(&self, kind: Kind) -> Vec<(String, Vec<String>)> {
        let ids = self.cli.ids.max(1);
        (0..ids)
            .map(|i| {
                let count = self.cli.jobs / ids + usize::from(i < self.cli.jobs % ids);
                let id = format!("{}{}-d{i}", self.prefix, kind.tag());
                (id, (0..count).map(|n| format!("j{n}")).collect())
            })
            .collect()
    }

    /// Admits the backlog through a server whose handler never finishes,
    /// then SIGKILLs it.
    async fn admit_backlog(
        &self,
        kind: Kind,
        plan: &[(String, Vec<String>)],
    ) -> anyhow::Result<Backlog> {
        let mut gated = self.start(kind, GATED_WORK_MS, "gated").await?;
        let addr = gated.addr;
        self.take_refusals();
        let began = Instant::now();
        try_join_all(plan.iter().map(|(id, names)| async move {
            for name in names {
                self.enqueue(addr, id, name).await?;
            }
            anyhow::Ok(())
        }))
        .await?;
        let elapsed = began.elapsed();
        gated.kill().await?;
        Ok(Backlog {
            jobs: plan.iter().map(|(_, names)| names.len()).sum(),
            elapsed,
            refusals: self.take_refusals(),
        })
    }

    /// Drains the backlog on `server` (just started) and checks every
    /// `done` list.
    async fn drain(
        &self,
        server: &Server,
        plan: &[(String, Vec<String>)],
    ) -> anyhow::Result<Drain> {
        let addr = server.addr;
        self.take_refusals();
        let began = Instant::now();
        let cpu_before = server.cpu_time();
        // One read per id activates it (and resumes its tray).
        let first = try_join_all(plan.iter().map(|(id, _)| self.done(addr, id))).await?;
        let before: usize = first.iter().map(Vec::len).sum();
        let mut lists = first;
        let deadline = began + Duration::from_secs(self.cli.drain_timeout_secs);
        let mut partial = false;
        'ids: for ((id, names), list) in plan.iter().zip(lists.iter_mut()) {
            // Read first, pause only while unfinished: ids finish together,
            // and a pause per id would time the poll, not the drain.
            while list.len() < names.len() {
                *list = self.done(addr, id).await?;
                if list.len() >= names.len() {
                    break;
                }
                if Instant::now() >= deadline {
                    partial = true;
                    break 'ids;
                }
                tokio::time::sleep(Duration::from_millis(self.cli.poll_ms)).await;
            }
        }
        let elapsed = began.elapsed();
        let cpu_after = server.cpu_time();
        if partial {
            // Where every id got to, for the partial figure.
            for ((id, _), list) in plan.iter().zip(lists.iter_mut()) {
                *list = self.done(addr, id).await?;
            }
        }
        let total: usize = lists.iter().map(Vec::len).sum();
        let drained = total.saturating_sub(before);
        let wrong = plan
            .iter()
            .zip(&lists)
            .filter(|((_, names), list)| {
                if partial {
                    !names.starts_with(list)
                } else {
                    names != *list
                }
            })
            .map(|((id, _), _)| id.clone())
            .collect();
        Ok(Drain {
            drained,
            before,
            elapsed,
            cpu_us: cpu_us(spent(cpu_before, cpu_after), drained),
            wrong,
            partial,
            refusals: self.take_refusals(),
        })
    }

    /// Closed-loop admissions, one runner id per client at a time (a fresh
    /// one after every `per_id` jobs, or one for the whole run), with the
    /// server's CPU per admission over the measured window.
    async fn admissions(
        &self,
        kind: Kind,
        server: &Server,
        per_id: Option<u64>,
    ) -> anyhow::Result<(Report, OperationCpu)> {
        let shape = if per_id.is_some() { "a" } else { "g" };
        self.measured(
            kind,
            server,
            Load {
                addr: server.addr,
                connections: self.cli.clients,
                warmup: Duration::from_secs(self.cli.warmup),
                duration: Duration::from_secs(self.cli.seconds),
                method: Method::POST,
                paths: Paths::PerConnection {
                    prefix: format!("{NAMESPACE}/{}{}-{shape}", self.prefix, kind.tag()),
                    suffix: "/enqueue".to_owned(),
                    per_id,
                },
                headers: vec![("content-type".to_owned(), "application/json".to_owned())],
                body: Some(Bytes::from_static(br#"{"name":"x"}"#)),
                rate: None,
            },
        )
        .await
    }

    /// One client reading a fresh runner id per request, with the server's
    /// CPU per activation over the measured window.
    async fn activations(
        &self,
        kind: Kind,
        server: &Server,
    ) -> anyhow::Result<(Report, OperationCpu)> {
        self.measured(
            kind,
            server,
            Load {
                addr: server.addr,
                connections: 1,
                warmup: Duration::from_secs(self.cli.warmup),
                duration: Duration::from_secs(self.cli.seconds),
                method: Method::GET,
                paths: Paths::Unique {
                    prefix: format!("{NAMESPACE}/{}{}-n", self.prefix, kind.tag()),
                    suffix: "/done".to_owned(),
                },
                headers: Vec::new(),
                body: None,
                rate: None,
            },
        )
        .await
    }

    /// `load` against `server`, with the CPU each side spent per request
    /// over its measured window.
    async fn measured(
        &self,
        kind: Kind,
        server: &Server,
        load: Load,
    ) -> anyhow::Result<(Report, OperationCpu)> {
        let warmup = load.warmup;
        let on_postgres = kind != Kind::RustSqlite;
        let (report, (cpu_before, client_before, pg_before, counters_before)) =
            tokio::join!(load::run(load), async {
                tokio::time::sleep(warmup).await;
                (
                    server.cpu_time(),
                    child::own_cpu_time(),
                    child::cpu_time_of("postgres"),
                    self.pg_counters(on_postgres).await,
                )
            });
        let report = report?;
        let cpu_after = server.cpu_time();
        let client_after = child::own_cpu_time();
        let pg_after = child::cpu_time_of("postgres");
        let counters = PgCounters::delta(counters_before, self.pg_counters(on_postgres).await);
        let requests = usize::try_from(report.ok + report.errors).unwrap_or(usize::MAX);
        let cpu = OperationCpu {
            server: cpu_us(spent(cpu_before, cpu_after), requests),
            client: cpu_us(spent(client_before, client_after), requests),
            postgres: (kind != Kind::RustSqlite)
                .then(|| cpu_us(pg_after.checked_sub(pg_before), requests))
                .flatten(),
            counters,
        };
        Ok((report, cpu))
    }

    /// Both runs against `kind`, printed as they finish.
    async fn measure(&self, kind: Kind) -> anyhow::Result<Figures> {
        println!("{}", kind.label());
        self.vacuum_unless_autovacuum().await?;
        let plan = self.backlog_plan(kind);
        let backlog = self.admit_backlog(kind, &plan).await?;
        println!(
            "  backlog    {} jobs over {} ids admitted in {:.2} s ({:.0}/s, one client per id, handler busy{}), server SIGKILLed",
            backlog.jobs,
            plan.len(),
            backlog.elapsed.as_secs_f64(),
            backlog.jobs as f64 / backlog.elapsed.as_secs_f64().max(1e-9),
            refused(backlog.refusals),
        );
        let mut server = self.start(kind, "0", "serve").await?;
        let on_postgres = kind != Kind::RustSqlite;
        let pg_before = self.pg_counters(on_postgres).await;
        let drain = self.drain(&server, &plan).await?;
        let drain_pg = PgCounters::delta(pg_before, self.pg_counters(on_postgres).await);
        println!(
            "  dispatch   {:>7.0} jobs/s  {} jobs drained in {:.2} s ({} done before the first read{}){}  cpu/dispatch {}  [load {}]",
            drain.rate(),
            drain.drained,
            drain.elapsed.as_secs_f64(),
            drain.before,
            refused(drain.refusals),
            if drain.partial { ", PARTIAL: timed out" } else { "" },
            show_cpu(drain.cpu_us),
            load_average(),
        );
        if on_postgres {
            println!(
                "            {}",
                PgCounters::show(drain_pg, drain.drained).trim_start_matches(", ")
            );
        }
        if drain.wrong.is_empty() {
            println!("             every done list holds exactly its jobs, in admission order");
        } else {
            println!(
                "  WARNING    {} ids' done lists are not exactly their jobs in order: {}",
                drain.wrong.len(),
                drain.wrong.join(", ")
            );
        }
        let per_runner = self.cli.jobs_per_runner;
        let turnover = if per_runner > 0 {
            self.vacuum_unless_autovacuum().await?;
            let run = self.admissions(kind, &server, Some(per_runner)).await?;
            show_admissions(&format!("runners of {per_runner} jobs"), &run, on_postgres);
            Some(run)
        } else {
            None
        };
        self.vacuum_unless_autovacuum().await?;
        let growing = self.admissions(kind, &server, None).await?;
        show_admissions("a runner per client", &growing, on_postgres);
        let (activations, activation_cpu) = self.activations(kind, &server).await?;
        println!(
            "  activation {activations}  cpu/activation {} (bench client {}, postgres {})  [load {}]",
            show_cpu(activation_cpu.server),
            show_cpu(activation_cpu.client),
            show_cpu(activation_cpu.postgres),
            load_average(),
        );
        server.kill().await?;
        Ok(Figures {
            kind,
            backlog,
            drain,
            turnover,
            growing,
            drain_pg,
            activations,
            activation_cpu,
        })
    }
}

impl Bench<'_> {
    /// Postgres's counters now, when `on_postgres`.
    async fn pg_counters(&self, on_postgres: bool) -> Option<PgCounters> {
        if !on_postgres {
            return None;
        }
        PgCounters::read(&self.cli.database_url).await
    }

    /// `VACUUM pinned_tray_index, pinned_epoch` (outside the clock, before
    /// each server's backlog and before its admissions) when the server's
    /// autovacuum is off, as the test database's is. A tray row write that
    /// moves the mark is a non-HOT update (the marked index's predicate
    /// reads `marked`), so without it each run leaves thousands of dead
    /// versions and index entries that every later write wades through: the
    /// figures would fall from run to run and with the order of the servers,
    /// whoever is measured.
    async fn vacuum_unless_autovacuum(&self) -> anyhow::Result<()> {
        let client = postgres(&self.cli.database_url).await?;
        let on: String = client.query_one("SHOW autovacuum", &[]).await?.get(0);
        if on == "on" {
            return Ok(());
        }
        let exists = client
            .query_one("SELECT to_regclass('pinned_tray_index') IS NOT NULL", &[])
            .await?
            .get::<_, bool>(0);
        if exists {
            client
                .batch_execute("VACUUM pinned_tray_index, pinned_epoch")
                .await
                .context("VACUUM pinned_tray_index, pinned_epoch")?;
        }
        Ok(())
    }
}

/// The jobs example binary: `--jobs-bin`, else a release build in this
/// binary's target directory (cargo's no-op when it is fresh).
async fn jobs_binary(cli: &Cli) -> anyhow::Result<PathBuf> {
    if let Some(path) = &cli.jobs_bin {
        return Ok(path.clone());
    }
    let exe = std::env::current_exe()?;
    let target = exe
        .parent()
        .and_then(Path::parent)
        .context("this binary's target directory")?;
    let status = tokio::process::Command::new(env!("CARGO"))
        .args(["build", "--release", "--quiet", "-p", "pinned-examples"])
        .args(["--example", "jobs", "--manifest-path"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml"))
        .arg("--target-dir")
        .arg(target)
        .status()
        .await
        .context("run cargo to build the jobs example")?;
    anyhow::ensure!(status.success(), "building the jobs example failed");
    Ok(target.join("release").join("examples").join("jobs"))
}

/// A prefix no earlier run's ids share (no `%` or `_`: it is used in `LIKE`).
fn unique_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_nanos())
        .unwrap_or(0);
    format!("bench-tray-{}-{nanos}-", std::process::id())
}

async fn postgres(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connect to {url}"))?;
    tokio::spawn(connection);
    Ok(client)
}

/// Marked runner rows in the database that are not this run's: the Rust
/// example wakes (and works) every one of them when it starts.
async fn foreign_marked(url: &str, prefix: &str) -> anyhow::Result<i64> {
    let client = postgres(url).await?;
    let exists = client
        .query_one("SELECT to_regclass('pinned_tray_index') IS NOT NULL", &[])
        .await?
        .get::<_, bool>(0);
    if !exists {
        return Ok(0);
    }
    let row = client
        .query_one(
            "SELECT count(*) FROM pinned_tray_index WHERE ns = $1 AND marked AND id NOT LIKE $2",
            &[&NAMESPACE, &format!("{prefix}%")],
        )
        .await?;
    Ok(row.get(0))
}

/// Deletes this run's rows; answers how many of each table.
async fn clean_up(url: &str, prefix: &str) -> anyhow::Result<(u64, u64)> {
    let client = postgres(url).await?;
    let pattern = format!("{prefix}%");
    let trays = client
        .execute(
            "DELETE FROM pinned_tray_index WHERE ns = $1 AND id LIKE $2",
            &[&NAMESPACE, &pattern],
        )
        .await?;
    let epochs = client
        .execute(
            "DELETE FROM pinned_epoch WHERE ns = $1 AND id LIKE $2",
            &[&NAMESPACE, &pattern],
        )
        .await?;
    Ok((trays, epochs))
}

fn summary(figures: &[Figures], per_runner: u64) {
    println!("\nsummary");
    println!(
        "  {:<18} {:>13} {:>14} {:>14} {:>13} {:>14} {:>12} {:>13}",
        "server",
        "admissions/s",
        "cpu/admission",
        "1 runner adm/s",
        "dispatches/s",
        "cpu/dispatch",
        "backlog in/s",
        "pg/admission"
    );
    for f in figures {
        let (admissions, admission_cpu) = f.admissions();
        println!(
            "  {:<18} {:>13.0} {:>14} {:>14.0} {:>13.0} {:>14} {:>12.0} {:>13}",
            f.kind.label(),
            admissions.rps,
            show_cpu(admission_cpu.server),
            f.growing.0.rps,
            f.drain.rate(),
            show_cpu(f.drain.cpu_us),
            f.backlog.jobs as f64 / f.backlog.elapsed.as_secs_f64().max(1e-9),
            show_cpu(admission_cpu.postgres),
        );
    }
    let find = |kind| figures.iter().find(|f| f.kind == kind);
    if let (Some(rust), Some(python)) = (find(Kind::RustPostgres), find(Kind::PythonPostgres)) {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let cpu_ratio = |rust: Option<f64>, python: Option<f64>| match (rust, python) {
            (Some(rust), Some(python)) if rust > 0.0 => format!("{:.1}x", python / rust),
            _ => "-".to_owned(),
        };
        let shapes = if per_runner > 0 {
            format!(
                "runners of {per_runner} jobs; {:.1}x with a runner per client",
                rust.growing.0.ratio(&python.growing.0)
            )
        } else {
            "a runner per client".to_owned()
        };
        println!(
            "  Rust/Python on Postgres: admissions {:.1}x ({shapes}), dispatches {:.1}x (targets >= 20x, >= 30x), \
             activations {:.1}x; CPU per operation Python/Rust: admission {}, dispatch {}, activation {}",
            rust.admissions().0.ratio(&python.admissions().0),
            ratio(rust.drain.rate(), python.drain.rate()),
            rust.activations.ratio(&python.activations),
            cpu_ratio(rust.admissions().1.server, python.admissions().1.server),
            cpu_ratio(rust.drain.cpu_us, python.drain.cpu_us),
            cpu_ratio(rust.activation_cpu.server, python.activation_cpu.server),
        );
    }
    for f in figures {
        println!(
            "  {:<18} activation of a fresh id, one client: p50 {} us, {:.0}/s, cpu/activation {}",
            f.kind.label(),
            f.activations.p50_us,
            f.activations.rps,
            show_cpu(f.activation_cpu.server),
        );
    }
    for f in figures.iter().filter(|f| f.kind != Kind::RustSqlite) {
        let (admissions, admission_cpu) = f.admissions();
        let admitted = usize::try_from(admissions.ok + admissions.errors).unwrap_or(usize::MAX);
        println!(
            "  {:<18} Postgres per admission{}; per dispatch{}",
            f.kind.label(),
            PgCounters::show(admission_cpu.counters, admitted).trim_start_matches(','),
            PgCounters::show(f.drain_pg, f.drain.drained).trim_start_matches(','),
        );
    }
    println!("load average at end: {}", load_average());
}

async fn run(cli: &Cli) -> anyhow::Result<()> {
    anyhow::ensure!(
        cli.python.exists(),
        "no Python interpreter at {} (run scripts/venv and pass its output as --python)",
        cli.python.display()
    );
    let jobs_bin = jobs_binary(cli).await?;
    let dir = std::env::temp_dir().join(format!("pinned-tray-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let bench = Bench {
        cli,
        jobs_bin,
        dir,
        prefix: unique_prefix(),
        http: reqwest::Client::new(),
        refusals: AtomicU64::new(0),
    };
    let turnover = match cli.jobs_per_runner {
        0 => String::new(),
        jobs => format!("a fresh one every {jobs} jobs, then "),
    };
    println!(
        "tray-bench: dispatch drains a backlog of {} jobs over {} ids; admissions from {} clients \
         (an id each, {turnover}one for the whole run) for {} s after {} s warm-up; \
         Postgres {}; ids {}*; loopback, {} CPUs",
        cli.jobs,
        cli.ids,
        cli.clients,
        cli.seconds,
        cli.warmup,
        cli.database_url,
        bench.prefix,
        std::thread::available_parallelism().map_or(0, usize::from),
    );
    match foreign_marked(&cli.database_url, &bench.prefix).await {
        Ok(0) => {}
        Ok(n) => println!(
            "note: {n} marked {NAMESPACE} rows of others in the database: the Rust example works them when it starts"
        ),
        Err(e) => println!("note: could not count marked rows: {e:#}"),
    }
    println!("load average at start: {}", load_average());
    match postgres(&cli.database_url).await {
        Ok(client) => match client.query_one("SHOW autovacuum", &[]).await {
            Ok(row) if row.get::<_, String>(0) != "on" => println!(
                "the server's autovacuum is off: VACUUM pinned_tray_index, pinned_epoch before each server's backlog and admissions, outside the clock"
            ),
            _ => {}
        },
        Err(e) => println!("note: {e:#}"),
    }
    println!();
    let mut figures = Vec::new();
    let mut outcome = Ok(());
    let kinds = [Kind::RustSqlite, Kind::RustPostgres, Kind::PythonPostgres];
    for only in &cli.only {
        anyhow::ensure!(
            kinds.iter().any(|kind| kind.tag() == only),
            "--only {only}: not one of rs-sqlite, rs-pg, py-pg"
        );
    }
    for kind in kinds {
        if !cli.only.is_empty() && !cli.only.iter().any(|only| only == kind.tag()) {
            continue;
        }
        match bench.measure(kind).await {
            Ok(f) => figures.push(f),
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    if !figures.is_empty() {
        summary(&figures, cli.jobs_per_runner);
    }
    match clean_up(&cli.database_url, &bench.prefix).await {
        Ok((trays, epochs)) => println!(
            "Postgres: removed {trays} pinned_tray_index and {epochs} pinned_epoch rows under {}",
            bench.prefix
        ),
        Err(e) => println!(
            "Postgres: could not remove the rows under {}: {e:#}",
            bench.prefix
        ),
    }
    if outcome.is_ok() {
        let _ = std::fs::remove_dir_all(&bench.dir);
    } else {
        eprintln!("logs kept in {}", bench.dir.display());
    }
    outcome
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    run(&Cli::parse()).await
}
