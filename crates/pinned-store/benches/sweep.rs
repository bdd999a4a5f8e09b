//! The sweeper's lap on `PostgresStore` over a large table, without and with the
//! sweeper's indexes in one run, and what the indexes cost each write.
//!
//! ```text
//! cargo bench -p pinned-store --bench sweep --features postgres -- [--rows 1000000]
//!     [--due 1000] [--marked 1000] [--limit 256] [--writers 64] [--writes 40] [--url …]
//! ```
//!
//! In a schema of its own (dropped at the end) it fills `pinned_tray_index` with
//! `--rows` rows: instances of ten rows (nine `kv` rows with an 80-byte doc, one alarm
//! row), `--due` alarms due and the rest a day ahead, `--marked` instances with a marked
//! row, every instance at epoch 1. Then it measures, without the indexes and with them:
//!
//! - **laps**: `due_alarms(now, limit)` and one page of `marked_instances` after a cursor
//!   carried across laps (wrapping when a page comes back short), as pinboard's sweeper
//!   does, for at least 20 laps and 2 s; the lap time (median, p90), the database
//!   backends' CPU per lap (`/proc/<pid>/stat` of the store's connections: the server
//!   must be local), and for each scan the rows and buffers one execution reads
//!   (`EXPLAIN (ANALYZE, BUFFERS)`).
//! - **writes**: `--writers` instances writing concurrently, `--writes` each, three
//!   kinds in turn: a `kv` row's doc replaced, the alarm moved, a `kv` row marked and
//!   unmarked. Per kind: writes/s, backend CPU and WAL bytes per write, and the share of
//!   updates the server made HOT (no index entry written). Each measured pass follows a
//!   warm-up pass and a `VACUUM`, so every pass starts from pages with the same free space.
//!
//! Between the lap phases the indexes are built (`build_sweep_indexes`, timed). The writes
//! run in four rounds, with the indexes, without, without, with (dropped and built again
//! in between), and each figure is the mean of its two rounds. No figure is asserted; the
//! server is shared with whatever else runs, so expect noise.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use pinned_store::conformance::{database_url, doc};
use pinned_store::{
    InstanceKey, PlanChoice, PostgresOptions, PostgresStore, StateStore, SweepIndexBuild,
    SweepScan, TrayKey, ALARM_DUE_INDEX, ALARM_TRAY, MARKED_INDEX,
};
use serde_json::{json, Value};
use tokio::time::Instant;

const NS: &str = "/bench";
/// `USER_HZ`, the unit of `/proc/<pid>/stat` times.
const CLOCK_TICKS: f64 = 100.0;
const POOL: usize = 8;

struct Args {
    rows: usize,
    due: usize,
    marked: usize,
    limit: usize,
    writers: usize,
    writes: usize,
    url: String,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        rows: 1_000_000,
        due: 1000,
        marked: 1000,
        limit: 256,
        writers: 64,
        writes: 40,
        url: database_url(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--rows" => args.rows = value()?.parse()?,
            "--due" => args.due = value()?.parse()?,
            "--marked" => args.marked = value()?.parse()?,
            "--limit" => args.limit = value()?.parse()?,
            "--writers" => args.writers = value()?.parse()?,
            "--writes" => args.writes = value()?.parse()?,
            "--url" => args.url = value()?,
            "--bench" => {} // passed by `cargo bench`
            other => bail!("unknown flag {other}"),
        }
    }
    let instances = args.rows / 10;
    if instances == 0 || args.due == 0 || args.marked == 0 || args.limit == 0 {
        bail!("--rows must be at least 10, and --due, --marked, --limit at least 1");
    }
    if args.due > instances || args.marked > instances || args.writers > instances {
        bail!("--due, --marked and --writers must not exceed --rows / 10 ({instances})");
    }
    Ok(args)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The bench's own schema and the raw connection that inspects it.
struct Bench {
    schema: String,
    app: String,
    client: tokio_postgres::Client,
    url: String,
}

impl Bench {
    async fn new(url: &str) -> anyhow::Result<Self> {
        let schema = format!("sweep_bench_{}", std::process::id());
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .context("connect to Postgres")?;
        tokio::spawn(conn);
        client
            .batch_execute(&format!(
                "SET client_min_messages = warning; DROP SCHEMA IF EXISTS {schema} CASCADE; \
                 CREATE SCHEMA {schema}; SET search_path = {schema}"
            ))
            .await?;
        Ok(Self {
            app: schema.replace('_', "-"),
            schema,
            client,
            url: url.to_owned(),
        })
    }

    /// A store on the bench's schema (tables set up already: no `setup`, which would
    /// start building the indexes), its connections named so their backends can be
    /// found.
    async fn store(&self) -> anyhow::Result<PostgresStore> {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        let store = PostgresStore::connect(
            &format!("{}{sep}application_name={}", self.url, self.app),
            PostgresOptions {
                pool_size: POOL,
                transaction_sql: Some(format!("SET LOCAL search_path = {}", self.schema)),
                ..PostgresOptions::default()
            },
        )?;
        // Dial every connection now, so the backends measured are all there.
        let warm = (0..POOL).map(|_| store.due_alarms(0, 1));
        futures_util::future::try_join_all(warm).await?;
        Ok(store)
    }

    /// CPU seconds the store's backends used so far.
    async fn backend_cpu(&self) -> anyhow::Result<f64> {
        let pids: Vec<i32> = self
            .client
            .query(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
                &[&self.app],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut ticks = 0u64;
        for pid in pids {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .with_context(|| format!("read /proc/{pid}/stat: is the server local?"))?;
            let (_, rest) = stat.rsplit_once(')').context("a /proc stat line")?;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            ticks += fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
        }
        Ok(ticks as f64 / CLOCK_TICKS)
    }

    async fn exec(&self, sql: &str) -> anyhow::Result<()> {
        self.client
            .batch_execute(sql)
            .await
            .with_context(|| sql.to_owned())
    }

    async fn wal_lsn(&self) -> anyhow::Result<String> {
        Ok(self
            .client
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await?
            .get(0))
    }

    async fn wal_since(&self, lsn: &str) -> anyhow::Result<f64> {
        Ok(self
            .client
            .query_one(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::float8",
                &[&lsn],
            )
            .await?
            .get(0))
    }

    /// `(updates, HOT updates)` of the tray table, as the statistics have them.
    async fn updates(&self) -> anyhow::Result<(i64, i64)> {
        let row = self
            .client
            .query_one(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables \
                 WHERE relid = ($1 || '.pinned_tray_index')::regclass",
                &[&self.schema],
            )
            .await?;
        Ok((row.get(0), row.get(1)))
    }

    /// Waits (at most 30 s) until the statistics count `target` updates, as the
    /// backends of a dropped store flush them on exit; returns `(updates, HOT updates)`.
    async fn updates_reach(&self, target: i64) -> anyhow::Result<(i64, i64)> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = self.updates().await?;
            if now.0 >= target {
                return Ok(now);
            }
            if Instant::now() > deadline {
                bail!("the statistics count {} updates, not {target}", now.0);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn sizes(&self) -> anyhow::Result<String> {
        let row = self
            .client
            .query_one(
                "SELECT pg_size_pretty(pg_relation_size('pinned_tray_index')), \
                 pg_size_pretty(pg_relation_size('pinned_tray_index_pkey'))",
                &[],
            )
            .await?;
        let (table, pkey): (String, String) = (row.get(0), row.get(1));
        Ok(format!("table {table}, primary key {pkey}"))
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema);
        let url = self.url.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async move {
                let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .ok()?;
                tokio::spawn(conn);
                client.batch_execute(&sql).await.ok()
            })
        })
        .join();
    }
}

/// The rows of the bench (see the module doc).
fn fill_sql(args: &Args, now: i64) -> String {
    let instances = args.rows / 10;
    let due_every = instances / args.due;
    let marked_every = instances / args.marked;
    format!(
        "INSERT INTO pinned_epoch (ns, id, epoch) \
         SELECT '{NS}', 'i' || lpad(i::text, 8, '0'), 1 FROM generate_series(1, {instances}) i; \
         INSERT INTO pinned_tray_index (ns, id, tray_ns, tray_id, marked, doc) \
         SELECT '{NS}', 'i' || lpad(i::text, 8, '0'), 'kv', 'k' || k, \
           k = 0 AND i % {marked_every} = 0, jsonb_build_object('v', i, 'pad', repeat('x', 64)) \
         FROM generate_series(1, {instances}) i, generate_series(0, 8) k; \
         INSERT INTO pinned_tray_index (ns, id, tray_ns, tray_id, marked, doc) \
         SELECT '{NS}', 'i' || lpad(i::text, 8, '0'), 'pinned', 'alarm', false, \
           jsonb_build_object('at', CASE WHEN i % {due_every} = 0 THEN {now} - i \
             ELSE {now} + 86400000 + i END, 'nonce', 'n' || i) \
         FROM generate_series(1, {instances}) i"
    )
}

fn instance_id(i: usize) -> String {
    format!("i{:08}", i + 1)
}

/// Lap figures of one phase.
struct Laps {
    laps: usize,
    median_ms: f64,
    p90_ms: f64,
    cpu_ms_per_lap: f64,
}

async fn laps(bench: &Bench, store: &PostgresStore, limit: usize) -> anyhow::Result<Laps> {
    let mut cursor: Option<(String, String)> = None;
    let mut times = Vec::new();
    let cpu = bench.backend_cpu().await?;
    let start = Instant::now();
    while times.len() < 20 || start.elapsed() < Duration::from_secs(2) {
        let lap = Instant::now();
        let due = store.due_alarms(now_ms(), limit).await?;
        std::hint::black_box(due);
        let after = cursor.as_ref().map(|(n, i)| (n.as_str(), i.as_str()));
        let page = store.marked_instances(after, limit).await?;
        cursor = if page.len() < limit {
            None
        } else {
            page.last().map(|m| (m.ns.clone(), m.id.clone()))
        };
        times.push(lap.elapsed().as_secs_f64() * 1000.0);
    }
    let cpu = bench.backend_cpu().await? - cpu;
    times.sort_by(f64::total_cmp);
    let pick = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    Ok(Laps {
        laps: times.len(),
        median_ms: pick(0.5),
        p90_ms: pick(0.9),
        cpu_ms_per_lap: cpu * 1000.0 / times.len() as f64,
    })
}

/// `(rows read by the scan nodes, buffers touched)` of one execution of `scan`.
async fn reads(store: &PostgresStore, scan: SweepScan<'_>) -> anyhow::Result<(f64, f64, String)> {
    fn walk(node: &Value, rows: &mut f64, how: &mut Vec<String>) {
        let kind = node["Node Type"].as_str().unwrap_or_default();
        if kind.contains("Scan") {
            let num = |key: &str| node[key].as_f64().unwrap_or(0.0);
            *rows +=
                (num("Actual Rows") + num("Rows Removed by Filter")) * num("Actual Loops").max(1.0);
            how.push(match node["Index Name"].as_str() {
                Some(index) => format!("{kind} on {index}"),
                None => kind.to_owned(),
            });
        }
        for child in node["Plans"].as_array().into_iter().flatten() {
            walk(child, rows, how);
        }
    }
    let plan = store.explain(scan, PlanChoice::Custom, true).await?;
    let top = &plan[0]["Plan"];
    let (mut rows, mut how) = (0.0, Vec::new());
    walk(top, &mut rows, &mut how);
    let buffers = top["Shared Hit Blocks"].as_f64().unwrap_or(0.0)
        + top["Shared Read Blocks"].as_f64().unwrap_or(0.0);
    Ok((rows, buffers, how.join(", ")))
}

/// What one kind of write cost.
struct Writes {
    per_second: f64,
    cpu_us: f64,
    wal_bytes: f64,
    hot: f64,
}

#[derive(Clone, Copy)]
enum Kind {
    Doc,
    Alarm,
    Mark,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Doc, Kind::Alarm, Kind::Mark];

    fn name(self) -> &'static str {
        match self {
            Kind::Doc => "kv doc replaced",
            Kind::Alarm => "alarm moved",
            Kind::Mark => "kv row marked/unmarked",
        }
    }
}

async fn write_pass(store: &Arc<PostgresStore>, args: &Args, kind: Kind) -> anyhow::Result<()> {
    let stride = args.rows / 10 / args.writers;
    let tasks: Vec<_> = (0..args.writers)
        .map(|w| {
            let store = store.clone();
            let writes = args.writes;
            tokio::spawn(async move {
                // Spread over the table: writer w owns instance w * stride.
                let id = instance_id(w * stride);
                let key = InstanceKey::new(NS, &id);
                for n in 0..writes {
                    let (tray, marked, body) = match kind {
                        Kind::Doc => (
                            TrayKey::new("kv", "k3"),
                            false,
                            json!({"v": n, "pad": "y".repeat(64)}),
                        ),
                        Kind::Alarm => (
                            ALARM_TRAY,
                            false,
                            json!({"at": now_ms() + 86_400_000 + n as i64, "nonce": format!("w{n}")}),
                        ),
                        Kind::Mark => (
                            TrayKey::new("kv", "k4"),
                            // Unmarked by the last write, so the scans see no more rows.
                            n % 2 == 0 && n + 1 < writes,
                            json!({"v": n, "pad": "z".repeat(64)}),
                        ),
                    };
                    store.set_tray(key, tray, marked, doc(body), 1).await?;
                }
                Ok::<_, pinned_store::StoreError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(())
}

async fn writes(bench: &Bench, args: &Args, kind: Kind) -> anyhow::Result<Writes> {
    let count = (args.writers * args.writes) as i64;
    // A warm-up pass on a store of its own, dropped: its backends exit and flush their
    // statistics, and the vacuum leaves the pages it churned with room for the next.
    let before = bench.updates().await?.0;
    write_pass(&Arc::new(bench.store().await?), args, kind).await?;
    bench.updates_reach(before + count).await?;
    bench.exec("VACUUM pinned_tray_index").await?;
    let (updates, hot) = bench.updates().await?;
    let store = Arc::new(bench.store().await?);
    let lsn = bench.wal_lsn().await?;
    let cpu = bench.backend_cpu().await?;
    let start = Instant::now();
    write_pass(&store, args, kind).await?;
    let seconds = start.elapsed().as_secs_f64();
    let cpu = bench.backend_cpu().await? - cpu;
    let wal = bench.wal_since(&lsn).await?;
    drop(store);
    let (updates_after, hot_after) = bench.updates_reach(updates + count).await?;
    Ok(Writes {
        per_second: count as f64 / seconds,
        cpu_us: cpu * 1e6 / count as f64,
        wal_bytes: wal / count as f64,
        hot: (hot_after - hot) as f64 / (updates_after - updates).max(1) as f64,
    })
}

fn print_laps(name: &str, laps: &Laps) {
    println!(
        "  lap {name:<16} median {:>9.2} ms   p90 {:>9.2} ms   backend CPU {:>8.2} ms/lap   ({} laps)",
        laps.median_ms, laps.p90_ms, laps.cpu_ms_per_lap, laps.laps
    );
}

async fn scan_reads(store: &PostgresStore, args: &Args) -> anyhow::Result<Vec<(f64, f64)>> {
    let mid = instance_id(args.rows / 20);
    let scans = [
        (
            "due_alarms",
            SweepScan::DueAlarms {
                due_by_ms: now_ms(),
                limit: args.limit,
            },
        ),
        (
            "marked, page 1",
            SweepScan::MarkedInstances {
                after: None,
                limit: args.limit,
            },
        ),
        (
            "marked, mid page",
            SweepScan::MarkedInstances {
                after: Some((NS, &mid)),
                limit: args.limit,
            },
        ),
    ];
    let mut out = Vec::new();
    for (name, scan) in scans {
        let (rows, buffers, how) = reads(store, scan).await?;
        println!("    {name:<16} reads {rows:>9.0} rows, {buffers:>7.0} buffers   ({how})");
        out.push((rows, buffers));
    }
    Ok(out)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let bench = Bench::new(&args.url).await?;
    println!(
        "sweep lap over {} rows ({} instances; {} alarms due, {} instances marked; limit {}), \
         schema {}",
        args.rows,
        args.rows / 10,
        args.due,
        args.marked,
        args.limit,
        bench.schema
    );
    // The tables, and the indexes `setup` builds (on an empty table: at once), dropped
    // for the first phase.
    let first = PostgresStore::open(
        &args.url,
        PostgresOptions {
            transaction_sql: Some(format!("SET LOCAL search_path = {}", bench.schema)),
            ..PostgresOptions::default()
        },
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !first.sweep_indexes().await?.ready() {
        if Instant::now() > deadline {
            bail!("the indexes of an empty table took over 60 s to build");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(first);
    bench
        .exec(&format!(
            "DROP INDEX {ALARM_DUE_INDEX}; DROP INDEX {MARKED_INDEX}"
        ))
        .await?;
    let fill = Instant::now();
    bench.exec(&fill_sql(&args, now_ms())).await?;
    bench.exec("VACUUM ANALYZE pinned_epoch").await?;
    bench.exec("VACUUM ANALYZE pinned_tray_index").await?;
    let store = bench.store().await?;
    println!(
        "filled in {:.1} s: {}",
        fill.elapsed().as_secs_f64(),
        bench.sizes().await?
    );

    println!("without the sweeper indexes:");
    let plain = laps(&bench, &store, args.limit).await?;
    print_laps("", &plain);
    let plain_reads = scan_reads(&store, &args).await?;

    let built = store.build_sweep_indexes().await?;
    let SweepIndexBuild::Built { elapsed } = built else {
        bail!("expected to build the indexes, got {built:?}");
    };
    let sizes = bench
        .client
        .query_one(
            &format!(
                "SELECT pg_size_pretty(pg_relation_size('{ALARM_DUE_INDEX}')), \
                 pg_size_pretty(pg_relation_size('{MARKED_INDEX}'))"
            ),
            &[],
        )
        .await?;
    let (alarm_size, marked_size): (String, String) = (sizes.get(0), sizes.get(1));
    println!(
        "indexes built in {:.1} s (CONCURRENTLY): {ALARM_DUE_INDEX} {alarm_size}, \
         {MARKED_INDEX} {marked_size}",
        elapsed.as_secs_f64()
    );
    bench.exec("ANALYZE pinned_tray_index").await?;

    println!("with the sweeper indexes:");
    let indexed = laps(&bench, &store, args.limit).await?;
    print_laps("", &indexed);
    let indexed_reads = scan_reads(&store, &args).await?;

    println!(
        "lap: {:.0}x faster (median), {:.0}x less backend CPU; rows read per scan: {}",
        plain.median_ms / indexed.median_ms,
        plain.cpu_ms_per_lap / indexed.cpu_ms_per_lap.max(f64::MIN_POSITIVE),
        plain_reads
            .iter()
            .zip(&indexed_reads)
            .map(|(p, i)| format!("{:.0} -> {:.0}", p.0, i.0))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // Writes: without and with the indexes in the order with, without, without, with,
    // so that drift in the machine's load weighs on both alike; each figure is the mean
    // of its two rounds.
    println!(
        "writes ({} writers x {} writes, rounds with / without / without / with the indexes):",
        args.writers, args.writes
    );
    let mut rounds: [Vec<[Writes; 3]>; 2] = [Vec::new(), Vec::new()];
    for indexed in [true, false, false, true] {
        let present = store.sweep_indexes().await?.ready();
        if indexed && !present {
            store.build_sweep_indexes().await?;
            bench.exec("ANALYZE pinned_tray_index").await?;
        } else if !indexed && present {
            bench
                .exec(&format!(
                    "DROP INDEX {ALARM_DUE_INDEX}; DROP INDEX {MARKED_INDEX}"
                ))
                .await?;
        }
        let mut round = Vec::new();
        for kind in Kind::ALL {
            let figures = writes(&bench, &args, kind).await?;
            println!(
                "  {:<8} {:<24} {:>6.0} writes/s   backend CPU {:>4.0} us   WAL {:>5.0} B   HOT {:>3.0}%",
                if indexed { "with" } else { "without" },
                kind.name(),
                figures.per_second,
                figures.cpu_us,
                figures.wal_bytes,
                figures.hot * 100.0
            );
            round.push(figures);
        }
        let round: [Writes; 3] = round
            .try_into()
            .map_err(|_| anyhow::anyhow!("three kinds"))?;
        rounds[usize::from(indexed)].push(round);
    }
    println!("writes, mean of two rounds (without -> with the indexes):");
    for (k, kind) in Kind::ALL.iter().enumerate() {
        let mean = |indexed: usize, pick: fn(&Writes) -> f64| {
            let all = &rounds[indexed];
            all.iter().map(|r| pick(&r[k])).sum::<f64>() / all.len().max(1) as f64
        };
        let line = |pick: fn(&Writes) -> f64| (mean(0, pick), mean(1, pick));
        let (rate, cpu, wal, hot) = (
            line(|w| w.per_second),
            line(|w| w.cpu_us),
            line(|w| w.wal_bytes),
            line(|w| w.hot * 100.0),
        );
        println!(
            "  {:<24} {:>6.0} -> {:>6.0} writes/s   backend CPU {:>4.0} -> {:>4.0} us ({:+.0}%)   \
             WAL {:>5.0} -> {:>5.0} B ({:+.0}%)   HOT {:>3.0}% -> {:>3.0}%",
            kind.name(),
            rate.0,
            rate.1,
            cpu.0,
            cpu.1,
            (cpu.1 / cpu.0 - 1.0) * 100.0,
            wal.0,
            wal.1,
            (wal.1 / wal.0 - 1.0) * 100.0,
            hot.0,
            hot.1
        );
    }
    drop(store);
    Ok(())
}
