//! `PostgresStore`: the fleet `StateStore`, on the Python reference's exact tables.
//!
//! Owns the connection pool, the table setup (wire.md §12.2), the per-operation
//! transaction with row-lock fencing (§12.3), in-process per-instance ordering, the
//! whole-transaction deadline and the retry rule. It must never retry after `COMMIT` was
//! sent (the outcome is unknown) unless the transaction is the idempotent fenced write of
//! the fast path, never retry on a freshly dialled connection (the database itself is
//! failing), and never return a connection with an open transaction to the pool.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime,
};
use serde_json::Value;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

mod begin;
mod connection;
mod group_commit;
mod sweep;
mod tls;

pub use self::connection::{ConnectionString, SslMode};
pub use self::sweep::{
    IndexState, PlanChoice, SweepIndexBuild, SweepIndexes, SweepScan, ALARM_AT_COLUMN,
    ALARM_AT_TRIGGER, ALARM_DUE_INDEX, MARKED_INDEX, RETIRED_ALARM_INDEX, TRAY_INDEX_FILLFACTOR,
};

use self::begin::{Begin, LZ4_OFFERED};
use self::group_commit::{GroupCommit, Landed, Write};
use self::sweep::{IndexBuilder, DUE_ALARMS, MARKED_AFTER, MARKED_FIRST};
use crate::error::postgres_transient;
use crate::locks::InstanceLocks;
use crate::store::{check_epoch, sql_limit};
use crate::{
    BatchOp, Doc, DocText, DueAlarm, InstanceKey, MarkedInstance, Peek, PeekedRow, StateStore,
    StoreError, Tray, TrayKey, TrayRow, WorldStamp,
};

/// Default number of pooled connections.
pub const DEFAULT_POOL_SIZE: usize = 8;
/// Default bound on dialling one connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `SET LOCAL lock_timeout` of every transaction.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(25);
/// Default `SET LOCAL statement_timeout` of every transaction.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(25);
/// Default `SET LOCAL idle_in_transaction_session_timeout` of every transaction. A
/// worker frozen (SIGSTOP, a paused VM) or cut off mid-transaction holds the lock on the
/// instance's epoch row, and its own deadline cannot fire while it is frozen: the server
/// ends such a session after this long, so the id's next owner waits at most this, not
/// until the frozen worker wakes. Our transactions send their statements back to back,
/// so a healthy client is never idle in a transaction for anywhere near this long.
pub const DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(5);
/// Default bound on one whole transaction, from `BEGIN` to the end of `COMMIT`. Kept
/// above the server-side timeouts so the server errors first.
pub const DEFAULT_TXN_DEADLINE: Duration = Duration::from_secs(30);
/// Default bound on building the sweeper's indexes (all of the build: the wait for the
/// build lock's holder aside, which is never waited for). A build reads the whole table
/// twice and first waits for every transaction older than it in the database.
pub const DEFAULT_INDEX_BUILD_DEADLINE: Duration = Duration::from_secs(3600);

/// Both tables of wire.md §12.2, verbatim (the store adds `alarm_at` to the second in
/// `setup`: see `sweep::migrate`).
const CREATE_EPOCH: &str = "CREATE TABLE IF NOT EXISTS pinned_epoch (\
ns TEXT NOT NULL, id TEXT NOT NULL, epoch BIGINT NOT NULL, PRIMARY KEY (ns, id))";
const CREATE_TRAY_INDEX: &str = "CREATE TABLE IF NOT EXISTS pinned_tray_index (\
ns TEXT NOT NULL, id TEXT NOT NULL, tray_ns TEXT NOT NULL, tray_id TEXT NOT NULL, \
marked BOOLEAN NOT NULL, doc JSONB NOT NULL, \
env TEXT NOT NULL DEFAULT '*', hostname TEXT NOT NULL DEFAULT '*', \
PRIMARY KEY (ns, id, tray_ns, tray_id))";
/// Serializes concurrent `setup` calls across processes: concurrent `CREATE TABLE IF NOT
/// EXISTS` of one table can fail on the catalog's unique index.
const SETUP_LOCK: &str = "SELECT pg_advisory_xact_lock(7070518297010521)";
/// The DDL's `NOTICE: relation … already exists` on every start after the
/// first is no news: the setup transaction asks the server for warnings only.
const QUIET_DDL: &str = "SET LOCAL client_min_messages = warning";

const LOCK_EPOCH: &str = "SELECT epoch FROM pinned_epoch WHERE ns = $1 AND id = $2 FOR UPDATE";
const INSERT_EPOCH: &str =
    "INSERT INTO pinned_epoch (ns, id, epoch) VALUES ($1, $2, $3) ON CONFLICT (ns, id) DO NOTHING";
const UPDATE_EPOCH: &str = "UPDATE pinned_epoch SET epoch = $3 WHERE ns = $1 AND id = $2";
const UPSERT_TRAY: &str = "INSERT INTO pinned_tray_index \
(ns, id, tray_ns, tray_id, marked, doc, env, hostname) VALUES ($1, $2, $3, $4, $5, $6::text::jsonb, $7, $8) \
ON CONFLICT (ns, id, tray_ns, tray_id) DO UPDATE SET marked = EXCLUDED.marked, \
doc = EXCLUDED.doc, env = EXCLUDED.env, hostname = EXCLUDED.hostname";
const DELETE_TRAY: &str = "DELETE FROM pinned_tray_index \
WHERE ns = $1 AND id = $2 AND tray_ns = $3 AND tray_id = $4";
const DELETE_INSTANCE: &str = "DELETE FROM pinned_tray_index WHERE ns = $1 AND id = $2";
const GET_TRAY: &str = "SELECT marked, doc FROM pinned_tray_index \
WHERE ns = $1 AND id = $2 AND tray_ns = $3 AND tray_id = $4";
/// Byte order (`COLLATE "C"`) whatever the database's collation, like the other stores.
const LIST_TRAYS: &str = "SELECT tray_ns, tray_id, marked, doc FROM pinned_tray_index \
WHERE ns = $1 AND id = $2 AND ($3::text IS NULL OR tray_ns = $3) \
AND ($4::boolean IS NULL OR marked = $4) ORDER BY tray_ns COLLATE \"C\", tray_id COLLATE \"C\"";
/// The marked rows and one named row (`StateStore::list_marked_and`), byte order.
const LIST_MARKED_AND: &str = "SELECT tray_ns, tray_id, marked, doc FROM pinned_tray_index \
WHERE ns = $1 AND id = $2 AND (marked OR (tray_ns = $3 AND tray_id = $4)) \
ORDER BY tray_ns COLLATE \"C\", tray_id COLLATE \"C\"";
/// One page of a namespace's ids holding rows (`StateStore::instance_ids`), byte order.
const INSTANCE_IDS: &str = "SELECT DISTINCT id COLLATE \"C\" AS id FROM pinned_tray_index \
WHERE ns = $1 AND ($2::text IS NULL OR id > $2 COLLATE \"C\") ORDER BY 1 LIMIT $3";
/// An instance's fence and rows, unlocked (`StateStore::peek`): one row with null tray
/// columns when it holds none.
const PEEK: &str = "SELECT e.epoch, t.tray_ns, t.tray_id, t.marked, t.doc, t.hostname, t.env \
FROM (SELECT 1) AS one LEFT JOIN pinned_epoch e ON e.ns = $1 AND e.id = $2 \
LEFT JOIN pinned_tray_index t ON t.ns = $1 AND t.id = $2 \
ORDER BY t.tray_ns COLLATE \"C\", t.tray_id COLLATE \"C\"";
/// Fence rows of instances with no row, below an epoch (`StateStore::reclaim_fences`).
/// `SKIP LOCKED` passes over an instance whose operation holds its fence row: that
/// operation may be writing its first row.
const RECLAIM_FENCES: &str = "WITH doomed AS (\
SELECT e.ns, e.id FROM pinned_epoch e WHERE e.epoch < $1 \
AND NOT EXISTS (SELECT 1 FROM pinned_tray_index t WHERE t.ns = e.ns AND t.id = e.id) \
LIMIT $2 FOR UPDATE OF e SKIP LOCKED) \
DELETE FROM pinned_epoch e USING doomed d WHERE e.ns = d.ns AND e.id = d.id RETURNING e.id";
/// Settings of a [`PostgresStore`]; every default is one of this module's constants.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// Most connections open at once (default [`DEFAULT_POOL_SIZE`]); dialled lazily.
    pub pool_size: usize,
    /// Bound on dialling one connection, unless the URL sets `connect_timeout`
    /// (default [`DEFAULT_CONNECT_TIMEOUT`]).
    pub connect_timeout: Duration,
    /// `SET LOCAL lock_timeout` (default [`DEFAULT_LOCK_TIMEOUT`]).
    pub lock_timeout: Duration,
    /// `SET LOCAL statement_timeout` (default [`DEFAULT_STATEMENT_TIMEOUT`]).
    pub statement_timeout: Duration,
    /// `SET LOCAL idle_in_transaction_session_timeout` (default
    /// [`DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT`]): how long a client silent
    /// mid-transaction keeps its locks before the server ends its session.
    pub idle_in_transaction_timeout: Duration,
    /// Bound on one whole transaction; past it the connection is killed
    /// (default [`DEFAULT_TXN_DEADLINE`]).
    pub txn_deadline: Duration,
    /// Bound on building the sweeper's indexes, as the server's `statement_timeout` of
    /// each build statement and on the whole build (default
    /// [`DEFAULT_INDEX_BUILD_DEADLINE`]).
    pub index_build_deadline: Duration,
    /// Stamped into the `env` column of every written row (default `"*"`, pinboard's
    /// single-world mode).
    pub env: String,
    /// Stamped into the `hostname` column of every written row (default `"*"`).
    pub hostname: String,
    /// Extra SQL run at the start of every transaction (setup's included), after the
    /// `SET LOCAL` timeouts: the reference's `configure_transaction` hook, e.g.
    /// `SET LOCAL search_path = pinned` or `SET LOCAL ROLE app`. Default none.
    pub transaction_sql: Option<String>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            pool_size: DEFAULT_POOL_SIZE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
            idle_in_transaction_timeout: DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
            txn_deadline: DEFAULT_TXN_DEADLINE,
            index_build_deadline: DEFAULT_INDEX_BUILD_DEADLINE,
            env: "*".to_owned(),
            hostname: "*".to_owned(),
            transaction_sql: None,
        }
    }
}

/// A `StateStore` on Postgres, sharing its tables with the Python reference's
/// `PostgresStateStore`.
///
/// Each operation is one transaction: `BEGIN` with `SET LOCAL` lock and statement
/// timeouts; lock the instance's `pinned_epoch` row `FOR UPDATE` (inserting it first if
/// absent); refuse a lower epoch with [`StoreError::FenceLost`] or raise the stored one;
/// run the body; `COMMIT`. A write at the epoch already stored (every write of a placement
/// but its first) takes a shorter way with the same fence: one statement that writes only
/// while the row holds exactly that epoch, sent with `BEGIN` and `COMMIT` in one round
/// trip, together with the writes of other instances waiting at that moment (group
/// commit: at most 64 instances a statement, at most `pool_size / 2` statements in
/// flight); should it find another epoch, the full transaction runs.
///
/// Retry rule: a transient failure (connection loss, the deadline, or a transient
/// SQLSTATE) before `COMMIT` on a connection that had already served an earlier
/// operation is retried on another pooled connection, at most `pool_size` times. A
/// freshly dialled connection failing, or anything going wrong during `COMMIT`, is
/// returned to the caller. The one-round-trip write counts as "before `COMMIT`" for this
/// rule because replaying it writes the same rows; when it is not retried and the server
/// never answered, the error is [`StoreError::CommitIndeterminate`].
#[derive(Debug)]
pub struct PostgresStore {
    pool: Pool,
    locks: InstanceLocks,
    begin: Arc<Begin>,
    options: PostgresOptions,
    /// The one-round-trip writes, grouped across instances.
    group: GroupCommit,
}

/// What one transaction body does after the fence.
enum Body<'a> {
    Set {
        tray_ns: &'a str,
        tray_id: &'a str,
        marked: bool,
        doc: &'a DocText,
    },
    Delete {
        tray_ns: &'a str,
        tray_id: &'a str,
    },
    Get {
        tray_ns: &'a str,
        tray_id: &'a str,
    },
    List {
        tray_ns: Option<&'a str>,
        marked: Option<bool>,
    },
    ListMarkedAnd {
        tray_ns: &'a str,
        tray_id: &'a str,
    },
    Batch(&'a [BatchOp]),
    DeleteInstance,
}

impl Body<'_> {
    /// Whether the body only writes rows (a [`group_commit`] write can do it at once).
    fn is_write(&self) -> bool {
        match self {
            Body::Set { .. } | Body::Delete { .. } | Body::Batch(_) => true,
            Body::Get { .. }
            | Body::List { .. }
            | Body::ListMarkedAnd { .. }
            | Body::DeleteInstance => false,
        }
    }
}

impl Body<'_> {
    /// The body as one instance's group write (see [`group_commit`]): every row once,
    /// at its final image. A batch writing one row twice keeps its last image, the
    /// state its ops leave when applied one after another (the group statement's parts
    /// all see the rows as they were before it).
    fn grouped(&self, (ns, id): (&str, &str), stored_epoch: i64) -> Write {
        let mut write = Write {
            ns: ns.to_owned(),
            id: id.to_owned(),
            stored_epoch,
            sets: Vec::new(),
            deletes: Vec::new(),
        };
        let mut add = |tray_ns: &str, tray_id: &str, image: Option<(bool, &DocText)>| match image {
            Some((marked, doc)) => {
                write
                    .sets
                    .push((tray_ns.to_owned(), tray_id.to_owned(), marked, doc.clone()))
            }
            None => write.deletes.push((tray_ns.to_owned(), tray_id.to_owned())),
        };
        match *self {
            Body::Set {
                tray_ns,
                tray_id,
                marked,
                doc,
            } => add(tray_ns, tray_id, Some((marked, doc))),
            Body::Delete { tray_ns, tray_id } => add(tray_ns, tray_id, None),
            Body::Batch(ops) => {
                let mut written = HashSet::with_capacity(ops.len());
                for op in ops.iter().rev() {
                    match op {
                        BatchOp::Set {
                            tray_ns,
                            tray_id,
                            marked,
                            doc,
                        } => {
                            if written.insert((tray_ns, tray_id)) {
                                add(tray_ns, tray_id, Some((*marked, doc)));
                            }
                        }
                        BatchOp::Delete { tray_ns, tray_id } => {
                            if written.insert((tray_ns, tray_id)) {
                                add(tray_ns, tray_id, None);
                            }
                        }
                    }
                }
            }
            Body::Get { .. }
            | Body::List { .. }
            | Body::ListMarkedAnd { .. }
            | Body::DeleteInstance => {}
        }
        write
    }
}

/// What a body returns.
enum Output {
    Done,
    Tray(Option<Tray>),
    Rows(Vec<TrayRow>),
}

/// How far one attempt got, to decide whether it may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Open,
    Committing,
}

/// A pooled connection inside a transaction. Dropped while the transaction may still be
/// open (an error path that could not roll back, a cancelled future, a deadline), it
/// takes the connection out of the pool and closes it rather than hand it on.
struct Checkout {
    conn: Option<Object>,
    in_txn: bool,
}

// === impl PostgresStore ===

impl PostgresStore {
    /// Builds the store for `url` without dialling; connections are opened on first
    /// use. Call [`setup`](Self::setup) once before use (or use [`open`](Self::open)).
    ///
    /// `url` is a connection string as libpq reads it ([`ConnectionString`]): a URL
    /// (`postgresql://user@host:port/db?sslmode=verify-full&sslrootcert=/etc/ca.pem`)
    /// or `key=value` pairs (`host=db user=app sslmode=require`). TLS is rustls;
    /// without `sslmode` it is libpq's `prefer`.
    ///
    /// # Errors
    ///
    /// [`StoreError::ConnectionString`] for a malformed string, an unsupported
    /// `sslmode` or a missing root certificate; [`StoreError::Setup`] for bad options.
    pub fn connect(url: &str, options: PostgresOptions) -> Result<Self, StoreError> {
        Self::connect_with(ConnectionString::parse(url)?, options)
    }

    /// [`connect`](Self::connect) with a string already read.
    ///
    /// # Errors
    ///
    /// [`StoreError::Setup`] for bad options.
    pub fn connect_with(
        mut target: ConnectionString,
        options: PostgresOptions,
    ) -> Result<Self, StoreError> {
        let setup = |source: crate::error::BoxError| StoreError::Setup { source };
        if options.pool_size == 0 {
            return Err(setup("pool_size must be at least 1".into()));
        }
        if target.config().get_connect_timeout().is_none() {
            target.config_mut().connect_timeout(options.connect_timeout);
        }
        let tls = target.tls();
        let config = target.config().clone();
        let manager = Manager::from_config(
            config,
            tls,
            ManagerConfig {
                // Check liveness (is the socket still open) on checkout, nothing more.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(options.connect_timeout))
            .build()
            .map_err(|e| setup(e.into()))?;
        let begin = Arc::new(Begin::new(&options));
        let group = GroupCommit::new(pool.clone(), begin.clone(), &options);
        Ok(Self {
            pool,
            locks: InstanceLocks::default(),
            begin,
            options,
            group,
        })
    }

    /// [`connect`](Self::connect), then [`setup`](Self::setup).
    ///
    /// # Errors
    ///
    /// As `connect` and `setup`.
    pub async fn open(url: &str, options: PostgresOptions) -> Result<Self, StoreError> {
        let store = Self::connect(url, options)?;
        store.setup().await?;
        Ok(store)
    }

    /// Creates `pinned_epoch` and `pinned_tray_index` if absent, in one transaction, and
    /// from then on stores large documents `lz4`-compressed where the server offers it
    /// (see `begin.rs`). Safe to call from many processes at once.
    ///
    /// In the same transaction it brings a table without them the store's additions:
    /// the column [`ALARM_AT_COLUMN`] with its trigger [`ALARM_AT_TRIGGER`] (filled on the
    /// alarm rows there, once: the table is locked while they are found, through the
    /// retired alarm index where it exists), and a fill factor of
    /// [`TRAY_INDEX_FILLFACTOR`] where none is set (for pages written from then on).
    /// Rows a writer that knows nothing of them (the Python reference) writes get the
    /// column from the trigger.
    ///
    /// When the sweeper's indexes ([`sweep_indexes`](Self::sweep_indexes)) are not all
    /// built, it starts [`build_sweep_indexes`](Self::build_sweep_indexes) in a task of
    /// its own and returns without waiting for it: a build reads the whole table and
    /// first waits for every older transaction in the database, and the store works
    /// without the indexes (only the sweeper's scans read more). A failed build is
    /// logged as a warning, and tried again by the next `setup` (the next start).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] if no connection can be had, else the server's error.
    pub async fn setup(&self) -> Result<(), StoreError> {
        let mut checkout = Checkout::new(self.pool.get().await.map_err(pool_error)?);
        let conn = checkout.begin(self.begin.sql()).await?;
        let body = async {
            conn.batch_execute(SETUP_LOCK).await?;
            conn.batch_execute(QUIET_DDL).await?;
            conn.batch_execute(CREATE_EPOCH).await?;
            conn.batch_execute(CREATE_TRAY_INDEX).await?;
            sweep::migrate(conn).await?;
            let indexes = sweep::status(conn, "pinned_tray_index").await?;
            let lz4 = conn.query_opt(LZ4_OFFERED, &[]).await?.is_some();
            Ok::<_, StoreError>((indexes, lz4))
        }
        .await;
        match body {
            Ok((indexes, lz4)) => {
                checkout.commit().await?;
                self.begin.offer_lz4(lz4);
                if !indexes.ready() {
                    self.spawn_index_build(indexes.schema);
                }
                Ok(())
            }
            Err(err) => {
                checkout.rollback().await;
                Err(err)
            }
        }
    }

    /// Builds the sweeper's indexes of `schema` in the background, logging the outcome.
    fn spawn_index_build(&self, schema: String) {
        let builder = IndexBuilder::new(self.pool.clone(), &self.options);
        tokio::spawn(async move {
            match builder.build(&schema).await {
                Ok(SweepIndexBuild::Built { elapsed }) => tracing::info!(
                    %schema, elapsed_ms = elapsed.as_millis(),
                    "postgres store: sweeper indexes built"
                ),
                Ok(SweepIndexBuild::Busy) => tracing::info!(
                    %schema,
                    "postgres store: another process is building the sweeper indexes"
                ),
                Ok(SweepIndexBuild::AlreadyReady) => {}
                Err(error) => tracing::warn!(
                    %schema, %error,
                    "postgres store: cannot build the sweeper indexes; its scans read \
                     every row until they are built"
                ),
            }
        });
    }

    /// The state of the sweeper's indexes ([`ALARM_DUE_INDEX`], [`MARKED_INDEX`]) on the
    /// store's `pinned_tray_index` (as the transaction hook's `search_path` finds it).
    ///
    /// # Errors
    ///
    /// As any read; the table must exist ([`setup`](Self::setup)).
    pub async fn sweep_indexes(&self) -> Result<SweepIndexes, StoreError> {
        let mut checkout = Checkout::new(self.pool.get().await.map_err(pool_error)?);
        let conn = checkout.begin(self.begin.sql()).await?;
        match sweep::status(conn, "pinned_tray_index").await {
            Ok(indexes) => {
                checkout.commit().await?;
                Ok(indexes)
            }
            Err(err) => {
                checkout.rollback().await;
                Err(err)
            }
        }
    }

    /// Builds the sweeper's indexes where missing, and waits for the build: `CREATE
    /// INDEX CONCURRENTLY IF NOT EXISTS` of each, on a connection of its own outside any
    /// transaction, under a session advisory lock per schema. Returns
    /// [`SweepIndexBuild::Busy`] at once, doing nothing, when another process holds that
    /// lock. An index a failed build left invalid is dropped and built again. Runs as the
    /// connection's own role: the transaction hook (a `SET LOCAL ROLE`, say) does not
    /// apply outside a transaction, and building an index takes owning the table.
    ///
    /// # Errors
    ///
    /// [`StoreError::Deadline`] past [`PostgresOptions::index_build_deadline`], else the
    /// server's error (after three tries when it is transient: concurrent builds in other
    /// schemas can be chosen as a deadlock's victim).
    pub async fn build_sweep_indexes(&self) -> Result<SweepIndexBuild, StoreError> {
        let indexes = self.sweep_indexes().await?;
        if indexes.ready() {
            return Ok(SweepIndexBuild::AlreadyReady);
        }
        IndexBuilder::new(self.pool.clone(), &self.options)
            .build(&indexes.schema)
            .await
    }

    /// `EXPLAIN (FORMAT JSON)` of one of the sweeper's scans, exactly as the store sends
    /// it, with `plan` chosen; with `analyze` the scan runs (read-only) and the plan
    /// carries what each node read (`ANALYZE, BUFFERS`). For checking that the scans use
    /// the sweeper's indexes. Runs in a transaction like the scans (hook included), on a
    /// connection that is closed afterwards.
    ///
    /// # Errors
    ///
    /// As any read.
    pub async fn explain(
        &self,
        scan: SweepScan<'_>,
        plan: PlanChoice,
        analyze: bool,
    ) -> Result<Value, StoreError> {
        let explained = sweep::explain(&self.pool, self.begin.sql(), scan, plan, analyze);
        match tokio::time::timeout(self.options.txn_deadline, explained).await {
            Ok(plan) => plan,
            Err(_elapsed) => Err(StoreError::Deadline {
                deadline: self.options.txn_deadline,
            }),
        }
    }

    /// The options this store was built with.
    pub fn options(&self) -> &PostgresOptions {
        &self.options
    }

    /// Runs one read-only statement in its own transaction without any fence or
    /// per-instance turn (the scans): `BEGIN` with the `SET LOCAL` timeouts and the
    /// transaction hook, the query, `COMMIT`, all under the transaction deadline. Nothing
    /// is written, so a transient failure on a pooled connection is retried on another
    /// one (at most `pool_size` times) whenever it happens, `COMMIT` included.
    async fn scan(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let mut retries = 0;
        loop {
            let conn = self.pool.get().await.map_err(pool_error)?;
            let pooled = Object::metrics(&conn).recycle_count > 0;
            let mut checkout = Checkout::new(conn);
            let attempt = async {
                let conn = checkout.begin(self.begin.sql()).await?;
                let rows = async {
                    let stmt = conn.prepare_cached(sql).await?;
                    Ok::<_, StoreError>(conn.query(&stmt, params).await?)
                }
                .await;
                match rows {
                    Ok(rows) => {
                        checkout.commit().await?;
                        Ok(rows)
                    }
                    Err(err) => {
                        checkout.rollback().await;
                        Err(err)
                    }
                }
            };
            let err = match tokio::time::timeout(self.options.txn_deadline, attempt).await {
                Ok(Ok(rows)) => return Ok(rows),
                Ok(Err(err)) => err,
                Err(_elapsed) => {
                    drop(checkout); // still in a transaction: discarded, not pooled
                    StoreError::Deadline {
                        deadline: self.options.txn_deadline,
                    }
                }
            };
            let transient = match &err {
                StoreError::Postgres { source } => postgres_transient(source),
                StoreError::Deadline { .. } => true,
                _ => false,
            };
            if !(pooled && transient && retries < self.options.pool_size) {
                return Err(err);
            }
            retries += 1;
            tracing::warn!(
                error = %err, retries,
                "postgres store: pooled connection failed during a scan; retrying"
            );
        }
    }

    /// Runs `body` for instance `(ns, id)` at `epoch` in its own fenced transaction,
    /// in turn with the instance's other operations, retrying as the type doc says.
    async fn run(
        &self,
        ns: &str,
        id: &str,
        epoch: u64,
        body: Body<'_>,
    ) -> Result<Output, StoreError> {
        let stored_epoch = check_epoch(epoch)?;
        let mut turn = self.locks.lock(ns, id).await;
        if body.is_write() {
            // The one-round-trip write first; once it finds another epoch stored, the
            // full transaction decides (raise it, or refuse ours).
            let write = body.grouped((ns, id), stored_epoch);
            let (landed, back) = self.group.write(write, turn).await?;
            if landed == Landed::Written {
                return Ok(Output::Done);
            }
            turn = back;
        }
        let _turn = turn;
        let mut retries = 0;
        loop {
            let conn = self.pool.get().await.map_err(pool_error)?;
            let pooled = Object::metrics(&conn).recycle_count > 0;
            let mut checkout = Checkout::new(conn);
            let mut phase = Phase::Open;
            let attempt = self.attempt(
                &mut checkout,
                &mut phase,
                (ns, id),
                stored_epoch,
                epoch,
                &body,
            );
            let err = match tokio::time::timeout(self.options.txn_deadline, attempt).await {
                Ok(Ok(out)) => return Ok(out),
                Ok(Err(err)) => err,
                Err(_elapsed) => {
                    // The connection may be hung mid-statement: kill it (the checkout
                    // still thinks a transaction is open, so dropping it discards it).
                    drop(checkout);
                    StoreError::Deadline {
                        deadline: self.options.txn_deadline,
                    }
                }
            };
            let transient = match &err {
                StoreError::Postgres { source } => postgres_transient(source),
                StoreError::Deadline { .. } => true,
                _ => false,
            };
            if phase == Phase::Committing {
                // The server answering the COMMIT with an error means it rolled back:
                // the outcome is known. Anything else (a dead socket, the deadline)
                // leaves it unknown. Either way it is never retried here.
                let answered =
                    matches!(&err, StoreError::Postgres { source } if source.code().is_some());
                return Err(if answered {
                    err
                } else {
                    StoreError::CommitIndeterminate {
                        source: Box::new(err),
                    }
                });
            }
            if !(pooled && transient && retries < self.options.pool_size) {
                return Err(err);
            }
            retries += 1;
            tracing::warn!(
                error = %err, ns, id, epoch, retries,
                "postgres store: pooled connection failed before commit; retrying"
            );
        }
    }

    /// One attempt: begin, fence, body, commit. Rolls back on any failure before commit.
    async fn attempt(
        &self,
        checkout: &mut Checkout,
        phase: &mut Phase,
        (ns, id): (&str, &str),
        stored_epoch: i64,
        epoch: u64,
        body: &Body<'_>,
    ) -> Result<Output, StoreError> {
        let conn = checkout.enter()?;
        let result = async {
            let lock = conn.prepare_cached(LOCK_EPOCH).await?;
            // BEGIN and the epoch-row lock travel together, saving a round trip. Should
            // BEGIN fail, the lock query either fails with it or ran alone outside any
            // transaction (a row lock taken and dropped at once); BEGIN's error wins.
            let key: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&ns, &id];
            let (began, locked) = tokio::join!(
                conn.batch_execute(self.begin.sql()),
                conn.query_opt(&lock, &key)
            );
            began?;
            let first = match locked? {
                Some(row) => Some(row.try_get(0)?),
                None => None,
            };
            acquire(conn, &lock, first, (ns, id), stored_epoch, epoch).await?;
            self.body(conn, (ns, id), body).await
        }
        .await;
        match result {
            Ok(out) => {
                *phase = Phase::Committing;
                checkout.commit().await?;
                Ok(out)
            }
            Err(err) => {
                checkout.rollback().await;
                Err(err)
            }
        }
    }

    async fn body(
        &self,
        conn: &Object,
        (ns, id): (&str, &str),
        body: &Body<'_>,
    ) -> Result<Output, StoreError> {
        match *body {
            Body::Set {
                tray_ns,
                tray_id,
                marked,
                doc,
            } => {
                self.upsert(conn, (ns, id), (tray_ns, tray_id), marked, doc)
                    .await?;
                Ok(Output::Done)
            }
            Body::Delete { tray_ns, tray_id } => {
                delete(conn, (ns, id), (tray_ns, tray_id)).await?;
                Ok(Output::Done)
            }
            Body::Get { tray_ns, tray_id } => {
                let stmt = conn.prepare_cached(GET_TRAY).await?;
                let row = conn
                    .query_opt(&stmt, &[&ns, &id, &tray_ns, &tray_id])
                    .await?;
                let tray = match row {
                    None => None,
                    Some(row) => {
                        let marked: bool = row.try_get(0)?;
                        let doc =
                            as_doc(row.try_get(1)?, || format!("{ns}/{id} {tray_ns}/{tray_id}"))?;
                        Some(Tray { marked, doc })
                    }
                };
                Ok(Output::Tray(tray))
            }
            Body::List { tray_ns, marked } => {
                let stmt = conn.prepare_cached(LIST_TRAYS).await?;
                let rows = conn.query(&stmt, &[&ns, &id, &tray_ns, &marked]).await?;
                tray_rows(rows, (ns, id)).map(Output::Rows)
            }
            Body::ListMarkedAnd { tray_ns, tray_id } => {
                let stmt = conn.prepare_cached(LIST_MARKED_AND).await?;
                let rows = conn.query(&stmt, &[&ns, &id, &tray_ns, &tray_id]).await?;
                tray_rows(rows, (ns, id)).map(Output::Rows)
            }
            Body::Batch(ops) => {
                for op in ops {
                    match op {
                        BatchOp::Set {
                            tray_ns,
                            tray_id,
                            marked,
                            doc,
                        } => {
                            self.upsert(conn, (ns, id), (tray_ns, tray_id), *marked, doc)
                                .await?
                        }
                        BatchOp::Delete { tray_ns, tray_id } => {
                            delete(conn, (ns, id), (tray_ns, tray_id)).await?
                        }
                    }
                }
                Ok(Output::Done)
            }
            Body::DeleteInstance => {
                let stmt = conn.prepare_cached(DELETE_INSTANCE).await?;
                conn.execute(&stmt, &[&ns, &id]).await?;
                Ok(Output::Done)
            }
        }
    }

    async fn upsert(
        &self,
        conn: &Object,
        (ns, id): (&str, &str),
        (tray_ns, tray_id): (&str, &str),
        marked: bool,
        doc: &DocText,
    ) -> Result<(), StoreError> {
        let stmt = conn.prepare_cached(UPSERT_TRAY).await?;
        conn.execute(
            &stmt,
            &[
                &ns,
                &id,
                &tray_ns,
                &tray_id,
                &marked,
                &doc.as_str(),
                &self.options.env,
                &self.options.hostname,
            ],
        )
        .await?;
        Ok(())
    }
}

/// Fences the instance given the first `SELECT … FOR UPDATE` of its epoch row (`first`),
/// creating the row if absent, then advances it. The row stays locked until the
/// transaction ends.
async fn acquire(
    conn: &Object,
    lock: &tokio_postgres::Statement,
    first: Option<i64>,
    (ns, id): (&str, &str),
    stored_epoch: i64,
    epoch: u64,
) -> Result<(), StoreError> {
    let mut stored = first;
    if stored.is_none() {
        let insert = conn.prepare_cached(INSERT_EPOCH).await?;
        conn.execute(&insert, &[&ns, &id, &stored_epoch]).await?;
        // Re-select: a concurrent inserter may have won, with its own epoch.
        stored = match conn.query_opt(lock, &[&ns, &id]).await? {
            Some(row) => Some(row.try_get(0)?),
            None => None,
        };
    }
    let Some(stored) = stored else {
        return Err(StoreError::Corrupt {
            key: format!("{ns}/{id}"),
            detail: "pinned_epoch row vanished inside its own transaction".to_owned(),
        });
    };
    if stored_epoch < stored {
        return Err(StoreError::fence_lost(InstanceKey::new(ns, id), epoch));
    }
    if stored_epoch > stored {
        let update = conn.prepare_cached(UPDATE_EPOCH).await?;
        conn.execute(&update, &[&ns, &id, &stored_epoch]).await?;
    }
    Ok(())
}

async fn delete(
    conn: &Object,
    (ns, id): (&str, &str),
    (tray_ns, tray_id): (&str, &str),
) -> Result<(), StoreError> {
    let stmt = conn.prepare_cached(DELETE_TRAY).await?;
    conn.execute(&stmt, &[&ns, &id, &tray_ns, &tray_id]).await?;
    Ok(())
}

/// `(tray_ns, tray_id, marked, doc)` rows of instance `(ns, id)`, decoded.
fn tray_rows(rows: Vec<Row>, (ns, id): (&str, &str)) -> Result<Vec<TrayRow>, StoreError> {
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let tray_ns: String = row.try_get(0)?;
        let tray_id: String = row.try_get(1)?;
        let marked: bool = row.try_get(2)?;
        let doc = as_doc(row.try_get(3)?, || format!("{ns}/{id} {tray_ns}/{tray_id}"))?;
        out.push(TrayRow {
            tray_ns,
            tray_id,
            marked,
            doc,
        });
    }
    Ok(out)
}

/// A stored `doc` must be a JSON object.
fn as_doc(value: Value, key: impl FnOnce() -> String) -> Result<Doc, StoreError> {
    match value {
        Value::Object(doc) => Ok(doc),
        other => Err(StoreError::Corrupt {
            key: key(),
            detail: format!("doc is not a JSON object: {other}"),
        }),
    }
}

fn pool_error(err: PoolError) -> StoreError {
    match err {
        PoolError::Closed => StoreError::Closed,
        PoolError::NoRuntimeSpecified => StoreError::Setup {
            source: err.to_string().into(),
        },
        // The driver's own error, without the pool's "while creating a new object".
        PoolError::Backend(source) => StoreError::Unavailable {
            source: Box::new(source),
        },
        other => StoreError::Unavailable {
            source: Box::new(other),
        },
    }
}

// === impl Checkout ===

impl Checkout {
    fn new(conn: Object) -> Self {
        Self {
            conn: Some(conn),
            in_txn: false,
        }
    }

    /// Marks the transaction as (about to be) open and returns the connection; the
    /// caller sends `BEGIN` itself.
    fn enter(&mut self) -> Result<&Object, StoreError> {
        self.in_txn = true;
        self.conn.as_ref().ok_or(StoreError::Closed)
    }

    /// Sends `BEGIN` and the `SET LOCAL` timeouts; returns the connection.
    async fn begin(&mut self, begin: &str) -> Result<&Object, StoreError> {
        let Some(conn) = self.conn.as_ref() else {
            return Err(StoreError::Closed);
        };
        self.in_txn = true;
        conn.batch_execute(begin).await?;
        Ok(conn)
    }

    /// Sends `COMMIT`. On success the connection goes back to the pool clean.
    async fn commit(&mut self) -> Result<(), StoreError> {
        let Some(conn) = self.conn.as_ref() else {
            return Err(StoreError::Closed);
        };
        conn.batch_execute("COMMIT").await?;
        self.in_txn = false;
        Ok(())
    }

    /// Records that a transaction the caller ended itself (its `COMMIT` answered) is
    /// over: the connection goes back to the pool clean.
    fn left(&mut self) {
        self.in_txn = false;
    }

    /// Rolls back; if that fails the connection is discarded on drop.
    async fn rollback(&mut self) {
        if let Some(conn) = self.conn.as_ref() {
            if conn.batch_execute("ROLLBACK").await.is_ok() {
                self.in_txn = false;
            }
        }
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.in_txn {
                // Detach from the pool; dropping the client aborts its connection task,
                // which closes the socket and makes the server roll back.
                drop(Object::take(conn));
            }
        }
    }
}

#[async_trait]
impl StateStore for PostgresStore {
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
        let doc = DocText::from(doc);
        let body = Body::Set {
            tray_ns,
            tray_id,
            marked,
            doc: &doc,
        };
        self.run(ns, id, epoch, body).await.map(|_| ())
    }

    async fn delete_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        let InstanceKey { ns, id } = instance;
        let TrayKey { tray_ns, tray_id } = tray;
        let body = Body::Delete { tray_ns, tray_id };
        self.run(ns, id, epoch, body).await.map(|_| ())
    }

    async fn get_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        epoch: u64,
    ) -> Result<Option<Tray>, StoreError> {
        let InstanceKey { ns, id } = instance;
        let TrayKey { tray_ns, tray_id } = tray;
        match self
            .run(ns, id, epoch, Body::Get { tray_ns, tray_id })
            .await?
        {
            Output::Tray(tray) => Ok(tray),
            Output::Done | Output::Rows(_) => Ok(None),
        }
    }

    async fn list(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
        tray_ns: Option<&str>,
        marked: Option<bool>,
    ) -> Result<Vec<TrayRow>, StoreError> {
        let InstanceKey { ns, id } = instance;
        match self
            .run(ns, id, epoch, Body::List { tray_ns, marked })
            .await?
        {
            Output::Rows(rows) => Ok(rows),
            Output::Done | Output::Tray(_) => Ok(Vec::new()),
        }
    }

    async fn list_marked_and(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
        tray: TrayKey<'_>,
    ) -> Result<Vec<TrayRow>, StoreError> {
        let InstanceKey { ns, id } = instance;
        let TrayKey { tray_ns, tray_id } = tray;
        match self
            .run(ns, id, epoch, Body::ListMarkedAnd { tray_ns, tray_id })
            .await?
        {
            Output::Rows(rows) => Ok(rows),
            Output::Done | Output::Tray(_) => Ok(Vec::new()),
        }
    }

    async fn apply_batch(
        &self,
        instance: InstanceKey<'_>,
        ops: Vec<BatchOp>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        let InstanceKey { ns, id } = instance;
        self.run(ns, id, epoch, Body::Batch(&ops)).await.map(|_| ())
    }

    async fn delete_instance(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        let InstanceKey { ns, id } = instance;
        self.run(ns, id, epoch, Body::DeleteInstance)
            .await
            .map(|_| ())
    }

    async fn due_alarms(&self, due_by_ms: i64, limit: usize) -> Result<Vec<DueAlarm>, StoreError> {
        let rows = self
            .scan(DUE_ALARMS, &[&due_by_ms, &sql_limit(limit)])
            .await?;
        rows.iter()
            .map(|row| {
                Ok(DueAlarm {
                    ns: row.try_get(0)?,
                    id: row.try_get(1)?,
                    at: row.try_get(2)?,
                    nonce: row.try_get(3)?,
                    world: WorldStamp::new(
                        row.try_get::<_, String>(4)?,
                        row.try_get::<_, String>(5)?,
                    ),
                })
            })
            .collect()
    }

    async fn marked_instances(
        &self,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<MarkedInstance>, StoreError> {
        let limit = sql_limit(limit);
        let rows = match after {
            None => self.scan(MARKED_FIRST, &[&limit]).await?,
            Some((ns, id)) => self.scan(MARKED_AFTER, &[&ns, &id, &limit]).await?,
        };
        rows.iter()
            .map(|row| {
                Ok(MarkedInstance {
                    ns: row.try_get(0)?,
                    id: row.try_get(1)?,
                    world: WorldStamp::new(
                        row.try_get::<_, String>(2)?,
                        row.try_get::<_, String>(3)?,
                    ),
                })
            })
            .collect()
    }

    async fn instance_ids(
        &self,
        ns: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let limit = sql_limit(limit);
        let rows = self.scan(INSTANCE_IDS, &[&ns, &after, &limit]).await?;
        rows.iter().map(|row| Ok(row.try_get(0)?)).collect()
    }

    async fn peek(&self, instance: InstanceKey<'_>) -> Result<Peek, StoreError> {
        let InstanceKey { ns, id } = instance;
        let rows = self.scan(PEEK, &[&ns, &id]).await?;
        let mut peek = Peek::default();
        for row in rows {
            let epoch: Option<i64> = row.try_get(0)?;
            peek.epoch = epoch.and_then(|e| u64::try_from(e).ok());
            let Some(tray_ns) = row.try_get::<_, Option<String>>(1)? else {
                continue;
            };
            let tray_id: String = row.try_get(2)?;
            let doc = as_doc(row.try_get(4)?, || format!("{ns}/{id} {tray_ns}/{tray_id}"))?;
            peek.rows.push(PeekedRow {
                row: TrayRow {
                    tray_ns,
                    tray_id,
                    marked: row.try_get(3)?,
                    doc,
                },
                world: WorldStamp::new(row.try_get::<_, String>(5)?, row.try_get::<_, String>(6)?),
            });
        }
        Ok(peek)
    }

    async fn reclaim_fences(&self, below_epoch: u64, limit: usize) -> Result<u64, StoreError> {
        let below = i64::try_from(below_epoch).unwrap_or(i64::MAX);
        let limit = sql_limit(limit);
        let gone = self.scan(RECLAIM_FENCES, &[&below, &limit]).await?;
        Ok(gone.len() as u64)
    }
}
