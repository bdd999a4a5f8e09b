//! The growing-history benchmark (issue 24): one session's history grown
//! by `--entries` admissions of `--entry-bytes` each on Postgres, kept in a
//! `Log` (entries paged into rows beside the tray's row), and, in the same
//! run as the baseline, in a `Value<Vec<_>>` (the whole history in the
//! tray's row) up to `--whole-entries`.
//!
//! A worker runs in this process (requests go through its router, no
//! socket) with two namespaces, one per field kind. Each admission pushes
//! the turn's number onto the session's inbox and appends the turn to its
//! history, and answers once both are durable; the tray's handler then
//! acks the turn (its ack is a row write too, as in service). One client
//! admits one turn at a time. A warm-up session of each kind takes
//! `--warmup` turns first; each session is activated by a read before its
//! first turn, so the clock runs on admissions only.
//!
//! For each mark (10, 1 000, 1 500 and 10 000 entries; the baseline's 10,
//! 1 000 and 1 500) it prints the mean and median wall time of the
//! admissions that make its figure (the 200 before the mark; for the mark
//! 10, the first 10 of `--fresh` sessions, since one session's first 10
//! say little: an admission takes 1 ms or 8 ms as it meets the store's
//! write groups), the worker's CPU time per admission over them (this
//! process, `CLOCK_PROCESS_CPUTIME_ID`) and the Postgres server's (the
//! backends of the store's own connections, found by `application_name`,
//! from `/proc`, in 10 ms ticks), then each kind's last mark against its
//! first. It ends with the size of each tray's row and of the log's page
//! rows, and the time to read the log's latest 20 entries and all of them
//! (one store read per page), each read checked to hold every turn once,
//! in order.
//!
//! On a server whose autovacuum is off (the test database's), it vacuums
//! both tables every `--vacuum-every` admissions, outside the clock:
//! without it every write of a row leaves an index entry behind that later
//! writes of that row wade through, and any hot row's cost grows with its
//! writes, whatever its field kinds.
//!
//! Ids are in namespaces unique to the run (`/bench-log-<pid>-<ns>-log`,
//! `…-whole`); their rows are deleted at the end.
//!
//! ```text
//! cargo run --release -p pinned-bench --bin log-bench     # about 3 minutes
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use clap::Parser;
use pinned::pinned_store::{InstanceKey, PostgresOptions, PostgresStore, StateStore, TrayKey};
use pinned::tray::{Fields, Log, Queue, Tray, TrayCtx, TrayError, TrayHandler, Trays, Value};
use pinned::{BoxError, Context, HostOptions, Object, Options};
use serde_json::{json, Value as Json};
use tower::ServiceExt;

#[derive(Parser)]
#[command(about = "a growing history on Postgres: Log<T> vs Value<Vec<T>>")]
struct Cli {
    /// Entries appended to the log.
    #[arg(long, default_value_t = 10_000)]
    entries: u64,
    /// Entries appended to the baseline `Value<Vec<_>>` (every write
    /// rewrites them all, so beyond this it only costs time).
    #[arg(long, default_value_t = 1_500)]
    whole_entries: u64,
    /// Bytes of text per entry.
    #[arg(long, default_value_t = 1024)]
    entry_bytes: usize,
    /// Entries per page of the log.
    #[arg(long, default_value_t = Log::<Json>::DEFAULT_PAGE_LEN)]
    page_len: u32,
    /// Turns of the warm-up session of each kind.
    #[arg(long, default_value_t = 200)]
    warmup: u64,
    /// More marks for the log (`--marks 5000,20000`).
    #[arg(long, value_delimiter = ',')]
    marks: Vec<u64>,
    /// Sessions whose first 10 admissions make the figure at 10 entries.
    #[arg(long, default_value_t = 20)]
    fresh: u64,
    /// When the server's autovacuum is off, `VACUUM` both tables after every
    /// this many admissions (outside the clock), as autovacuum would; 0:
    /// never.
    #[arg(long, default_value_t = 1_000)]
    vacuum_every: u64,
    /// Postgres database.
    #[arg(long, default_value = "postgresql://postgres@127.0.0.1:5432/test")]
    database_url: String,
}

/// The log's page length, set once from the command line before the
/// worker starts (a tray's `Default` takes no arguments).
static PAGE_LEN: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// A session whose history is a `Log`.
struct Paged {
    inbox: Queue<u64>,
    history: Log<Json>,
}

impl Default for Paged {
    fn default() -> Self {
        let page_len = PAGE_LEN
            .get()
            .copied()
            .unwrap_or(Log::<Json>::DEFAULT_PAGE_LEN);
        Self {
            inbox: Queue::new(),
            history: Log::with_page_len(page_len),
        }
    }
}

impl Tray for Paged {
    const NAME: &'static str = "session";
    type Item = u64;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("inbox", &mut self.inbox);
        fields.field("history", &mut self.history);
    }

    fn head(&self) -> Option<u64> {
        self.inbox.front().copied()
    }

    fn ack(&mut self, _turn: &u64) {
        self.inbox.pop_front();
    }
}

/// The same session with its history in the tray's row.
#[derive(Default)]
struct Whole {
    inbox: Queue<u64>,
    history: Value<Vec<Json>>,
}

impl Tray for Whole {
    const NAME: &'static str = "session";
    type Item = u64;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("inbox", &mut self.inbox);
        fields.field("history", &mut self.history);
    }

    fn head(&self) -> Option<u64> {
        self.inbox.front().copied()
    }

    fn ack(&mut self, _turn: &u64) {
        self.inbox.pop_front();
    }
}

fn refused(error: TrayError) -> (StatusCode, String) {
    (StatusCode::SERVICE_UNAVAILABLE, error.to_string())
}

/// The session kept in a `Log`.
struct PagedSession;

impl Object for PagedSession {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(PagedSession)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route(
                "/say",
                post(|ctx: Context, text: String| async move {
                    let session = ctx.tray::<Paged>().await.map_err(refused)?;
                    session
                        .admit(|session| {
                            let turn = session.history.end();
                            session.inbox.push_back(turn);
                            session
                                .history
                                .append(json!({ "turn": turn, "text": text }));
                        })
                        .map_err(refused)?
                        .await
                        .map_err(refused)?;
                    Ok::<_, (StatusCode, String)>("admitted")
                }),
            )
            .route(
                "/latest/{count}",
                get(|ctx: Context, Path(count): Path<u64>| async move {
                    let session = ctx.tray::<Paged>().await.map_err(refused)?;
                    let read = session.read(|session| session.history.latest(count));
                    let slice = read.await.map_err(refused)?;
                    // Every turn once, in order: turn n at position n.
                    let in_order = (slice.first..)
                        .zip(&slice.entries)
                        .all(|(position, entry)| entry["turn"] == position);
                    let answer = if in_order {
                        format!(
                            "{} entries, each turn once and in order,",
                            slice.entries.len()
                        )
                    } else {
                        format!("{} entries, NOT in turn order,", slice.entries.len())
                    };
                    Ok::<_, (StatusCode, String)>(answer)
                }),
            )
    }

    fn trays() -> Trays<Self> {
        Trays::new().singleton::<Paged>()
    }
}

impl TrayHandler<Paged> for PagedSession {
    async fn handle(&self, _ctx: TrayCtx<Paged>, _turn: u64) -> Result<(), BoxError> {
        Ok(())
    }
}

/// The session kept whole in its row.
struct WholeSession;

impl Object for WholeSession {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(WholeSession)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
            .route(
                "/say",
                post(|ctx: Context, text: String| async move {
                    let session = ctx.tray::<Whole>().await.map_err(refused)?;
                    session
                        .admit(|session| {
                            let turn = session.history.len() as u64;
                            session.inbox.push_back(turn);
                            session.history.push(json!({ "turn": turn, "text": text }));
                        })
                        .map_err(refused)?
                        .await
                        .map_err(refused)?;
                    Ok::<_, (StatusCode, String)>("admitted")
                }),
            )
            .route(
                "/latest/{count}",
                get(|ctx: Context, Path(count): Path<usize>| async move {
                    let session = ctx.tray::<Whole>().await.map_err(refused)?;
                    let held = session.read(|session| session.history.len().min(count));
                    Ok::<_, (StatusCode, String)>(held.to_string())
                }),
            )
    }

    fn trays() -> Trays<Self> {
        Trays::new().singleton::<Whole>()
    }
}

impl TrayHandler<Whole> for WholeSession {
    async fn handle(&self, _ctx: TrayCtx<Whole>, _turn: u64) -> Result<(), BoxError> {
        Ok(())
    }
}

/// This process's CPU time so far.
fn cpu() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// Clock ticks per second of `/proc/<pid>/stat` (Linux's USER_HZ).
const CLOCK_TICKS: u64 = 100;

/// The `application_name` of the store's connections.
const APPLICATION: &str = "pinned-log-bench";

/// CPU time (user + system) of process `pid`, from `/proc`.
fn process_cpu(pid: i32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid …`: utime and stime are the 12th and 13th
    // fields after the name.
    let (_, rest) = stat.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis((user + system) * 1000 / CLOCK_TICKS))
}

/// The Postgres backends serving the store's connections, watched from a
/// connection of their own.
struct Backends {
    client: tokio_postgres::Client,
}

impl Backends {
    async fn connect(url: &str) -> anyhow::Result<Self> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        Ok(Self { client })
    }

    /// `VACUUM` of the rows' table: what autovacuum does, for a server
    /// that runs without it.
    async fn vacuum(&self) -> anyhow::Result<()> {
        self.client
            .batch_execute("VACUUM pinned_tray_index, pinned_epoch")
            .await
            .context("VACUUM pinned_tray_index, pinned_epoch")
    }

    /// Whether the server vacuums by itself.
    async fn autovacuum(&self) -> anyhow::Result<bool> {
        let row = self.client.query_one("SHOW autovacuum", &[]).await?;
        Ok(row.try_get::<_, String>(0)? == "on")
    }

    /// Their CPU time so far (a backend that exited takes its share along).
    async fn cpu(&self) -> Duration {
        let rows = self
            .client
            .query(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
                &[&APPLICATION],
            )
            .await
            .unwrap_or_default();
        rows.iter()
            .filter_map(|row| row.try_get::<_, i32>(0).ok())
            .filter_map(process_cpu)
            .sum()
    }
}

/// One admission's cost.
#[derive(Clone, Copy)]
struct Sample {
    wall: Duration,
    cpu: Duration,
}

/// The admissions of one session whose costs make the figure at `mark`:
/// the 200 before it, all of them up to 10.
fn span(mark: u64) -> std::ops::Range<usize> {
    let end = usize::try_from(mark).unwrap_or(usize::MAX);
    let len = if mark <= 10 { end } else { end.min(200) };
    end - len..end
}

/// A session's samples, with the Postgres server's CPU time over each
/// mark's span (read at the span's ends only: it takes a query and a scan
/// of `/proc`).
struct Grown {
    samples: Vec<Sample>,
    postgres: Vec<(u64, Duration)>,
}

/// The cost per admission at one mark.
struct Figure {
    mark: u64,
    count: usize,
    mean: Duration,
    median: Duration,
    cpu: Duration,
    postgres: Duration,
}

/// The figure at `mark` over the sessions `grown`.
fn figure(grown: &[Grown], mark: u64) -> Option<Figure> {
    let taken: Vec<Sample> = grown
        .iter()
        .filter_map(|grown| grown.samples.get(span(mark)))
        .flatten()
        .copied()
        .collect();
    let count = u32::try_from(taken.len()).ok().filter(|n| *n > 0)?;
    let postgres: Duration = grown
        .iter()
        .flat_map(|grown| &grown.postgres)
        .filter(|(at, _)| *at == mark)
        .map(|(_, postgres)| *postgres)
        .sum();
    let mut walls: Vec<Duration> = taken.iter().map(|s| s.wall).collect();
    walls.sort_unstable();
    Some(Figure {
        mark,
        count: taken.len(),
        mean: walls.iter().sum::<Duration>() / count,
        median: walls[walls.len() / 2],
        cpu: taken.iter().map(|s| s.cpu).sum::<Duration>() / count,
        postgres: postgres / count,
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One request through the worker's router; its body when it answered 200.
async fn call(router: &Router, method: &str, path: &str, body: String) -> anyhow::Result<String> {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .body(axum::body::Body::from(body))?;
    let response = router.clone().oneshot(request).await?;
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    anyhow::ensure!(status == StatusCode::OK, "{method} {path}: {status} {text}");
    Ok(text)
}

/// Where the sessions are and what they append.
struct Bench {
    router: Router,
    backends: Backends,
    text: String,
    /// Admissions between two vacuums; 0: none.
    vacuum_every: u64,
    admitted: std::sync::atomic::AtomicU64,
}

impl Bench {
    /// Admits `turns` turns to session `path` one at a time; the cost of
    /// each, and the server's over the span of each of `marks`.
    async fn grow(&self, path: &str, turns: u64, marks: &[u64]) -> anyhow::Result<Grown> {
        // The session activates (and its tray opens) before the clock runs.
        call(
            &self.router,
            "GET",
            &format!("{path}/latest/1"),
            String::new(),
        )
        .await?;
        let mut grown = Grown {
            samples: Vec::with_capacity(usize::try_from(turns).unwrap_or(0)),
            postgres: Vec::new(),
        };
        let mut opened: Vec<(u64, Duration)> = Vec::new();
        let say = format!("{path}/say");
        for done in 0..usize::try_from(turns)? {
            for mark in marks {
                if span(*mark).start == done {
                    opened.push((*mark, self.backends.cpu().await));
                }
            }
            let (began, cpu_before) = (Instant::now(), cpu());
            call(&self.router, "POST", &say, self.text.clone()).await?;
            grown.samples.push(Sample {
                wall: began.elapsed(),
                cpu: cpu().saturating_sub(cpu_before),
            });
            let admitted = self
                .admitted
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                + 1;
            if self.vacuum_every > 0 && admitted.is_multiple_of(self.vacuum_every) {
                self.backends.vacuum().await?;
            }
            for (mark, before) in &opened {
                if span(*mark).end == done + 1 {
                    let spent = self.backends.cpu().await.saturating_sub(*before);
                    grown.postgres.push((*mark, spent));
                }
            }
        }
        Ok(grown)
    }

    /// `--fresh - 1` sessions of 10 turns, then one of `entries`.
    async fn measure(
        &self,
        ns: &str,
        entries: u64,
        fresh: u64,
        marks: &[u64],
    ) -> anyhow::Result<Vec<Grown>> {
        let mut grown = Vec::new();
        for n in 1..fresh {
            grown.push(self.grow(&format!("{ns}/fresh-{n}"), 10, &[10]).await?);
        }
        grown.push(self.grow(&format!("{ns}/s"), entries, marks).await?);
        Ok(grown)
    }
}

/// Prints the figures of one field kind; its first and last.
fn report(label: &str, grown: &[Grown], marks: &[u64]) -> Option<(Figure, Figure)> {
    println!("\n{label}");
    println!(
        "  {:>7}  {:>10}  {:>9}  {:>9}  {:>14}  {:>16}",
        "entries", "admissions", "mean ms", "median ms", "worker CPU ms", "Postgres CPU ms"
    );
    let figures: Vec<Figure> = marks.iter().filter_map(|m| figure(grown, *m)).collect();
    for f in &figures {
        println!(
            "  {:>7}  {:>10}  {:>9.2}  {:>9.2}  {:>14.3}  {:>16.2}",
            f.mark,
            f.count,
            ms(f.mean),
            ms(f.median),
            ms(f.cpu),
            ms(f.postgres)
        );
    }
    let mut figures = figures.into_iter();
    let first = figures.next()?;
    let last = figures.last()?;
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    println!(
        "  at {} entries against {}: {:.2}x the mean time, {:.2}x the median, {:.2}x the worker CPU, {:.2}x the Postgres CPU",
        last.mark,
        first.mark,
        ratio(last.mean, first.mean),
        ratio(last.median, first.median),
        ratio(last.cpu, first.cpu),
        ratio(last.postgres, first.postgres),
    );
    Some((first, last))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    PAGE_LEN
        .set(cli.page_len)
        .ok()
        .context("page length set twice")?;
    let separator = if cli.database_url.contains('?') {
        '&'
    } else {
        '?'
    };
    let named = format!(
        "{}{separator}application_name={APPLICATION}",
        cli.database_url
    );
    let store = PostgresStore::open(&named, PostgresOptions::default())
        .await
        .context("Postgres must be reachable at --database-url")?;
    let store: Arc<dyn StateStore> = Arc::new(store);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let base = format!("/bench-log-{}-{stamp:x}", std::process::id());
    let (paged_ns, whole_ns) = (format!("{base}-log"), format!("{base}-whole"));
    let host = HostOptions::default().idle_timeout(Duration::from_secs(3600));
    let worker = Options::new()
        .env_vars(Vec::<(String, String)>::new())
        .host_with::<PagedSession>(&paged_ns, host.clone())
        .host_with::<WholeSession>(&whole_ns, host)
        .store(store.clone())
        .build()?;
    worker.start();
    let backends = Backends::connect(&cli.database_url).await?;
    let vacuum_every = if backends.autovacuum().await? {
        0
    } else {
        cli.vacuum_every
    };
    let bench = Bench {
        router: worker.router(),
        backends,
        vacuum_every,
        admitted: std::sync::atomic::AtomicU64::new(0),
        text: "0123456789abcdef"
            .chars()
            .cycle()
            .take(cli.entry_bytes)
            .collect(),
    };
    println!(
        "log-bench: {} entries of {} bytes in a Log (pages of {}), {} in a Value<Vec<_>>, on Postgres, one admission at a time",
        cli.entries, cli.entry_bytes, cli.page_len, cli.whole_entries
    );
    if vacuum_every > 0 {
        // Without it every upsert of a row adds an index entry that later
        // upserts of the same row wade through: the cost of a hot row
        // grows with its writes, whatever the field kind.
        println!(
            "the server's autovacuum is off: VACUUM pinned_tray_index, pinned_epoch after every {vacuum_every} admissions, outside the clock"
        );
    }

    for ns in [&paged_ns, &whole_ns] {
        bench.grow(&format!("{ns}/warmup"), cli.warmup, &[]).await?;
    }
    let kinds = [
        ("Log<T>", &paged_ns, cli.entries),
        ("Value<Vec<T>> baseline", &whole_ns, cli.whole_entries),
    ];
    let mut results = Vec::new();
    for (kind, ns, entries) in kinds {
        let mut marks = vec![10, 1_000, cli.whole_entries, entries];
        marks.extend(cli.marks.iter().filter(|mark| **mark < entries));
        marks.sort_unstable();
        marks.dedup();
        let began = Instant::now();
        let grown = bench.measure(ns, entries, cli.fresh, &marks).await?;
        let admissions: usize = grown.iter().map(|g| g.samples.len()).sum();
        let label = format!(
            "{kind} ({admissions} admissions in {:.1} s)",
            began.elapsed().as_secs_f64()
        );
        let ends = report(&label, &grown, &marks);
        results.push((grown, ends));
    }
    if let [(paged, Some((_, log_last))), (_, Some((_, whole_last)))] = &results[..] {
        if let Some(log_same) = figure(paged, whole_last.mark) {
            println!(
                "\nat {} entries an admission takes {:.2} ms with the Log, {:.2} ms with the Value<Vec<T>> ({:.1}x); at {} entries {:.2} ms with the Log",
                whole_last.mark,
                ms(log_same.mean),
                ms(whole_last.mean),
                whole_last.mean.as_secs_f64() / log_same.mean.as_secs_f64(),
                log_last.mark,
                ms(log_last.mean),
            );
        }
    }

    // What is stored, and what reading it back costs.
    let row_bytes = |ns: String| {
        let store = store.clone();
        async move {
            let row = store
                .get_tray(InstanceKey::new(&ns, "s"), TrayKey::singleton("session"), 0)
                .await?;
            Ok::<_, anyhow::Error>(row.map_or(0, |row| Json::Object(row.doc).to_string().len()))
        }
    };
    let pages = store
        .list(
            InstanceKey::new(&paged_ns, "s"),
            0,
            Some("session~history"),
            None,
        )
        .await?;
    let page_bytes = pages
        .iter()
        .map(|row| Json::Object(row.doc.clone()).to_string().len())
        .max()
        .unwrap_or(0);
    println!(
        "stored: the Log's tray row {} bytes beside {} page rows of at most {} bytes; the Value<Vec<T>>'s row {} bytes",
        row_bytes(paged_ns.clone()).await?,
        pages.len(),
        page_bytes,
        row_bytes(whole_ns.clone()).await?,
    );
    for count in [20, cli.entries] {
        let began = Instant::now();
        let path = format!("{paged_ns}/s/latest/{count}");
        let read = call(&bench.router, "GET", &path, String::new()).await?;
        println!(
            "read the Log's latest {count}: {read} in {:.2} ms",
            ms(began.elapsed())
        );
    }

    worker.close().await;
    drop(store);
    let cleaned = async {
        let pattern = format!("{base}-%");
        let client = &bench.backends.client;
        client
            .execute(
                "DELETE FROM pinned_tray_index WHERE ns LIKE $1",
                &[&pattern],
            )
            .await?;
        client
            .execute("DELETE FROM pinned_epoch WHERE ns LIKE $1", &[&pattern])
            .await?;
        Ok::<_, anyhow::Error>(())
    };
    if let Err(error) = cleaned.await {
        println!("warning: rows under {base} not deleted: {error:#}");
    }
    Ok(())
}
