//! `SqliteStore`: the embedded single-file `StateStore`, the default when no database
//! URL is configured.
//!
//! Owns one SQLite connection on a dedicated thread, the tables (the same logical schema
//! as Postgres: `pinned_epoch`, `pinned_tray_index`) and group commit: operations queued
//! while the thread was busy run in one transaction, each inside its own savepoint so a
//! fenced or failed operation undoes only itself. It must never reply to a caller before
//! the transaction holding its operation has committed, and never touch the connection
//! from any other thread.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use serde_json::Value;
use tokio::sync::oneshot;

use crate::store::{check_epoch, sql_limit};
use crate::{
    BatchOp, Doc, DocText, DueAlarm, InstanceKey, MarkedInstance, Peek, PeekedRow, StateStore,
    StoreError, Tray, TrayKey, TrayRow, WorldStamp,
};

/// Most operations committed together in one group transaction.
const MAX_GROUP: usize = 512;

const SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS pinned_epoch (
  ns TEXT NOT NULL, id TEXT NOT NULL, epoch INTEGER NOT NULL,
  PRIMARY KEY (ns, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pinned_tray_index (
  ns TEXT NOT NULL, id TEXT NOT NULL,
  tray_ns TEXT NOT NULL, tray_id TEXT NOT NULL,
  marked BOOLEAN NOT NULL, doc TEXT NOT NULL,
  env TEXT NOT NULL DEFAULT '*', hostname TEXT NOT NULL DEFAULT '*',
  PRIMARY KEY (ns, id, tray_ns, tray_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS pinned_tray_index_alarm_due
  ON pinned_tray_index (json_extract(doc, '$.at'), ns, id)
  WHERE tray_ns = 'pinned' AND tray_id = 'alarm';
CREATE INDEX IF NOT EXISTS pinned_tray_index_marked
  ON pinned_tray_index (ns, id, hostname = '*', hostname, env) WHERE marked;";

/// Fence rows of instances with no row, below an epoch (`StateStore::reclaim_fences`).
/// Operations run one at a time on the store's thread, so none is under way meanwhile.
const RECLAIM_FENCES: &str = "\
DELETE FROM pinned_epoch WHERE (ns, id) IN (
  SELECT e.ns, e.id FROM pinned_epoch e WHERE e.epoch < ?1
    AND NOT EXISTS (SELECT 1 FROM pinned_tray_index t WHERE t.ns = e.ns AND t.id = e.id)
  LIMIT ?2)";

/// Due alarm rows (see `StateStore::due_alarms`). `at` must be a JSON number that is an
/// integer within `i64` (an integer too large for SQLite comes back as a REAL, caught by
/// the range test; a REAL is integer-valued when it survives the cast). Numbers compare
/// numerically across INTEGER and REAL; `ns`, `id` in byte order (BINARY). The alarm
/// index (keyed by this `at`, then `ns`, `id`) gives the order, so the scan stops after
/// `?2` rows; the unary `+` keeps the constant upper bound out of the index search, which
/// takes `at <= ?1` instead (SQLite bounds a range on one side by one term only).
const DUE_ALARMS: &str = "\
SELECT ns, id, CAST(at AS INTEGER), nonce, hostname, env FROM (
  SELECT ns, id, hostname, env, json_type(doc, '$.at') AS at_type, json_extract(doc, '$.at') AS at,
    CASE json_type(doc, '$.nonce') WHEN 'text' THEN json_extract(doc, '$.nonce') END AS nonce
  FROM pinned_tray_index WHERE tray_ns = 'pinned' AND tray_id = 'alarm')
WHERE at_type IN ('integer', 'real')
  AND at >= -9223372036854775808.0 AND +at < 9223372036854775808.0
  AND at = CAST(at AS INTEGER) AND at <= ?1
ORDER BY at, ns, id LIMIT ?2";

/// The world of one instance's marked rows: one naming a hostname before `'*'`, then the
/// smallest `(hostname, env)`; the marked index holds them in this order.
macro_rules! marked_world {
    ($column:literal) => {
        concat!(
            "(SELECT w.",
            $column,
            " FROM pinned_tray_index w WHERE w.marked AND w.ns = m.ns AND w.id = m.id \
             ORDER BY w.hostname = '*', w.hostname, w.env LIMIT 1)"
        )
    };
}

/// The first page of distinct instances with a marked row (see
/// `StateStore::marked_instances`), each with its world: the page is read in order from
/// the marked index and stops after `?1` instances, then each one's world is one lookup.
const MARKED_FIRST: &str = concat!(
    "SELECT ns, id, ",
    marked_world!("hostname"),
    ", ",
    marked_world!("env"),
    " FROM (SELECT DISTINCT ns, id FROM pinned_tray_index WHERE marked \
     ORDER BY ns, id LIMIT ?1) AS m ORDER BY ns, id"
);

/// [`MARKED_FIRST`] strictly after `(?1, ?2)`: a row-value comparison, which the index
/// takes as where to start.
const MARKED_AFTER: &str = concat!(
    "SELECT ns, id, ",
    marked_world!("hostname"),
    ", ",
    marked_world!("env"),
    " FROM (SELECT DISTINCT ns, id FROM pinned_tray_index \
     WHERE marked AND (ns, id) > (?1, ?2) ORDER BY ns, id LIMIT ?3) AS m ORDER BY ns, id"
);

/// One page of a namespace's ids holding rows (`StateStore::instance_ids`), byte order.
const INSTANCE_IDS: &str = "SELECT DISTINCT id FROM pinned_tray_index \
WHERE ns = ?1 AND (?2 IS NULL OR id > ?2) ORDER BY id LIMIT ?3";
/// An instance's fence and rows (`StateStore::peek`): one row with null tray columns
/// when it holds none.
const PEEK: &str = "SELECT e.epoch, t.tray_ns, t.tray_id, t.marked, t.doc, t.hostname, t.env \
FROM (SELECT 1) AS one LEFT JOIN pinned_epoch e ON e.ns = ?1 AND e.id = ?2 \
LEFT JOIN pinned_tray_index t ON t.ns = ?1 AND t.id = ?2 ORDER BY t.tray_ns, t.tray_id";

/// How hard SQLite works to make a commit durable (`PRAGMA synchronous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// Every commit is synced to disk before it is acknowledged: survives power loss.
    #[default]
    Full,
    /// Commits survive a process crash but the last few may be lost on power loss or an
    /// OS crash. Faster.
    Normal,
}

/// Settings of a [`SqliteStore`].
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// Stamped into the `env` column of every written row (default `"*"`).
    pub env: String,
    /// Stamped into the `hostname` column of every written row (default `"*"`).
    pub hostname: String,
    /// Durability of a commit (default [`SyncMode::Full`]).
    pub sync: SyncMode,
    /// How long to wait for another process holding the file's write lock (default 5 s).
    pub busy_timeout: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            env: "*".to_owned(),
            hostname: "*".to_owned(),
            sync: SyncMode::Full,
            busy_timeout: Duration::from_secs(5),
        }
    }
}

/// A `StateStore` in one SQLite file (WAL mode), served by a dedicated thread.
///
/// Opening the same path again after a restart sees every committed row and epoch.
/// Dropping the store lets its thread finish the queued operations and exit; use
/// [`close`](SqliteStore::close) to wait for that.
#[derive(Debug)]
pub struct SqliteStore {
    jobs: mpsc::Sender<Box<dyn Job>>,
    done: Option<oneshot::Receiver<()>>,
    path: PathBuf,
}

// === impl SqliteStore ===

impl SqliteStore {
    /// Opens (creating if needed) the database file at `path`, switches it to WAL mode
    /// and creates the tables.
    ///
    /// # Errors
    ///
    /// [`StoreError::Setup`] when the file cannot be opened or configured.
    pub async fn open(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let (jobs, rx) = mpsc::channel::<Box<dyn Job>>();
        let (ready_tx, ready_rx) = oneshot::channel();
        let (done_tx, done_rx) = oneshot::channel();
        let thread_path = path.clone();
        thread::Builder::new()
            .name("pinned-sqlite".to_owned())
            .spawn(move || {
                let conn = match open_connection(&thread_path, &options) {
                    Ok(conn) => {
                        let _ = ready_tx.send(Ok(()));
                        conn
                    }
                    Err(err) => {
                        let _ = ready_tx.send(Err(err));
                        return;
                    }
                };
                let mut worker = Worker { conn, options };
                worker.serve(&rx);
                drop(worker);
                let _ = done_tx.send(());
            })
            .map_err(|e| StoreError::Setup { source: e.into() })?;
        match ready_rx.await {
            Ok(Ok(())) => Ok(Self {
                jobs,
                done: Some(done_rx),
                path,
            }),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(StoreError::Closed),
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Finishes the queued operations, closes the file and waits for the thread to exit.
    pub async fn close(mut self) {
        let done = self.done.take();
        drop(self);
        if let Some(done) = done {
            let _ = done.await;
        }
    }

    /// Queues `f` to run inside its own savepoint on the store's thread and waits until
    /// its transaction has committed.
    async fn run<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection, &SqliteOptions) -> Result<R, StoreError> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let job = Pending {
            f: Some(f),
            out: None,
            reply,
        };
        self.jobs
            .send(Box::new(job))
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }
}

fn open_connection(path: &Path, options: &SqliteOptions) -> Result<Connection, StoreError> {
    let setup = |e: rusqlite::Error| StoreError::Setup { source: e.into() };
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(setup)?;
    conn.busy_timeout(options.busy_timeout).map_err(setup)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(setup)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Setup {
            source: format!(
                "could not switch {} to WAL mode (got {mode})",
                path.display()
            )
            .into(),
        });
    }
    let sync = match options.sync {
        SyncMode::Full => "FULL",
        SyncMode::Normal => "NORMAL",
    };
    conn.execute_batch(&format!("PRAGMA synchronous = {sync};"))
        .map_err(setup)?;
    conn.execute_batch(&format!("BEGIN IMMEDIATE; {SCHEMA} COMMIT;"))
        .map_err(setup)?;
    Ok(conn)
}

// === the store's thread ===

/// One queued operation, type-erased so operations with different results share a queue.
trait Job: Send {
    /// Runs the operation (already inside its savepoint); false if it failed.
    fn run(&mut self, conn: &Connection, options: &SqliteOptions) -> bool;
    /// Replies to the caller once the group's outcome is known.
    fn finish(self: Box<Self>, group: Result<(), &StoreError>);
}

impl std::fmt::Debug for dyn Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Job")
    }
}

struct Pending<R, F> {
    f: Option<F>,
    out: Option<Result<R, StoreError>>,
    reply: oneshot::Sender<Result<R, StoreError>>,
}

impl<R, F> Job for Pending<R, F>
where
    R: Send + 'static,
    F: FnOnce(&Connection, &SqliteOptions) -> Result<R, StoreError> + Send + 'static,
{
    fn run(&mut self, conn: &Connection, options: &SqliteOptions) -> bool {
        let out = match self.f.take() {
            Some(f) => f(conn, options),
            None => Err(StoreError::Closed),
        };
        let ok = out.is_ok();
        self.out = Some(out);
        ok
    }

    fn finish(self: Box<Self>, group: Result<(), &StoreError>) {
        let out = match (self.out, group) {
            // The operation's own failure stands whatever happened to the group.
            (Some(Err(own)), _) => Err(own),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (_, Err(group)) => Err(clone_group_error(group)),
            (None, Ok(())) => Err(StoreError::Closed),
        };
        // The caller may have stopped waiting; its operation still ran (or not) as one.
        let _ = self.reply.send(out);
    }
}

fn clone_group_error(err: &StoreError) -> StoreError {
    match err {
        StoreError::Sqlite { source } => StoreError::Sqlite {
            source: source.clone(),
        },
        other => StoreError::Setup {
            source: other.to_string().into(),
        },
    }
}

struct Worker {
    conn: Connection,
    options: SqliteOptions,
}

impl Worker {
    fn serve(&mut self, rx: &mpsc::Receiver<Box<dyn Job>>) {
        while let Ok(first) = rx.recv() {
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(job) => group.push(job),
                    Err(_) => break,
                }
            }
            self.run_group(group);
        }
    }

    /// Runs `group` in one transaction, one savepoint per job, then replies to all.
    fn run_group(&mut self, mut group: Vec<Box<dyn Job>>) {
        let outcome = (|| -> Result<(), StoreError> {
            let mut tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            for job in &mut group {
                let sp = tx.savepoint()?;
                if job.run(&sp, &self.options) {
                    sp.commit()?;
                } else {
                    // Dropping a savepoint rolls it back: the failed job leaves no trace.
                    drop(sp);
                }
            }
            tx.commit()?;
            Ok(())
        })();
        if let Err(err) = &outcome {
            tracing::warn!(error = %err, ops = group.len(), "sqlite group transaction failed");
        }
        for job in group {
            job.finish(outcome.as_ref().map(|_| ()));
        }
    }
}

// === operations (run on the store's thread) ===

/// Acquires `(ns, id)` at `epoch` inside the open transaction.
fn acquire(conn: &Connection, ns: &str, id: &str, epoch: u64) -> Result<(), StoreError> {
    let want = check_epoch(epoch)?;
    let stored: Option<i64> = conn
        .prepare_cached("SELECT epoch FROM pinned_epoch WHERE ns = ?1 AND id = ?2")?
        .query_row(params![ns, id], |row| row.get(0))
        .optional()?;
    match stored {
        None => {
            conn.prepare_cached("INSERT INTO pinned_epoch (ns, id, epoch) VALUES (?1, ?2, ?3)")?
                .execute(params![ns, id, want])?;
        }
        Some(stored) if want < stored => {
            return Err(StoreError::fence_lost(InstanceKey::new(ns, id), epoch))
        }
        Some(stored) if want > stored => {
            conn.prepare_cached("UPDATE pinned_epoch SET epoch = ?3 WHERE ns = ?1 AND id = ?2")?
                .execute(params![ns, id, want])?;
        }
        Some(_) => {}
    }
    Ok(())
}

fn upsert(
    conn: &Connection,
    options: &SqliteOptions,
    (ns, id): (&str, &str),
    (tray_ns, tray_id): (&str, &str),
    marked: bool,
    doc: &DocText,
) -> Result<(), StoreError> {
    let text = doc.as_str();
    conn.prepare_cached(
        "INSERT INTO pinned_tray_index (ns, id, tray_ns, tray_id, marked, doc, env, hostname) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
         ON CONFLICT (ns, id, tray_ns, tray_id) DO UPDATE SET marked = excluded.marked, \
         doc = excluded.doc, env = excluded.env, hostname = excluded.hostname",
    )?
    .execute(params![
        ns,
        id,
        tray_ns,
        tray_id,
        marked,
        text,
        options.env,
        options.hostname
    ])?;
    Ok(())
}

fn delete(
    conn: &Connection,
    (ns, id): (&str, &str),
    (tray_ns, tray_id): (&str, &str),
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "DELETE FROM pinned_tray_index WHERE ns = ?1 AND id = ?2 AND tray_ns = ?3 AND tray_id = ?4",
    )?
    .execute(params![ns, id, tray_ns, tray_id])?;
    Ok(())
}

/// Parses a stored doc, which must be a JSON object.
fn parse_doc(text: &str, key: impl FnOnce() -> String) -> Result<Doc, StoreError> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(doc)) => Ok(doc),
        Ok(other) => Err(StoreError::Corrupt {
            key: key(),
            detail: format!("doc is not a JSON object: {other}"),
        }),
        Err(e) => Err(StoreError::Corrupt {
            key: key(),
            detail: format!("doc is not JSON: {e}"),
        }),
    }
}

#[async_trait]
impl StateStore for SqliteStore {
    async fn set_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        marked: bool,
        doc: Doc,
        epoch: u64,
    ) -> Result<(), StoreError> {
        let InstanceKey { ns, id } = instance;
        let TrayKey { tray_ns, tray_id } = tray;
        check_epoch(epoch)?;
        let (ns, id, tray_ns, tray_id) = owned4(ns, id, tray_ns, tray_id);
        let doc = DocText::from(doc);
        self.run(move |conn, options| {
            acquire(conn, &ns, &id, epoch)?;
            upsert(
                conn,
                options,
                (&ns, &id),
                (&tray_ns, &tray_id),
                marked,
                &doc,
            )
        })
        .await
    }

    async fn delete_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        let InstanceKey { ns, id } = instance;
        let TrayKey { tray_ns, tray_id } = tray;
        check_epoch(epoch)?;
        let (ns, id, tray_ns, tray_id) = owned4(ns, id, tray_ns, tray_id);
        self.run(move |conn, _| {
            acquire(conn, &ns, &id, epoch)?;
            delete(conn, (&ns, &id), (&tray_ns, &tray_id))
        })
        .await
    }

    async fn get_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        epoch: u64,
    ) -> Result<Option<Tray>, StoreError> {
        let InstanceKey { ns, id } = instance;
        let TrayKey { tray_ns, tray_id } = tray;
        check_epoch(epoch)?;
        let (ns, id, tray_ns, tray_id) = owned4(ns, id, tray_ns, tray_id);
        self.run(move |conn, _| {
            acquire(conn, &ns, &id, epoch)?;
            let row: Option<(bool, String)> = conn
                .prepare_cached(
                    "SELECT marked, doc FROM pinned_tray_index \
                     WHERE ns = ?1 AND id = ?2 AND tray_ns = ?3 AND tray_id = ?4",
                )?
                .query_row(params![ns, id, tray_ns, tray_id], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })
                .optional()?;
            row.map(|(marked, text)| {
                let doc = parse_doc(&text, || format!("{ns}/{id} {tray_ns}/{tray_id}"))?;
                Ok(Tray { marked, doc })
            })
            .transpose()
        })
        .await
    }

    async fn list(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
        tray_ns: Option<&str>,
        marked: Option<bool>,
    ) -> Result<Vec<TrayRow>, StoreError> {
        let InstanceKey { ns, id } = instance;
        check_epoch(epoch)?;
        let (ns, id) = (ns.to_owned(), id.to_owned());
        let filter_ns = tray_ns.map(str::to_owned);
        self.run(move |conn, _| {
            acquire(conn, &ns, &id, epoch)?;
            let mut stmt = conn.prepare_cached(
                "SELECT tray_ns, tray_id, marked, doc FROM pinned_tray_index \
                 WHERE ns = ?1 AND id = ?2 AND (?3 IS NULL OR tray_ns = ?3) \
                 AND (?4 IS NULL OR marked = ?4) ORDER BY tray_ns, tray_id",
            )?;
            let rows = stmt.query_map(params![ns, id, filter_ns, marked], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, bool>(2)?,
                    row.get::<_, String>(3)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (tray_ns, tray_id, marked, text) = row?;
                let doc = parse_doc(&text, || format!("{ns}/{id} {tray_ns}/{tray_id}"))?;
                out.push(TrayRow {
                    tray_ns,
                    tray_id,
                    marked,
                    doc,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn apply_batch(
        &self,
        instance: InstanceKey<'_>,
        ops: Vec<BatchOp>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        let InstanceKey { ns, id } = instance;
        check_epoch(epoch)?;
        let (ns, id) = (ns.to_owned(), id.to_owned());
        self.run(move |conn, options| {
            acquire(conn, &ns, &id, epoch)?;
            for op in &ops {
                match op {
                    BatchOp::Set {
                        tray_ns,
                        tray_id,
                        marked,
                        doc,
                    } => upsert(conn, options, (&ns, &id), (tray_ns, tray_id), *marked, doc)?,
                    BatchOp::Delete { tray_ns, tray_id } => {
                        delete(conn, (&ns, &id), (tray_ns, tray_id))?
                    }
                }
            }
            Ok(())
        })
        .await
    }

    async fn delete_instance(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        let InstanceKey { ns, id } = instance;
        check_epoch(epoch)?;
        let (ns, id) = (ns.to_owned(), id.to_owned());
        self.run(move |conn, _| {
            acquire(conn, &ns, &id, epoch)?;
            conn.prepare_cached("DELETE FROM pinned_tray_index WHERE ns = ?1 AND id = ?2")?
                .execute(params![ns, id])?;
            Ok(())
        })
        .await
    }

    async fn due_alarms(&self, due_by_ms: i64, limit: usize) -> Result<Vec<DueAlarm>, StoreError> {
        let limit = sql_limit(limit);
        // Runs on the store's thread like every operation (one connection), but takes no
        // fence: read-only, so its savepoint commits nothing.
        self.run(move |conn, _| {
            let mut stmt = conn.prepare_cached(DUE_ALARMS)?;
            let rows = stmt.query_map(params![due_by_ms, limit], |row| {
                Ok(DueAlarm {
                    ns: row.get(0)?,
                    id: row.get(1)?,
                    at: row.get(2)?,
                    nonce: row.get(3)?,
                    world: WorldStamp::new(row.get::<_, String>(4)?, row.get::<_, String>(5)?),
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn marked_instances(
        &self,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<MarkedInstance>, StoreError> {
        let limit = sql_limit(limit);
        let after = after.map(|(ns, id)| (ns.to_owned(), id.to_owned()));
        self.run(move |conn, _| {
            let read = |row: &rusqlite::Row<'_>| {
                Ok(MarkedInstance {
                    ns: row.get(0)?,
                    id: row.get(1)?,
                    world: WorldStamp::new(row.get::<_, String>(2)?, row.get::<_, String>(3)?),
                })
            };
            let rows = match &after {
                None => conn
                    .prepare_cached(MARKED_FIRST)?
                    .query_map(params![limit], read)?
                    .collect::<Result<Vec<_>, _>>()?,
                Some((ns, id)) => conn
                    .prepare_cached(MARKED_AFTER)?
                    .query_map(params![ns, id, limit], read)?
                    .collect::<Result<Vec<_>, _>>()?,
            };
            Ok(rows)
        })
        .await
    }

    async fn instance_ids(
        &self,
        ns: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let limit = sql_limit(limit);
        let (ns, after) = (ns.to_owned(), after.map(str::to_owned));
        self.run(move |conn, _| {
            let ids = conn
                .prepare_cached(INSTANCE_IDS)?
                .query_map(params![ns, after, limit], |row| row.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(ids)
        })
        .await
    }

    async fn peek(&self, instance: InstanceKey<'_>) -> Result<Peek, StoreError> {
        let (ns, id) = (instance.ns.to_owned(), instance.id.to_owned());
        self.run(move |conn, _| {
            type Raw = (
                Option<i64>,
                Option<String>,
                Option<String>,
                Option<bool>,
                Option<String>,
                Option<String>,
                Option<String>,
            );
            let raw = conn
                .prepare_cached(PEEK)?
                .query_map(params![ns, id], |row| {
                    Ok::<Raw, _>((
                        row.get(0)?,
                        row.get(1)?,
                        row.get(2)?,
                        row.get(3)?,
                        row.get(4)?,
                        row.get(5)?,
                        row.get(6)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let mut peek = Peek::default();
            for (epoch, tray_ns, tray_id, marked, doc, hostname, env) in raw {
                peek.epoch = epoch.and_then(|e| u64::try_from(e).ok());
                let (Some(tray_ns), Some(tray_id)) = (tray_ns, tray_id) else {
                    continue;
                };
                let doc = parse_doc(doc.as_deref().unwrap_or("{}"), || {
                    format!("{ns}/{id} {tray_ns}/{tray_id}")
                })?;
                peek.rows.push(PeekedRow {
                    row: TrayRow {
                        tray_ns,
                        tray_id,
                        marked: marked.unwrap_or(false),
                        doc,
                    },
                    world: WorldStamp::new(
                        hostname.unwrap_or_else(|| WorldStamp::ANY.to_owned()),
                        env.unwrap_or_else(|| WorldStamp::ANY.to_owned()),
                    ),
                });
            }
            Ok(peek)
        })
        .await
    }

    async fn reclaim_fences(&self, below_epoch: u64, limit: usize) -> Result<u64, StoreError> {
        let below = i64::try_from(below_epoch).unwrap_or(i64::MAX);
        let limit = sql_limit(limit);
        self.run(move |conn, _| {
            let gone = conn
                .prepare_cached(RECLAIM_FENCES)?
                .execute(params![below, limit])?;
            Ok(gone as u64)
        })
        .await
    }
}

fn owned4(a: &str, b: &str, c: &str, d: &str) -> (String, String, String, String) {
    (a.to_owned(), b.to_owned(), c.to_owned(), d.to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on the unexpected
mod tests {
    use rusqlite::StatementStatus;

    use super::*;

    /// 20 000 instances with a `kv` row each, marked on every 50th (and a second marked
    /// row by another world on every 100th); 5 000 alarm rows, all due, and odd ones.
    const FILL: &str = "\
        WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) \
        INSERT INTO pinned_tray_index (ns, id, tray_ns, tray_id, marked, doc, hostname) \
        SELECT '/s', printf('i%06d', i), 'kv', 'k0', i % 50 = 0, json_object('v', i), '*' FROM n \
        UNION ALL SELECT '/s', printf('i%06d', i), 'kv', 'k1', i % 100 = 0, '{}', 'shop.test' FROM n \
        UNION ALL SELECT '/s', printf('i%06d', i), 'pinned', 'alarm', 0, \
          json_object('at', 20000 - i, 'nonce', 'n' || i), '*' FROM n WHERE i % 4 = 0; \
        INSERT INTO pinned_tray_index (ns, id, tray_ns, tray_id, marked, doc) VALUES \
        ('/s', 'odd-string', 'pinned', 'alarm', 0, '{\"at\": \"soon\"}'), \
        ('/s', 'odd-fraction', 'pinned', 'alarm', 0, '{\"at\": 1.5}'), \
        ('/s', 'odd-huge', 'pinned', 'alarm', 0, '{\"at\": 1e30}'), \
        ('/s', 'odd-nonce', 'pinned', 'alarm', 0, '{\"at\": 7, \"nonce\": 7}'), \
        ('/s', 'odd-negative', 'pinned', 'alarm', 0, '{\"at\": -5}'); \
        ANALYZE;";

    /// The scans' SQL with their arguments: due alarms (10 of 5 000 due), the first
    /// page and a later page of marked instances (10 of 400).
    fn scans() -> [(&'static str, Vec<rusqlite::types::Value>, &'static str); 3] {
        use rusqlite::types::Value::{Integer, Text};
        [
            (
                DUE_ALARMS,
                vec![Integer(i64::MAX), Integer(10)],
                "pinned_tray_index_alarm_due",
            ),
            (MARKED_FIRST, vec![Integer(10)], "pinned_tray_index_marked"),
            (
                MARKED_AFTER,
                vec![Text("/s".into()), Text("i010000".into()), Integer(10)],
                "pinned_tray_index_marked",
            ),
        ]
    }

    /// Runs `sql`; its rows as text, and the virtual machine steps it took (a measure of
    /// the rows it visited).
    fn run(conn: &Connection, sql: &str, args: &[rusqlite::types::Value]) -> (Vec<String>, i32) {
        let mut stmt = conn.prepare(sql).unwrap();
        let rows = stmt
            .query_map(rusqlite::params_from_iter(args), |row| {
                let cells: Vec<rusqlite::types::Value> =
                    (0..4).map(|i| row.get(i)).collect::<Result<_, _>>()?;
                Ok(format!("{cells:?}"))
            })
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        (rows, stmt.get_status(StatementStatus::VmStep))
    }

    #[test]
    fn the_scans_read_a_page_through_their_indexes_and_answer_as_without_them() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        conn.execute_batch(FILL).unwrap();
        let mut indexed = Vec::new();
        for (sql, args, index) in scans() {
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let plan: Vec<String> = stmt
                .query_map(rusqlite::params_from_iter(&args), |row| row.get(3))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            let table_reads: Vec<&String> = plan
                .iter()
                .filter(|d| d.contains("pinned_tray_index") || d.starts_with("SEARCH w"))
                .collect();
            assert!(
                !table_reads.is_empty()
                    && table_reads
                        .iter()
                        .all(|d| d.contains(&format!("USING INDEX {index}"))),
                "{sql}: {plan:?}"
            );
            if sql == DUE_ALARMS {
                assert!(
                    !plan.iter().any(|d| d.contains("TEMP B-TREE")),
                    "the index gives the order, so the scan stops at the limit: {plan:?}"
                );
            }
            indexed.push(run(&conn, sql, &args));
        }
        conn.execute_batch(
            "DROP INDEX pinned_tray_index_alarm_due; DROP INDEX pinned_tray_index_marked",
        )
        .unwrap();
        for ((sql, args, _), (rows, steps)) in scans().into_iter().zip(indexed) {
            let (plain_rows, plain_steps) = run(&conn, sql, &args);
            assert_eq!(rows, plain_rows, "{sql}");
            assert_eq!(rows.len(), 10);
            assert!(
                steps * 4 < plain_steps,
                "{sql}: {steps} steps with the index, {plain_steps} without"
            );
        }
    }
}
