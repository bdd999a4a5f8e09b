//! Group commit: the fenced writes of many instances in one statement and one commit.
//!
//! Owns the queue of [`PostgresStore`](super::PostgresStore)'s one-round-trip writes and
//! the flusher that sends them. The flusher takes the first write that waits and
//! whatever queued up behind it (at most [`MAX_GROUP`] instances), and sends `BEGIN`,
//! one [`GROUP_WRITE`] and `COMMIT` together, one round trip. At low load a write leaves
//! alone as soon as it arrives; under load statements grow instead of queues, so the
//! server parses, plans, locks and flushes its log once per group rather than once per
//! instance. One group is in flight at a time unless it stalls (see [`Flusher::run`]).
//!
//! It never changes what a write does: each instance's rows land only while its
//! `pinned_epoch` row holds exactly the writer's epoch, and an instance that does not
//! match is handed back, untouched, for the full transaction. It must never hold two
//! writes of one instance at once: the caller's [`Turn`] travels with its write and
//! comes back only once the write's outcome is known, so even a caller that gave up
//! waiting cannot start the instance's next write early.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_postgres::types::ToSql;

use super::begin::Begin;
use super::{pool_error, postgres_transient, Checkout, PostgresOptions};
use crate::error::StoreError;
use crate::locks::Turn;
use crate::DocText;

/// Most instances in one statement: keeps one statement's parameters and locks small
/// enough that a group never approaches the statement timeout.
pub(super) const MAX_GROUP: usize = 64;

/// How long a group may be in flight before the next may leave beside it.
const STALL: Duration = Duration::from_millis(5);

/// Writes waiting for a flusher (each holds its instance's turn, so at most one per
/// instance); a full queue makes writers wait.
const QUEUE: usize = 1024;

/// Every write of a group, instances numbered from 1 (`WITH ORDINALITY`). Rows go to
/// an instance only through the `fence` join, which takes its `pinned_epoch` row
/// `FOR SHARE` only when it holds exactly the writer's epoch. `FOR SHARE` conflicts with
/// the `FOR UPDATE` every acquirer (ours and the reference's) takes before it raises an
/// epoch, so the fence is the full transaction's; under READ COMMITTED a statement that
/// waited for an acquirer re-checks the epoch of the row it committed. It answers the
/// numbers of the instances that matched. Replaying it writes the same images.
///
/// The rows to delete are materialized first (`gone`), so each is looked up by its whole
/// key. Joined in one step, the planner would read every row of the instance by its
/// `(ns, id)` prefix to match them against the (usually empty) list: a write to an
/// instance with many rows (a tray's log pages) then cost time in their number.
const GROUP_WRITE: &str = "WITH fence AS (\
SELECT w.n, e.ns, e.id FROM unnest($1::text[], $2::text[], $3::bigint[]) \
WITH ORDINALITY AS w(ns, id, epoch, n) \
JOIN pinned_epoch e ON e.ns = w.ns AND e.id = w.id AND e.epoch = w.epoch FOR SHARE OF e), \
upserted AS (INSERT INTO pinned_tray_index (ns, id, tray_ns, tray_id, marked, doc, env, hostname) \
SELECT f.ns, f.id, s.tray_ns, s.tray_id, s.marked, s.doc::jsonb, $4, $5 \
FROM unnest($6::bigint[], $7::text[], $8::text[], $9::boolean[], $10::text[]) \
AS s(n, tray_ns, tray_id, marked, doc) JOIN fence f ON f.n = s.n \
ON CONFLICT (ns, id, tray_ns, tray_id) DO UPDATE SET marked = EXCLUDED.marked, \
doc = EXCLUDED.doc, env = EXCLUDED.env, hostname = EXCLUDED.hostname RETURNING 1), \
gone AS MATERIALIZED (SELECT f.ns, f.id, d.tray_ns, d.tray_id \
FROM unnest($11::bigint[], $12::text[], $13::text[]) AS d(n, tray_ns, tray_id) \
JOIN fence f ON f.n = d.n), \
deleted AS (DELETE FROM pinned_tray_index t USING gone g \
WHERE t.ns = g.ns AND t.id = g.id AND t.tray_ns = g.tray_ns AND t.tray_id = g.tray_id \
RETURNING 1) \
SELECT n FROM fence";

/// One instance's write: every row at most once, at its final image.
#[derive(Debug)]
pub(super) struct Write {
    pub(super) ns: String,
    pub(super) id: String,
    /// The epoch the instance's `pinned_epoch` row must hold exactly.
    pub(super) stored_epoch: i64,
    /// `(tray_ns, tray_id, marked, doc)`.
    pub(super) sets: Vec<(String, String, bool, DocText)>,
    /// `(tray_ns, tray_id)`.
    pub(super) deletes: Vec<(String, String)>,
}

/// How a write ended when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Landed {
    /// Committed.
    Written,
    /// The stored epoch was not exactly the writer's: nothing was written.
    Fenced,
}

/// A write and its caller's turn, waiting for a flusher.
struct Request {
    write: Write,
    turn: Turn,
    reply: oneshot::Sender<(Result<Landed, StoreError>, Turn)>,
}

/// The queue and its flushers, started on the first write.
#[derive(Debug)]
pub(super) struct GroupCommit {
    pool: Pool,
    begin: Arc<Begin>,
    options: Arc<PostgresOptions>,
    queue: OnceLock<mpsc::Sender<Request>>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("ns", &self.write.ns)
            .field("id", &self.write.id)
            .finish_non_exhaustive()
    }
}

impl GroupCommit {
    pub(super) fn new(pool: Pool, begin: Arc<Begin>, options: &PostgresOptions) -> Self {
        Self {
            pool,
            begin,
            options: Arc::new(options.clone()),
            queue: OnceLock::new(),
        }
    }

    /// Sends `write` with whatever else is waiting; answers how it landed and gives the
    /// turn back. On an error the turn is released once the write's outcome is known.
    pub(super) async fn write(
        &self,
        write: Write,
        turn: Turn,
    ) -> Result<(Landed, Turn), StoreError> {
        let (reply, answer) = oneshot::channel();
        let request = Request { write, turn, reply };
        if self.queue().send(request).await.is_err() {
            return Err(StoreError::Closed);
        }
        // A flusher answers every request it took; a closed channel is the runtime
        // shutting down under it.
        let (outcome, turn) = answer.await.map_err(|_| StoreError::Closed)?;
        outcome.map(|landed| (landed, turn))
    }

    fn queue(&self) -> &mpsc::Sender<Request> {
        self.queue.get_or_init(|| {
            let (queue, waiting) = mpsc::channel(QUEUE);
            let flusher = Arc::new(Flusher {
                pool: self.pool.clone(),
                begin: self.begin.clone(),
                options: self.options.clone(),
            });
            tokio::spawn(flusher.run(waiting, flushers(self.options.pool_size)));
            queue
        })
    }
}

/// How many groups may be in flight for a pool of `pool_size`: half the pool, the
/// rest stays free for reads and full transactions.
fn flushers(pool_size: usize) -> usize {
    (pool_size / 2).max(1)
}

/// Sends the groups.
struct Flusher {
    pool: Pool,
    begin: Arc<Begin>,
    options: Arc<PostgresOptions>,
}

impl Flusher {
    /// Takes groups off the queue. One group is in flight at a time, so that what
    /// arrives meanwhile leaves together as the next (fewer, larger transactions: the
    /// server's cost per write falls as groups grow); a group still out after [`STALL`]
    /// (a lock wait, a slow disk) lets the next leave beside it, and so does a full one
    /// (more are waiting than a group holds), up to `most` at once, so one stuck
    /// statement never holds up every instance.
    async fn run(self: Arc<Self>, mut waiting: mpsc::Receiver<Request>, most: usize) {
        let in_flight = Arc::new(Semaphore::new(most));
        loop {
            let Some(first) = waiting.recv().await else {
                return;
            };
            let Ok(permit) = in_flight.clone().acquire_owned().await else {
                return;
            };
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match waiting.try_recv() {
                    Ok(next) => group.push(next),
                    Err(_) => break,
                }
            }
            let full = group.len() == MAX_GROUP;
            let flusher = self.clone();
            let mut send = Box::pin(async move {
                let outcomes = flusher.settle(&group).await;
                for (request, outcome) in group.into_iter().zip(outcomes) {
                    // A caller that stopped waiting drops the answer and, with it, the turn.
                    let _ = request.reply.send((outcome, request.turn));
                }
                drop(permit);
            });
            if full {
                // More are waiting than one group holds: the next leaves at once.
                tokio::spawn(send);
                continue;
            }
            // Sent from here while it is quick; handed to a task of its own once it
            // stalls, and the next group may leave.
            tokio::select! {
                () = &mut send => {}
                () = tokio::time::sleep(STALL) => {
                    tokio::spawn(send);
                }
            }
        }
    }

    /// Outcomes in the group's order. A group the server refused as a whole (one bad
    /// document, say) is sent again one instance at a time, so a write fails only for
    /// its own fault.
    async fn settle(&self, group: &[Request]) -> Vec<Result<Landed, StoreError>> {
        let writes: Vec<&Write> = group.iter().map(|r| &r.write).collect();
        let distinct = {
            let mut seen = HashSet::with_capacity(writes.len());
            writes.iter().all(|w| seen.insert((&w.ns, &w.id)))
        };
        if writes.len() > 1 && distinct {
            match self.send(&writes).await {
                Ok(matched) => return landed(writes.len(), &matched).into_iter().map(Ok).collect(),
                Err(err) if !answered(&err) => {
                    let shared = err.to_string();
                    let copies: Vec<_> = (1..writes.len())
                        .map(|_| Err(copy(&shared, &err)))
                        .collect();
                    let mut outcomes = vec![Err(err)];
                    outcomes.extend(copies);
                    return outcomes;
                }
                // The server refused the statement and rolled it back: try each alone.
                Err(_) => {}
            }
        }
        let mut outcomes = Vec::with_capacity(writes.len());
        for write in writes {
            outcomes.push(
                self.send(&[write])
                    .await
                    .map(|matched| landed(1, &matched)[0]),
            );
        }
        outcomes
    }

    /// One group, retried as `PostgresStore`'s retry rule says (replaying it is safe);
    /// answers the (1-based) numbers of the instances whose fence matched.
    async fn send(&self, writes: &[&Write]) -> Result<Vec<i64>, StoreError> {
        let mut retries = 0;
        loop {
            let conn = self.pool.get().await.map_err(pool_error)?;
            let pooled = Object::metrics(&conn).recycle_count > 0;
            let mut checkout = Checkout::new(conn);
            let attempt = tokio::time::timeout(
                self.options.txn_deadline,
                self.statement(&mut checkout, writes),
            )
            .await;
            let err = match attempt {
                Ok(Ok(matched)) => return Ok(matched),
                Ok(Err(err)) => err,
                Err(_elapsed) => {
                    // The server may still run the statement with its `COMMIT` queued
                    // behind it: a replay could land before it and a later write after
                    // it, so this one is never replayed. Dropping the checkout kills
                    // the connection.
                    drop(checkout);
                    return Err(StoreError::CommitIndeterminate {
                        source: Box::new(StoreError::Deadline {
                            deadline: self.options.txn_deadline,
                        }),
                    });
                }
            };
            let transient = match &err {
                StoreError::Postgres { source } => postgres_transient(source),
                _ => false,
            };
            if answered(&err) && !transient {
                // Refused and rolled back: the outcome is known.
                return Err(err);
            }
            if !(pooled && transient && retries < self.options.pool_size) {
                return Err(if answered(&err) {
                    err
                } else {
                    StoreError::CommitIndeterminate {
                        source: Box::new(err),
                    }
                });
            }
            retries += 1;
            tracing::warn!(error = %err, retries, instances = writes.len(), "postgres store: pooled connection failed during a group write; sending it again");
        }
    }

    /// `BEGIN` (with the timeouts), [`GROUP_WRITE`] and `COMMIT`, sent together.
    async fn statement(
        &self,
        checkout: &mut Checkout,
        writes: &[&Write],
    ) -> Result<Vec<i64>, StoreError> {
        let columns = Columns::of(writes);
        let conn = checkout.enter()?;
        // Prepared before anything is sent, so that the three requests below leave in
        // order on their first poll (`join!` polls its futures in order the first time).
        let stmt = conn.prepare_cached(GROUP_WRITE).await?;
        if self.options.transaction_sql.is_some() {
            // The hook may change what the statement's table names resolve to: it must
            // have run before the statement is even sent.
            conn.batch_execute(self.begin.sql()).await?;
        }
        let params: [&(dyn ToSql + Sync); 13] = [
            &columns.ns,
            &columns.id,
            &columns.epoch,
            &self.options.env,
            &self.options.hostname,
            &columns.set_n,
            &columns.set_ns,
            &columns.set_id,
            &columns.set_marked,
            &columns.set_doc,
            &columns.delete_n,
            &columns.delete_ns,
            &columns.delete_id,
        ];
        let begin = async {
            if self.options.transaction_sql.is_none() {
                conn.batch_execute(self.begin.sql()).await?;
            }
            Ok::<_, StoreError>(())
        };
        let (began, fenced, committed) = tokio::join!(
            begin,
            conn.query(&stmt, &params),
            conn.batch_execute("COMMIT")
        );
        if committed.is_ok() {
            // Answered: a `COMMIT` after a failed statement answers as a rollback, so
            // either way no transaction is open any more.
            checkout.left();
        }
        began?;
        let rows = fenced?;
        committed?;
        rows.iter()
            .map(|row| row.try_get::<_, i64>(0).map_err(StoreError::from))
            .collect()
    }
}

/// A group as the column arrays [`GROUP_WRITE`] takes.
#[derive(Default)]
struct Columns<'a> {
    ns: Vec<&'a str>,
    id: Vec<&'a str>,
    epoch: Vec<i64>,
    set_n: Vec<i64>,
    set_ns: Vec<&'a str>,
    set_id: Vec<&'a str>,
    set_marked: Vec<bool>,
    set_doc: Vec<&'a str>,
    delete_n: Vec<i64>,
    delete_ns: Vec<&'a str>,
    delete_id: Vec<&'a str>,
}

impl<'a> Columns<'a> {
    fn of(writes: &[&'a Write]) -> Self {
        let mut columns = Self::default();
        for (n, write) in (1_i64..).zip(writes) {
            columns.ns.push(&write.ns);
            columns.id.push(&write.id);
            columns.epoch.push(write.stored_epoch);
            for (tray_ns, tray_id, marked, doc) in &write.sets {
                columns.set_n.push(n);
                columns.set_ns.push(tray_ns);
                columns.set_id.push(tray_id);
                columns.set_marked.push(*marked);
                columns.set_doc.push(doc.as_str());
            }
            for (tray_ns, tray_id) in &write.deletes {
                columns.delete_n.push(n);
                columns.delete_ns.push(tray_ns);
                columns.delete_id.push(tray_id);
            }
        }
        columns
    }
}

/// Each of `count` instances' outcome, from the numbers that matched.
fn landed(count: usize, matched: &[i64]) -> Vec<Landed> {
    let mut outcomes = vec![Landed::Fenced; count];
    for n in matched {
        if let Some(outcome) = usize::try_from(*n)
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| outcomes.get_mut(i))
        {
            *outcome = Landed::Written;
        }
    }
    outcomes
}

/// Whether the server answered the failure (it then rolled the group back).
fn answered(err: &StoreError) -> bool {
    matches!(err, StoreError::Postgres { source } if source.code().is_some())
}

/// The failure of a whole group, for each of its other writes.
fn copy(shared: &str, first: &StoreError) -> StoreError {
    match first {
        StoreError::Unavailable { .. } => StoreError::Unavailable {
            source: shared.into(),
        },
        StoreError::Closed => StoreError::Closed,
        _ => StoreError::CommitIndeterminate {
            source: shared.into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matched_numbers_mark_their_instances_written() {
        assert_eq!(
            landed(3, &[1, 3]),
            vec![Landed::Written, Landed::Fenced, Landed::Written]
        );
        // Numbers the group never sent change nothing.
        assert_eq!(landed(1, &[0, 2, -1]), vec![Landed::Fenced]);
    }

    #[test]
    fn half_the_pool_may_be_in_flight_and_never_none() {
        assert_eq!(flushers(8), 4);
        assert_eq!(flushers(1), 1);
    }
}
