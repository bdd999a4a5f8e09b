//! The sweeper's side of the store: pinboard's two cross-instance scans (wire.md §12.5,
//! §14.2), the two partial indexes that let them read only the rows that are due or
//! marked, the build of those indexes, and `EXPLAIN` of the scans.
//!
//! Owns the scans' SQL, the index definitions, and the store's additions to the shared
//! table: the `alarm_at` column the alarm index and scan read, kept by a trigger for
//! every writer (the Python reference knows nothing of it), and a fill factor, so that
//! a tray row's write (its `doc` changes, its alarm time does not) can be a HOT update.
//! Both index orders are the scans' `ORDER BY`s, so the planner matches them and a page
//! stops after `limit` entries. The build runs `CREATE INDEX CONCURRENTLY` (writers are never blocked) on a
//! connection of its own, outside any transaction, where that statement must run; one
//! process builds a table's indexes at a time (a session advisory lock) and first drops
//! what a failed build left behind (an index marked invalid, which `IF NOT EXISTS` would
//! otherwise keep for ever). It must never wait for another process's build, and never
//! hand a connection that held session state (the lock, a prepared statement, session
//! settings) back to the pool: such connections are detached, and closed when dropped.

use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Object, Pool};
use serde_json::Value;
use tokio::time::Instant;

use super::{pool_error, PostgresOptions};
use crate::error::postgres_transient;
use crate::store::sql_limit;
use crate::StoreError;

/// An alarm row's due time, as a number only when `$doc->'at'` is a JSON number, so the
/// cast never fails whatever a writer (the Python reference included) stored: an
/// expression that could fail would fail the write.
macro_rules! alarm_at {
    ($doc:literal) => {
        concat!(
            "CASE WHEN jsonb_typeof(",
            $doc,
            "->'at') = 'number' THEN (",
            $doc,
            "->>'at')::numeric END"
        )
    };
}

/// The column holding an alarm row's due time (the `alarm_at!` expression over its `doc`; null on every
/// other row), kept by [`ALARM_AT_TRIGGER`] for every writer, the Python reference
/// included. The alarm index is on it rather than on the expression over `doc`:
/// Postgres counts every column an index reads as indexed, so an index reading `doc`
/// made every row write a non-HOT update (a new index entry in every index, the table
/// and its indexes bloating); the column changes only when an alarm's time does.
pub const ALARM_AT_COLUMN: &str = "alarm_at";
/// The trigger that keeps [`ALARM_AT_COLUMN`], firing on alarm rows only.
pub const ALARM_AT_TRIGGER: &str = "pinned_tray_index_alarm_at";
/// The alarm index of earlier versions, on the expression over `doc`: dropped once
/// [`ALARM_DUE_INDEX`] is built, since while it exists no row write is a HOT update.
pub const RETIRED_ALARM_INDEX: &str = "pinned_tray_index_alarm_due";
/// The fill factor the store gives `pinned_tray_index` when none is set: room on each
/// page for a row's next version, so that a write can be a HOT update.
pub const TRAY_INDEX_FILLFACTOR: u32 = 80;

/// Where the store's additions to `pinned_tray_index` stand: the column, the trigger
/// and whether a fill factor is set.
const MIGRATION_STATUS: &str = "SELECT \
EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'pinned_tray_index'::regclass \
AND attname = 'alarm_at' AND NOT attisdropped), \
EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'pinned_tray_index'::regclass \
AND tgname = 'pinned_tray_index_alarm_at'), \
EXISTS (SELECT 1 FROM pg_class WHERE oid = 'pinned_tray_index'::regclass \
AND array_to_string(reloptions, ',') LIKE '%fillfactor=%')";

/// Adds [`ALARM_AT_COLUMN`] (nullable, no default: a catalog change, no table rewrite),
/// its trigger, and fills it on the alarm rows already there (the retired index, where
/// present, finds them without reading the table).
const MIGRATE_ALARM_AT: &str = concat!(
    "ALTER TABLE pinned_tray_index ADD COLUMN IF NOT EXISTS alarm_at numeric; \
CREATE OR REPLACE FUNCTION pinned_tray_index_alarm_at() RETURNS trigger LANGUAGE plpgsql AS \
$pinned$ BEGIN NEW.alarm_at := ",
    alarm_at!("NEW.doc"),
    "; RETURN NEW; END $pinned$; \
DROP TRIGGER IF EXISTS pinned_tray_index_alarm_at ON pinned_tray_index; \
CREATE TRIGGER pinned_tray_index_alarm_at BEFORE INSERT OR UPDATE ON pinned_tray_index \
FOR EACH ROW WHEN (NEW.tray_ns = 'pinned' AND NEW.tray_id = 'alarm') \
EXECUTE FUNCTION pinned_tray_index_alarm_at(); \
UPDATE pinned_tray_index SET alarm_at = ",
    alarm_at!("doc"),
    " WHERE tray_ns = 'pinned' AND tray_id = 'alarm' AND alarm_at IS DISTINCT FROM (",
    alarm_at!("doc"),
    ")"
);

/// Brings `pinned_tray_index` (as the `search_path` finds it) to the store's layout,
/// inside the caller's setup transaction, which holds the setup lock: [`ALARM_AT_COLUMN`]
/// and its trigger where either is missing, and the fill factor where none is set (an
/// operator's own is kept). Idempotent: a table already migrated costs one catalog
/// read and takes no lock. The indexes are the builder's ([`IndexBuilder`]).
pub(super) async fn migrate(client: &tokio_postgres::Client) -> Result<(), StoreError> {
    let row = client.query_one(MIGRATION_STATUS, &[]).await?;
    let (column, trigger, fillfactor): (bool, bool, bool) =
        (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
    if !(column && trigger) {
        tracing::info!(
            column,
            trigger,
            "postgres store: adding pinned_tray_index.alarm_at and its trigger"
        );
        client.batch_execute(MIGRATE_ALARM_AT).await?;
    }
    if !fillfactor {
        client
            .batch_execute(&format!(
                "ALTER TABLE pinned_tray_index SET (fillfactor = {TRAY_INDEX_FILLFACTOR})"
            ))
            .await?;
    }
    Ok(())
}

/// Name of the index serving the due-alarms scan.
pub const ALARM_DUE_INDEX: &str = "pinned_tray_index_alarm_at";
/// Name of the index serving the marked-instances scan.
pub const MARKED_INDEX: &str = "pinned_tray_index_marked";

/// The alarm rows by due time, then `(ns, id)` in byte order: [`DUE_ALARMS`]'s order,
/// its rows' predicate.
const ALARM_DUE_DEFINITION: &str = "(alarm_at, ns COLLATE \"C\", id COLLATE \"C\") \
WHERE tray_ns = 'pinned' AND tray_id = 'alarm'";
/// The marked rows in [`MARKED_FIRST`]'s order, key and world together, so a page
/// reads its rows in order from the index alone (an index-only scan where the table's
/// visibility map allows).
const MARKED_DEFINITION: &str = "(ns COLLATE \"C\", id COLLATE \"C\", (hostname = '*'), \
hostname COLLATE \"C\", env COLLATE \"C\") WHERE marked";

/// Due alarm rows (`StateStore::due_alarms`). `alarm_at` holds JSON numbers only (see
/// [`alarm_at!`]), and the nonce's `CASE` casts only strings; `at` must then be an
/// integer within `bigint`. Ordered by the subquery's `at` (not the output column of that
/// name, its `bigint` cast) so that [`ALARM_DUE_INDEX`] gives the order and the scan stops
/// after `$2` rows; the two orders agree because every row left is integer-valued.
pub(super) const DUE_ALARMS: &str = "SELECT ns, id, at::bigint, nonce, hostname, env FROM (\
SELECT ns, id, hostname, env, alarm_at AS at, \
CASE WHEN jsonb_typeof(doc->'nonce') = 'string' THEN doc->>'nonce' END AS nonce \
FROM pinned_tray_index WHERE tray_ns = 'pinned' AND tray_id = 'alarm') AS alarms \
WHERE alarms.at <= $1::bigint AND alarms.at >= -9223372036854775808 \
AND alarms.at = trunc(alarms.at) \
ORDER BY alarms.at, ns COLLATE \"C\", id COLLATE \"C\" LIMIT $2::bigint";
/// The first page of distinct instances with a marked row (`StateStore::marked_instances`),
/// byte-ordered, each with the world of one of its marked rows: one naming a hostname
/// before `'*'`, then the smallest `(hostname, env)`. [`MARKED_INDEX`] holds exactly this
/// order.
pub(super) const MARKED_FIRST: &str = "SELECT DISTINCT ON (ns COLLATE \"C\", id COLLATE \"C\") \
ns, id, hostname, env FROM pinned_tray_index WHERE marked \
ORDER BY ns COLLATE \"C\", id COLLATE \"C\", hostname = '*', hostname COLLATE \"C\", \
env COLLATE \"C\" LIMIT $1::bigint";
/// [`MARKED_FIRST`] strictly after `($1, $2)`: a row comparison, which the index takes as
/// where to start (an `OR` of the same conditions is only a filter).
pub(super) const MARKED_AFTER: &str = "SELECT DISTINCT ON (ns COLLATE \"C\", id COLLATE \"C\") \
ns, id, hostname, env FROM pinned_tray_index \
WHERE marked AND (ns COLLATE \"C\", id COLLATE \"C\") > ($1::text, $2::text) \
ORDER BY ns COLLATE \"C\", id COLLATE \"C\", hostname = '*', hostname COLLATE \"C\", \
env COLLATE \"C\" LIMIT $3::bigint";

/// The schema of `$1` (a table name as `regclass` reads it, so unqualified names follow
/// the `search_path`), whether each sweeper index on it is valid (`NULL`: absent), and
/// whether the retired alarm index is still there.
const STATUS: &str = "SELECT quote_ident(n.nspname), \
(SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
WHERE i.indrelid = t.oid AND c.relname = 'pinned_tray_index_alarm_at'), \
(SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
WHERE i.indrelid = t.oid AND c.relname = 'pinned_tray_index_marked'), \
EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
WHERE i.indrelid = t.oid AND c.relname = 'pinned_tray_index_alarm_due') \
FROM pg_class t JOIN pg_namespace n ON n.oid = t.relnamespace WHERE t.oid = $1::text::regclass";

/// How many times a build is tried when the server breaks it off with a transient error
/// (concurrent index builds on other tables can be chosen as a deadlock's victim).
const BUILD_ATTEMPTS: u32 = 3;

/// Shown in `pg_stat_activity.application_name` while a build runs.
const BUILDER_NAME: &str = "pinned sweep index build";

/// Where one of the sweeper's indexes stands, as the catalog says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexState {
    /// No index of that name on the table.
    Missing,
    /// Present but not used by the planner: a build in progress, or what a failed one
    /// left behind.
    Invalid,
    /// Built; the planner uses it.
    Ready,
}

impl IndexState {
    fn from_valid(valid: Option<bool>) -> Self {
        match valid {
            None => Self::Missing,
            Some(false) => Self::Invalid,
            Some(true) => Self::Ready,
        }
    }
}

/// The sweeper's indexes on the store's `pinned_tray_index`
/// ([`PostgresStore::sweep_indexes`](super::PostgresStore::sweep_indexes)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepIndexes {
    /// The schema holding the table (quoted where it needs to be).
    pub schema: String,
    /// [`ALARM_DUE_INDEX`], serving `due_alarms`.
    pub alarm_due: IndexState,
    /// [`MARKED_INDEX`], serving `marked_instances`.
    pub marked: IndexState,
    /// [`RETIRED_ALARM_INDEX`] is still on the table (valid or not): until the builder
    /// drops it, no row write is a HOT update.
    pub retired_alarm: bool,
}

impl SweepIndexes {
    /// Whether both are built and the retired alarm index is gone.
    pub fn ready(&self) -> bool {
        self.alarm_due == IndexState::Ready
            && self.marked == IndexState::Ready
            && !self.retired_alarm
    }

    /// Each index with its name and definition.
    fn each(&self) -> [(&'static str, &'static str, IndexState); 2] {
        [
            (ALARM_DUE_INDEX, ALARM_DUE_DEFINITION, self.alarm_due),
            (MARKED_INDEX, MARKED_DEFINITION, self.marked),
        ]
    }
}

/// What one [`PostgresStore::build_sweep_indexes`](super::PostgresStore::build_sweep_indexes)
/// call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepIndexBuild {
    /// Both indexes were built already; nothing was done.
    AlreadyReady,
    /// This call built what was missing (dropping invalid leftovers first); both are
    /// built now.
    Built {
        /// From taking the build lock to the last index built.
        elapsed: Duration,
    },
    /// Another process is building this table's indexes; nothing was done.
    Busy,
}

/// One of the sweeper's scans with its arguments, for
/// [`PostgresStore::explain`](super::PostgresStore::explain).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepScan<'a> {
    /// `due_alarms(due_by_ms, limit)`.
    DueAlarms {
        /// Alarms due at or before this (epoch ms).
        due_by_ms: i64,
        /// Most rows returned.
        limit: usize,
    },
    /// `marked_instances(after, limit)`.
    MarkedInstances {
        /// The previous page's last `(ns, id)`; `None` for the first page.
        after: Option<(&'a str, &'a str)>,
        /// Most instances returned.
        limit: usize,
    },
}

/// Which plan [`PostgresStore::explain`](super::PostgresStore::explain) shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanChoice {
    /// Planned for the arguments given: what the server runs for a statement's first
    /// executions, and later whenever it costs less than the generic plan.
    Custom,
    /// Planned for any arguments: what a prepared statement (the store prepares its
    /// scans once per connection) may switch to after five executions.
    Generic,
}

/// Reads the state of the sweeper's indexes on `table` (see [`STATUS`]).
pub(super) async fn status(
    client: &tokio_postgres::Client,
    table: &str,
) -> Result<SweepIndexes, StoreError> {
    let row = client.query_one(STATUS, &[&table]).await?;
    Ok(SweepIndexes {
        schema: row.try_get(0)?,
        alarm_due: IndexState::from_valid(row.try_get(1)?),
        marked: IndexState::from_valid(row.try_get(2)?),
        retired_alarm: row.try_get(3)?,
    })
}

/// A connection taken out of the pool for good: its session state dies with it.
async fn detached(pool: &Pool) -> Result<ClientWrapper, StoreError> {
    Ok(Object::take(pool.get().await.map_err(pool_error)?))
}

/// Builds the sweeper's indexes of one schema's `pinned_tray_index` (see the module doc).
#[derive(Debug, Clone)]
pub(super) struct IndexBuilder {
    pool: Pool,
    deadline: Duration,
}

impl IndexBuilder {
    pub(super) fn new(pool: Pool, options: &PostgresOptions) -> Self {
        Self {
            pool,
            deadline: options.index_build_deadline,
        }
    }

    /// Builds what is missing or invalid in `schema`, unless another process holds the
    /// build lock, all within the build deadline.
    pub(super) async fn build(&self, schema: &str) -> Result<SweepIndexBuild, StoreError> {
        match tokio::time::timeout(self.deadline, self.build_within_deadline(schema)).await {
            Ok(outcome) => outcome,
            // The connection dropped with the future is closed; the server's own
            // statement timeout (the same deadline) ends a statement still running.
            Err(_elapsed) => Err(StoreError::Deadline {
                deadline: self.deadline,
            }),
        }
    }

    async fn build_within_deadline(&self, schema: &str) -> Result<SweepIndexBuild, StoreError> {
        let client = detached(&self.pool).await?;
        client
            .batch_execute(&format!(
                "SET application_name = '{BUILDER_NAME}'; SET client_min_messages = warning; \
                 SET statement_timeout = '{}ms'",
                self.deadline.as_millis()
            ))
            .await?;
        let locked: bool = client
            .query_one(
                "SELECT pg_try_advisory_lock($1)",
                &[&build_lock_key(schema)],
            )
            .await?
            .try_get(0)?;
        if !locked {
            return Ok(SweepIndexBuild::Busy);
        }
        let outcome = self.build_locked(&client, schema).await;
        if outcome.is_ok() {
            // Released now rather than when the closing session ends, so that the next
            // builder does not find it taken. On an error the session ends anyway.
            client
                .execute("SELECT pg_advisory_unlock($1)", &[&build_lock_key(schema)])
                .await?;
        }
        outcome
    }

    /// Builds under the lock, until the catalog says both indexes are built.
    async fn build_locked(
        &self,
        client: &tokio_postgres::Client,
        schema: &str,
    ) -> Result<SweepIndexBuild, StoreError> {
        let started = Instant::now();
        let table = format!("{schema}.pinned_tray_index");
        let mut attempt = 1;
        let mut changed = false;
        loop {
            // Read under the lock: a build that finished meanwhile is not redone, and an
            // invalid index now can only be a failed build's (ours build under the lock).
            let indexes = status(client, &table).await?;
            if indexes.ready() {
                return Ok(if changed {
                    SweepIndexBuild::Built {
                        elapsed: started.elapsed(),
                    }
                } else {
                    SweepIndexBuild::AlreadyReady
                });
            }
            if attempt > BUILD_ATTEMPTS {
                // Built, yet not there: `IF NOT EXISTS` found another relation of that name.
                return Err(StoreError::Setup {
                    source: format!(
                        "the sweeper indexes of {table} are still not built after \
                         {BUILD_ATTEMPTS} attempts ({indexes:?}): does another relation \
                         take the name {ALARM_DUE_INDEX} or {MARKED_INDEX}?"
                    )
                    .into(),
                });
            }
            changed = true;
            let built = async {
                for (name, definition, state) in indexes.each() {
                    if state == IndexState::Invalid {
                        client
                            .batch_execute(&format!(
                                "DROP INDEX CONCURRENTLY IF EXISTS {schema}.{name}"
                            ))
                            .await?;
                    }
                    if state != IndexState::Ready {
                        tracing::info!(index = name, %table, "building a sweeper index");
                        client
                            .batch_execute(&format!(
                                "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} {definition}"
                            ))
                            .await?;
                    }
                }
                // Only once its successor is built: the scans never lack an index.
                if indexes.retired_alarm {
                    tracing::info!(index = RETIRED_ALARM_INDEX, %table, "dropping the retired alarm index");
                    client
                        .batch_execute(&format!(
                            "DROP INDEX CONCURRENTLY IF EXISTS {schema}.{RETIRED_ALARM_INDEX}"
                        ))
                        .await?;
                }
                Ok::<_, StoreError>(())
            }
            .await;
            match built {
                Ok(()) => {}
                Err(StoreError::Postgres { source })
                    if attempt < BUILD_ATTEMPTS && postgres_transient(&source) =>
                {
                    tracing::warn!(error = %source, attempt, %table, "sweeper index build broken off; trying again");
                }
                Err(err) => return Err(err),
            }
            attempt += 1;
        }
    }
}

/// The session advisory lock serializing index builds on one schema's table: FNV-1a of
/// the schema name, so every process (whatever its version) computes the same key, and
/// builds in other schemas of the database go on in parallel.
fn build_lock_key(schema: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in "pinned sweep indexes ".bytes().chain(schema.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    i64::from_ne_bytes(hash.to_ne_bytes())
}

/// `EXPLAIN (FORMAT JSON)` of one scan, as the store sends it, on a connection of its
/// own: the scan is prepared (`PREPARE`) and `EXPLAIN EXECUTE`d with its arguments
/// written as literals (strings quoted by the server), under `plan_cache_mode` forcing
/// the plan asked for. `begin` opens the transaction (the store's timeouts and hook, so
/// the same tables are read).
pub(super) async fn explain(
    pool: &Pool,
    begin: &str,
    scan: SweepScan<'_>,
    plan: PlanChoice,
    analyze: bool,
) -> Result<Value, StoreError> {
    let client = detached(pool).await?;
    client.batch_execute(begin).await?;
    let (sql, args) = match scan {
        SweepScan::DueAlarms { due_by_ms, limit } => {
            (DUE_ALARMS, format!("{due_by_ms}, {}", sql_limit(limit)))
        }
        SweepScan::MarkedInstances { after: None, limit } => {
            (MARKED_FIRST, sql_limit(limit).to_string())
        }
        SweepScan::MarkedInstances {
            after: Some((ns, id)),
            limit,
        } => {
            let quoted = client
                .query_one(
                    "SELECT quote_literal($1::text), quote_literal($2::text)",
                    &[&ns, &id],
                )
                .await?;
            let (ns, id): (String, String) = (quoted.try_get(0)?, quoted.try_get(1)?);
            (MARKED_AFTER, format!("{ns}, {id}, {}", sql_limit(limit)))
        }
    };
    let mode = match plan {
        PlanChoice::Custom => "force_custom_plan",
        PlanChoice::Generic => "force_generic_plan",
    };
    let options = if analyze {
        "FORMAT JSON, ANALYZE, BUFFERS"
    } else {
        "FORMAT JSON"
    };
    client
        .batch_execute(&format!(
            "SET LOCAL plan_cache_mode = {mode}; PREPARE pinned_sweep_scan AS {sql}"
        ))
        .await?;
    let row = client
        .query_one(
            &format!("EXPLAIN ({options}) EXECUTE pinned_sweep_scan({args})"),
            &[],
        )
        .await?;
    let plan: Value = row.try_get(0)?;
    client.batch_execute("COMMIT").await?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alarm_index_is_keyed_by_the_column_the_scan_reads() {
        assert!(DUE_ALARMS.contains(&format!("{ALARM_AT_COLUMN} AS at")));
        assert!(ALARM_DUE_DEFINITION.starts_with(&format!("({ALARM_AT_COLUMN}, ")));
        // The trigger and the backfill compute the column with one expression.
        assert!(MIGRATE_ALARM_AT.contains(&format!(":= {}", alarm_at!("NEW.doc"))));
        assert!(MIGRATE_ALARM_AT.contains(&format!("SET alarm_at = {} ", alarm_at!("doc"))));
        assert!(!ALARM_DUE_DEFINITION.contains("doc") && !DUE_ALARMS.contains("doc->'at'"));
        // Both filter the alarm rows with the same words, so the predicate is implied.
        let rows = "WHERE tray_ns = 'pinned' AND tray_id = 'alarm'";
        assert!(DUE_ALARMS.contains(rows) && ALARM_DUE_DEFINITION.ends_with(rows));
    }

    #[test]
    fn the_lock_key_depends_on_the_schema_only() {
        assert_eq!(build_lock_key("public"), build_lock_key("public"));
        assert_ne!(build_lock_key("public"), build_lock_key("pinned"));
    }
}
