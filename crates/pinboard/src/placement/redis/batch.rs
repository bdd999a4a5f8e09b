//! Claims and settles of the Redis store, batched: concurrent calls share
//! one script call (`PLACE`, one `EVALSHA` naming many ops), so under load
//! a new placement costs Redis a fraction of a round trip and of a script
//! start, and the generation and each candidate's record are read once per
//! batch instead of once per claim.
//!
//! Owns the op queue, the driver task that cuts it into batches, and the
//! `PLACE` script. Never changes what an op does: the script applies the
//! ops in queue order, each exactly as the single-op scripts it replaced
//! did (see `PLACE` for why the shared reads and the deferred set updates
//! leave the same state), and answers each op on its own, so one op that
//! fails (a row of the wrong type) or conflicts (the id is owned, the
//! candidate gone, the generation another) does not touch the others.
//!
//! # Bounds
//!
//! - The queue holds at most [`Batching::queue`] ops; a caller finding it
//!   full waits for room within its deadline.
//! - At most [`Batching::max_in_flight`] batches are on their way at once,
//!   each of at most [`Batching::max_ops`] ops. While the slots are busy,
//!   ops gather in the queue and leave together: under light load an op
//!   goes alone at once (no added latency), under heavy load batches grow.
//! - Every op has [`Batching::deadline`] from its call: a caller is
//!   answered by then (an error past it), an op whose deadline passed
//!   while queued is never sent, and a batch is given up when the last
//!   deadline of its ops passes. A batch cut by a Redis failure answers
//!   each of its callers with the error.
//!
//! # Cancel safety
//!
//! A caller dropped while its op is queued withdraws it (the op is not
//! sent); dropped after the op was sent, the op runs and its answer is
//! discarded, as a single command's would be.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::{ErrorKind, RedisError, Script, Value};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use super::super::connection::RedisConn;
use super::super::StoreError;

// KEYS: generation key, unsettled set, dropped mark. ARGV: worker prefix,
// owner index prefix, row prefix, then the ops, each
//   'c', row name, candidate ('' = none), floor, stale sid, stale epoch,
//        expected generation                       (resolve or claim)
//   's', row name, sid, epoch                      (settle)
// Returns one answer per op, in order: a claim that claimed a row nobody
// owned as its new epoch (an integer: epochs stay below 2^53, exact in a
// Lua number), one that took a row another session owned as `{'moved',
// epoch, that session}`, any other claim's as `{kind, ...}` (see
// `decode_claim`), a settle's as 1/0, an op that raised as `{'err', msg}`.
//
// Why batching leaves what the ops one by one would:
// - the generation, the dropped mark and the worker records are read at
//   most once per call: no op here writes them, and a script sees no time
//   pass (keys do not expire under it);
// - membership changes of the owner indexes and the unsettled set are
//   applied at the end, the last change of each member winning: no op here
//   reads those sets, and a set's final content after a run of SADD/SREM is
//   decided by each member's last one;
// - `HDEL t` and `PERSIST` are skipped on a row that had no tag or did not
//   exist (none of its fields): both are no-ops there.
const PLACE: &str = r#"
local wp, ip, rp = ARGV[1], ARGV[2], ARGV[3]
local gen, gen_read = false, false
local dropped = nil
local live, sets = {}, {}
local function mark(key, member, add)
  local s = sets[key]
  if not s then s = {}; sets[key] = s end
  s[member] = add
end
local function exists(sid)
  local v = live[sid]
  if v == nil then v = redis.call('EXISTS', wp .. sid); live[sid] = v end
  return v == 1
end
local function claim(name, cand, floor, stale_sid, stale_epoch, want)
  local row = rp .. name
  local v = redis.call('HMGET', row, 's', 'e', 't')
  local owner = v[1] or ''
  local epoch = tonumber(v[2] or '0')
  local stale = owner == stale_sid and string.format('%.0f', epoch) == stale_epoch
  if owner ~= '' and not stale and exists(owner) then
    return {'owned', owner, string.format('%.0f', epoch)}
  end
  if cand == '' then return {'vacant'} end
  if not gen_read then gen = redis.call('GET', KEYS[1]); gen_read = true end
  if gen ~= want then return {'generation', gen or ''} end
  if not exists(cand) then return {'gone'} end
  -- Above every epoch a release dropped with its row (see `RELEASE`).
  if dropped == nil then dropped = tonumber(redis.call('GET', KEYS[3]) or '0') end
  local next = math.max(epoch + 1, tonumber(floor), dropped + 1)
  local e = string.format('%.0f', next)
  redis.call('HSET', row, 's', cand, 'e', e)
  if v[3] then redis.call('HDEL', row, 't') end
  if v[1] or v[2] or v[3] then redis.call('PERSIST', row) end
  if owner ~= '' and owner ~= cand then mark(ip .. owner, name, false) end
  mark(ip .. cand, name, true)
  mark(KEYS[2], name, true)
  -- A move says where from (the operator's moves list); a new id stays a
  -- bare integer, as cheap as before.
  if owner ~= '' and owner ~= cand then return {'moved', e, owner} end
  return next
end
local function settle(name, sid, epoch)
  local row = rp .. name
  local v = redis.call('HMGET', row, 's', 'e')
  if v[1] ~= sid or v[2] ~= epoch then return 0 end
  redis.call('HSET', row, 'ok', sid .. '@' .. epoch)
  mark(KEYS[2], name, false)
  return 1
end
local out, i = {}, 4
while i <= #ARGV do
  local ok, r
  if ARGV[i] == 'c' then
    ok, r = pcall(claim, ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6])
    i = i + 7
  elseif ARGV[i] == 's' then
    ok, r = pcall(settle, ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
    i = i + 4
  else
    return redis.error_reply('PLACE: unknown op ' .. tostring(ARGV[i]))
  end
  if not ok then
    r = {'err', type(r) == 'table' and tostring(r.err) or tostring(r)}
  end
  out[#out + 1] = r
end
for key, members in pairs(sets) do
  local add, rem = {}, {}
  for m, a in pairs(members) do
    if a then add[#add + 1] = m else rem[#rem + 1] = m end
  end
  if #add > 0 then redis.call('SADD', key, unpack(add)) end
  if #rem > 0 then redis.call('SREM', key, unpack(rem)) end
end
return out
"#;

/// Default of [`Batching::max_ops`].
const DEFAULT_MAX_OPS: usize = 128;
/// Default of [`Batching::max_in_flight`]: one batch runs while the next
/// waits in Redis' input, so Redis never idles on the client's turnaround.
const DEFAULT_MAX_IN_FLIGHT: usize = 2;
/// Default of [`Batching::queue`].
const DEFAULT_QUEUE: usize = 4096;
/// Default of [`Batching::deadline`].
const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

/// How the Redis store batches claims and settles (see
/// [`RedisStore::connect_with`](super::RedisStore::connect_with)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// Most ops in one script call (default 128).
    pub max_ops: usize,
    /// Most script calls on their way at once (default 2).
    pub max_in_flight: usize,
    /// Most ops waiting for a batch (default 4 096).
    pub queue: usize,
    /// How long a caller waits for its answer, from its call (default 5 s).
    /// The store's other calls wait for Redis as long at most.
    pub deadline: Duration,
}

impl Default for Batching {
    fn default() -> Self {
        Self {
            max_ops: DEFAULT_MAX_OPS,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            queue: DEFAULT_QUEUE,
            deadline: DEFAULT_DEADLINE,
        }
    }
}

/// What the batcher did so far (tests, diagnostics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchStats {
    /// Script calls sent.
    pub batches: u64,
    /// Ops sent in them.
    pub ops: u64,
    /// Ops waiting in the queue now.
    pub queued: usize,
}

/// Key names the script needs, built once.
pub(super) struct Layout {
    pub(super) generation: String,
    pub(super) unsettled: String,
    pub(super) dropped: String,
    pub(super) workers: String,
    pub(super) owners: String,
    pub(super) rows: String,
}

/// One op, owning what it sends.
pub(super) enum Op {
    /// Resolve `name`, claiming it for `candidate` when vacant.
    Claim {
        name: String,
        candidate: Option<String>,
        floor: u64,
        stale: Option<(String, u64)>,
        generation: String,
    },
    /// Mark `name` settled at `(session, epoch)`.
    Settle {
        name: String,
        session: String,
        epoch: u64,
    },
}

struct Queued {
    op: Op,
    deadline: Instant,
    reply: oneshot::Sender<Result<Value, StoreError>>,
}

#[derive(Default)]
struct Counters {
    batches: AtomicU64,
    ops: AtomicU64,
}

/// The caller's side: a bounded queue to the driver task.
pub(super) struct Batcher {
    tx: mpsc::Sender<Queued>,
    deadline: Duration,
    counters: Arc<Counters>,
}

impl Batcher {
    /// Starts the driver task on the current runtime; it ends when the
    /// batcher is dropped (after answering what it sent).
    pub(super) fn start(conn: RedisConn, layout: Layout, settings: Batching) -> Self {
        let settings = Batching {
            max_ops: settings.max_ops.max(1),
            max_in_flight: settings.max_in_flight.max(1),
            queue: settings.queue.max(1),
            deadline: settings.deadline,
        };
        let (tx, rx) = mpsc::channel(settings.queue);
        let counters = Arc::new(Counters::default());
        let driver = Driver {
            conn,
            layout: Arc::new(layout),
            script: Arc::new(Script::new(PLACE)),
            slots: Arc::new(Semaphore::new(settings.max_in_flight)),
            max_ops: settings.max_ops,
            deadline: settings.deadline,
            counters: counters.clone(),
        };
        tokio::spawn(driver.run(rx));
        Self {
            tx,
            deadline: settings.deadline,
            counters,
        }
    }

    /// Queue `op` and wait for its answer (the script's raw answer for it).
    ///
    /// # Errors
    ///
    /// [`StoreError::Timeout`] past the deadline, [`StoreError::Redis`] when
    /// its batch or the op itself failed, [`StoreError::Closed`] when the
    /// driver is gone.
    pub(super) async fn call(&self, op: Op) -> Result<Value, StoreError> {
        let deadline = Instant::now() + self.deadline;
        let (reply, answer) = oneshot::channel();
        let wait = async {
            self.tx
                .send(Queued {
                    op,
                    deadline,
                    reply,
                })
                .await
                .map_err(|_| StoreError::Closed)?;
            answer.await.map_err(|_| StoreError::Closed)?
        };
        match tokio::time::timeout_at(deadline, wait).await {
            Ok(answer) => answer,
            Err(_) => Err(StoreError::Timeout(self.deadline)),
        }
    }

    pub(super) fn stats(&self) -> BatchStats {
        BatchStats {
            batches: self.counters.batches.load(Ordering::Relaxed),
            ops: self.counters.ops.load(Ordering::Relaxed),
            queued: self.tx.max_capacity() - self.tx.capacity(),
        }
    }
}

struct Driver {
    conn: RedisConn,
    layout: Arc<Layout>,
    script: Arc<Script>,
    slots: Arc<Semaphore>,
    max_ops: usize,
    deadline: Duration,
    counters: Arc<Counters>,
}

impl Driver {
    /// Takes a slot, then whatever the queue holds (up to `max_ops`), and
    /// sends it as one batch; until every batcher handle is gone.
    async fn run(self, mut rx: mpsc::Receiver<Queued>) {
        loop {
            // The semaphore is never closed; each permit returns when its
            // batch is answered.
            let Ok(slot) = self.slots.clone().acquire_owned().await else {
                return;
            };
            let Some(first) = rx.recv().await else { return };
            let now = Instant::now();
            let mut batch = Vec::new();
            let mut take = |q: Queued| {
                if q.reply.is_closed() {
                    // The caller left: withdrawn, never sent.
                } else if q.deadline <= now {
                    let _ = q.reply.send(Err(StoreError::Timeout(self.deadline)));
                } else {
                    batch.push(q);
                }
            };
            take(first);
            for _ in 1..self.max_ops {
                match rx.try_recv() {
                    Ok(q) => take(q),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                continue;
            }
            let ops = batch;
            self.counters.batches.fetch_add(1, Ordering::Relaxed);
            self.counters
                .ops
                .fetch_add(ops.len() as u64, Ordering::Relaxed);
            let (conn, layout, script) =
                (self.conn.clone(), self.layout.clone(), self.script.clone());
            let deadline = self.deadline;
            tokio::spawn(async move {
                send(conn, &layout, &script, ops, deadline).await;
                drop(slot);
            });
        }
    }
}

/// Sends one batch and answers each of its callers (a timeout naming
/// `deadline`, the callers' deadline, when the last of theirs passed).
async fn send(
    mut conn: RedisConn,
    layout: &Layout,
    script: &Script,
    ops: Vec<Queued>,
    deadline: Duration,
) {
    let Some(last) = ops.iter().map(|q| q.deadline).max() else {
        return;
    };
    let cmd = command(script.get_hash(), layout, &ops);
    let call = async {
        match cmd.query_async::<Value>(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::NoScriptError => {
                // First use on this Redis (or it restarted): load, retry once.
                script.prepare_invoke().load_async(&mut conn).await?;
                cmd.query_async::<Value>(&mut conn).await
            }
            other => other,
        }
    };
    let answers = match tokio::time::timeout_at(last, call).await {
        Ok(Ok(Value::Array(answers))) if answers.len() == ops.len() => answers,
        Ok(Ok(other)) => {
            let detail = format!("PLACE answered {other:?} for {} ops", ops.len());
            for q in ops {
                let _ = q.reply.send(Err(StoreError::Corrupt(detail.clone())));
            }
            return;
        }
        Ok(Err(e)) => {
            for q in ops {
                let _ = q.reply.send(Err(StoreError::Redis(copy(&e))));
            }
            return;
        }
        Err(_) => {
            for q in ops {
                let _ = q.reply.send(Err(StoreError::Timeout(deadline)));
            }
            return;
        }
    };
    for (q, answer) in ops.into_iter().zip(answers) {
        let _ = q.reply.send(op_error(&answer).map_or(Ok(answer), Err));
    }
}

/// `EVALSHA <sha> 3 <gen> <unsettled> <dropped> <prefixes...> <ops...>`.
fn command(sha: &str, layout: &Layout, ops: &[Queued]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha)
        .arg(3)
        .arg(&layout.generation)
        .arg(&layout.unsettled)
        .arg(&layout.dropped)
        .arg(&layout.workers)
        .arg(&layout.owners)
        .arg(&layout.rows);
    for q in ops {
        match &q.op {
            Op::Claim {
                name,
                candidate,
                floor,
                stale,
                generation,
            } => {
                cmd.arg("c")
                    .arg(name)
                    .arg(candidate.as_deref().unwrap_or(""))
                    .arg(*floor);
                match stale {
                    Some((sid, epoch)) => cmd.arg(sid).arg(*epoch),
                    None => cmd.arg("").arg(""),
                };
                cmd.arg(generation);
            }
            Op::Settle {
                name,
                session,
                epoch,
            } => {
                cmd.arg("s").arg(name).arg(session).arg(*epoch);
            }
        }
    }
    cmd
}

/// An op that raised in the script: `{'err', message}`.
fn op_error(answer: &Value) -> Option<StoreError> {
    let Value::Array(parts) = answer else {
        return None;
    };
    match parts.as_slice() {
        [Value::BulkString(kind), Value::BulkString(msg)] if kind == b"err" => {
            Some(StoreError::Redis(RedisError::from((
                ErrorKind::ResponseError,
                "placement op failed",
                String::from_utf8_lossy(msg).into_owned(),
            ))))
        }
        _ => None,
    }
}

/// The same error for another caller (`RedisError` is not `Clone`).
fn copy(e: &RedisError) -> RedisError {
    RedisError::from((e.kind(), "placement batch failed", e.to_string()))
}
