//! The Redis placement store: any number of pinboard nodes share one Redis
//! and behave as one.
//!
//! Owns the key layout and the Lua scripts; never holds state of its own
//! beyond the connection (a `ConnectionManager`: one multiplexed connection,
//! reconnecting on failure; or a cluster's, see `connection`) and the claim batcher. Every release and
//! reclaim is one Lua script, so it is atomic and costs one round trip.
//! Claims and settles, the calls every new placement makes, go through the
//! batcher (`batch`): concurrent ones share one script call, each op still
//! atomic and answered on its own, so under load a placement costs Redis
//! a fraction of a round trip.
//!
//! Every call waits for Redis at most [`Batching::deadline`] (default 5 s):
//! a frozen Redis answers [`StoreError::Timeout`], never a hang. Calls go
//! through one place for that (`RedisStore::send`; the batcher keeps its own
//! deadline per op); never send to the connection around it.
//!
//! # Key layout (inferred; all under a configurable prefix `P`, default `pinboard:`)
//!
//! | key | type | content |
//! | --- | --- | --- |
//! | `P gen` | string, no TTL | the store's generation, `<token>@<wall ms>` (see `placement`'s "Generation") |
//! | `P w:<session>` | hash, `PX` = lease TTL | `rec` (static worker JSON), `headroom`, `draining` (`0`/`1`), `drain` (operator drain: empty = none, `-` = no deadline, `+<ms>` = a deadline that ends `ms` after the renewal that delivers it, else wall ms), `retire` (empty, or the wall ms at which a wound-down session is superseded) |
//! | `P workers` | set | session ids; members whose hash expired move to `P dead` while listing or expiring |
//! | `P dead` | set | sessions that are gone but still own rows (in `P o:<session>`) not yet handed their grace |
//! | `P m:<session>` | list, `PX` = lease TTL | queued control messages (JSON with `msgId`), oldest first |
//! | `P mseq` | string | `INCR` counter for `msgId`s |
//! | `P sup:<session>` | string, `PX` | the supersession reason |
//! | `P p:<ns>/<id>` | hash; no TTL while its owner lives, `PX` = row grace once vacated | `s` owner session (empty when released), `e` epoch, `t` tag, `ok` `<session>@<epoch>` once settled; a release of a row never settled deletes it |
//! | `P dropped` | string, no TTL | the dropped mark: the highest epoch of a row a release deleted; every claim mints above it |
//! | `P o:<session>` | set | `<ns>/<id>` of every row the session owns (kept exact by every claim, reclaim and release) |
//! | `P sweeper` | string, `PX` = sweeper lease TTL | token of the node holding the sweeper lease |
//! | `P hostnames` | sorted set, no TTL | bound hostnames (lowercase), scored by the wall ms they were last bound; trimmed to the newest `MAX_BOUND_HOSTNAMES` |
//! | `P deployments` | string, no TTL | the deployment version (`INCR`ed by every admission that binds a hostname, supersedes or winds down; see [`PlacementStore::deployment_version`]) |
//!
//! Worker secrets are stored in `rec` (every node must mint attestations
//! for every worker): protect the Redis like the deployment token.
//!
//! A placement is live while `P w:<s>` exists. A row gets a TTL of the row
//! grace when it is released after it was settled (one never settled is
//! deleted at once), and when its owner is gone: the expiry pass
//! (`EXPIRE_ROWS`, every half lease TTL on every node, each call bounded)
//! moves lapsed sessions from `P workers` to `P dead` and pops each dead
//! session's `P o:<session>`, expiring the rows it still owns. A claim or
//! reclaim takes a row back out of its grace (`PERSIST`). Every claim
//! checks `P gen` first, in the same script: a wiped Redis (no `gen`, or
//! another one) places nothing until the node noticed.
//!
//! Scripts touch keys they derive from the prefix, so every key of one
//! store must live on one server: one Redis, or one hash tag of a cluster
//! (the prefix `P{s17}`: each of `ClusterStore`'s virtual shards is one of
//! these stores).

mod batch;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use pinned_store::InstanceKey;
use pinned_wire::registry::ControlMessage;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::connection::RedisConn;
use redis::{Cmd, FromRedisValue, Pipeline, RedisResult, Script, ScriptInvocation, Value};

pub use self::batch::{BatchStats, Batching};
use self::batch::{Batcher, Layout, Op};

use super::{
    Admission, ClaimOutcome, DrainDeadline, Generation, LiveWorker, Placement, PlacementEntry,
    PlacementStore, ReclaimOutcome, StoreError, WorkerRecord, MAX_BOUND_HOSTNAMES,
};
use crate::clock::Now;

/// Placement store shared through Redis.
#[derive(Clone)]
pub struct RedisStore {
    conn: RedisConn,
    prefix: String,
    scripts: Arc<Scripts>,
    batcher: Arc<Batcher>,
    row_grace_ms: u64,
    /// How long any call waits for Redis' answer ([`Batching::deadline`]).
    deadline: Duration,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish()
    }
}

struct Scripts {
    admit: Script,
    renew: Script,
    drain: Script,
    get: Script,
    list: Script,
    reclaim: Script,
    release: Script,
    tag: Script,
    row: Script,
    wake: Script,
    acks: Script,
    placements: Script,
    lease_renew: Script,
    lease_release: Script,
    expire_rows: Script,
    open_generation: Script,
}

// Lua numbers are doubles: epochs (< 2^53) are formatted with %.0f so they
// never come back in exponent notation.
const GET: &str = r#"
local v = redis.call('HMGET', KEYS[1], 'rec', 'headroom', 'draining', 'drain', 'retire')
if not v[1] then return false end
return {v[1], v[2], v[3], v[4], tostring(redis.call('PTTL', KEYS[1])), v[5]}
"#;

// A registration, atomically (`PlacementStore::admit_worker`).
// KEYS: deployment version, the newcomer's worker key, workers set, dead
// set, the newcomer's message list.
// ARGV: expected version ('' = none), newcomer sid, rec, headroom,
// draining, drain, retire, ttl ms, worker prefix, message prefix,
// supersession prefix, supersession ttl ms, bump ('1'/'0'), number of
// sessions to supersede, then (sid, reason) per superseded session, then
// (sid, deadline wall ms) per session to wind down.
const ADMIT: &str = r#"
if ARGV[1] ~= '' and (redis.call('GET', KEYS[1]) or '0') ~= ARGV[1] then return 0 end
if ARGV[13] == '1' then redis.call('INCR', KEYS[1]) end
local n = tonumber(ARGV[14])
for i = 15, 14 + 2 * n, 2 do
  local sid = ARGV[i]
  redis.call('SET', ARGV[11] .. sid, ARGV[i + 1], 'PX', ARGV[12])
  redis.call('DEL', ARGV[9] .. sid, ARGV[10] .. sid)
  redis.call('SREM', KEYS[3], sid)
  redis.call('SADD', KEYS[4], sid)
end
for i = 15 + 2 * n, #ARGV, 2 do
  local key = ARGV[9] .. ARGV[i]
  if redis.call('EXISTS', key) == 1 then
    redis.call('HSET', key, 'drain', ARGV[i + 1], 'retire', ARGV[i + 1])
  end
end
redis.call('DEL', KEYS[2], KEYS[5])
redis.call('HSET', KEYS[2], 'rec', ARGV[3], 'headroom', ARGV[4], 'draining', ARGV[5], 'drain', ARGV[6], 'retire', ARGV[7])
redis.call('PEXPIRE', KEYS[2], ARGV[8])
redis.call('SADD', KEYS[3], ARGV[2])
return 1
"#;

// ARGV: headroom, draining, ttl ms, now (wall ms). A pending operator
// drain deadline (`+<ms>`) is delivered by this renewal: it ends `ms`
// after now (see `DrainDeadline`).
const RENEW: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSET', KEYS[1], 'headroom', ARGV[1], 'draining', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
local drain = redis.call('HGET', KEYS[1], 'drain')
if drain and string.sub(drain, 1, 1) == '+' then
  drain = string.format('%.0f', tonumber(ARGV[4]) + tonumber(string.sub(drain, 2)))
  redis.call('HSET', KEYS[1], 'drain', drain)
end
local v = redis.call('HMGET', KEYS[1], 'rec', 'headroom', 'draining', 'drain', 'retire')
return {v[1], v[2], v[3], v[4], ARGV[3], v[5]}
"#;

const DRAIN: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'drain', ARGV[1])
return 1
"#;

// KEYS: workers set, dead set. ARGV: worker key prefix.
const LIST: &str = r#"
local out = {}
for _, sid in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local key = ARGV[1] .. sid
  local v = redis.call('HMGET', key, 'rec', 'headroom', 'draining', 'drain', 'retire')
  if v[1] then
    table.insert(out, {v[1], v[2], v[3], v[4], tostring(redis.call('PTTL', key)), v[5]})
  else
    redis.call('SREM', KEYS[1], sid)
    redis.call('SADD', KEYS[2], sid)
  end
end
return out
"#;

// KEYS: placement row, new session's owner index, the unsettled set, the
// dropped mark. ARGV: new sid, floor, worker prefix, row name, owner index
// prefix, then the process's previous sids (each its own argument).
const RECLAIM: &str = r#"
local owner = redis.call('HGET', KEYS[1], 's') or ''
local epoch = tonumber(redis.call('HGET', KEYS[1], 'e') or '0')
if owner == ARGV[1] then
  redis.call('PERSIST', KEYS[1])
  redis.call('SADD', KEYS[2], ARGV[4])
  return {'reclaimed', string.format('%.0f', epoch)}
end
local from_prev = false
if owner ~= '' then
  for i = 6, #ARGV do
    if ARGV[i] == owner then from_prev = true end
  end
end
if owner ~= '' and not from_prev and redis.call('EXISTS', ARGV[3] .. owner) == 1 then
  return {'duplicate'}
end
if not from_prev then
  local dropped = tonumber(redis.call('GET', KEYS[4]) or '0')
  epoch = math.max(epoch + 1, tonumber(ARGV[2]), dropped + 1)
end
local e = string.format('%.0f', epoch)
if owner ~= '' then redis.call('SREM', ARGV[5] .. owner, ARGV[4]) end
redis.call('HSET', KEYS[1], 's', ARGV[1], 'e', e)
redis.call('PERSIST', KEYS[1])
redis.call('SADD', KEYS[2], ARGV[4])
redis.call('SADD', KEYS[3], ARGV[4])
return {'reclaimed', e}
"#;

// KEYS: placement row, the session's owner index, the unsettled set, the
// dropped mark. ARGV: sid, epoch ('' = any), row grace ms, row name.
// A settled row keeps its epoch for the grace; one never settled is
// dropped now and its epoch raises the mark, which every claim mints above.
const RELEASE: &str = r#"
local v = redis.call('HMGET', KEYS[1], 's', 'e', 'ok')
if v[1] ~= ARGV[1] then return 0 end
if ARGV[2] ~= '' and v[2] ~= ARGV[2] then return 0 end
redis.call('SREM', KEYS[2], ARGV[4])
redis.call('SREM', KEYS[3], ARGV[4])
if v[3] == v[1] .. '@' .. v[2] then
  redis.call('HSET', KEYS[1], 's', '')
  redis.call('HDEL', KEYS[1], 't')
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
redis.call('DEL', KEYS[1])
local e = tonumber(v[2])
if e > tonumber(redis.call('GET', KEYS[4]) or '0') then
  redis.call('SET', KEYS[4], string.format('%.0f', e))
end
return 1
"#;

// KEYS: placement row. ARGV: worker prefix. Owner, epoch, tag, live,
// settled of one row.
const ROW: &str = r#"
local v = redis.call('HMGET', KEYS[1], 's', 'e', 't', 'ok')
if not v[1] or v[1] == '' then return false end
local live = redis.call('EXISTS', ARGV[1] .. v[1])
local settled = (v[4] == v[1] .. '@' .. v[2]) and 1 or 0
return {v[1], v[2], v[3] or '', live, settled}
"#;

const TAG: &str = r#"
local owner = redis.call('HGET', KEYS[1], 's')
if owner ~= ARGV[1] then return 0 end
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'e') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 't', ARGV[3])
return 1
"#;

// KEYS: message list. ARGV: acked msgIds. Returns the remaining list.
const ACKS: &str = r#"
if #ARGV > 0 then
  local acked = {}
  for _, a in ipairs(ARGV) do acked[a] = true end
  for _, raw in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
    local ok, m = pcall(cjson.decode, raw)
    if ok and type(m) == 'table' and acked[m['msgId']] then
      redis.call('LREM', KEYS[1], 1, raw)
    end
  end
end
return redis.call('LRANGE', KEYS[1], 0, -1)
"#;

// KEYS: workers set, dead set. ARGV: owner index prefix, row prefix,
// worker prefix. Rows of every listed or dead session, from the owner
// indexes (rows no index names are not listed).
const PLACEMENTS: &str = r#"
local out = {}
local function rows_of(sid)
  for _, name in ipairs(redis.call('SMEMBERS', ARGV[1] .. sid)) do
    local v = redis.call('HMGET', ARGV[2] .. name, 's', 'e', 't', 'ok')
    if v[1] == sid then
      local live = redis.call('EXISTS', ARGV[3] .. sid)
      local settled = (v[4] == sid .. '@' .. v[2]) and 1 or 0
      table.insert(out, {name, v[1], v[2], v[3] or '', live, settled})
    end
  end
end
for _, sid in ipairs(redis.call('SMEMBERS', KEYS[1])) do rows_of(sid) end
for _, sid in ipairs(redis.call('SMEMBERS', KEYS[2])) do rows_of(sid) end
return out
"#;

// KEYS: workers set, dead set, orphan set, unsettled set. ARGV: worker
// prefix, owner index prefix, row prefix, row grace ms, budget, message
// list prefix. Moves
// lapsed sessions to `dead`, then hands up to `budget` rows of dead
// sessions their grace, remembering them as orphans for the sweeper (and
// drops their message lists). Returns rows handled.
const EXPIRE_ROWS: &str = r#"
for _, sid in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('EXISTS', ARGV[1] .. sid) == 0 then
    redis.call('SREM', KEYS[1], sid)
    redis.call('SADD', KEYS[2], sid)
  end
end
local budget = tonumber(ARGV[5])
local done = 0
for _, sid in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if done >= budget then break end
  local index = ARGV[2] .. sid
  redis.call('DEL', ARGV[6] .. sid)
  for _, name in ipairs(redis.call('SPOP', index, budget - done)) do
    local row = ARGV[3] .. name
    if redis.call('HGET', row, 's') == sid then
      redis.call('PEXPIRE', row, ARGV[4])
      redis.call('SADD', KEYS[3], name)
    end
    done = done + 1
  end
  if redis.call('EXISTS', index) == 0 then redis.call('SREM', KEYS[2], sid) end
end
-- Drop up to `budget` entries of the orphan and unsettled sets whose row
-- is gone, released or moved on (the sweeper drops them too, if one runs).
for _, name in ipairs(redis.call('SRANDMEMBER', KEYS[3], budget)) do
  local s = redis.call('HGET', ARGV[3] .. name, 's')
  if not s or s == '' or redis.call('EXISTS', ARGV[1] .. s) == 1 then
    redis.call('SREM', KEYS[3], name)
  end
end
for _, name in ipairs(redis.call('SRANDMEMBER', KEYS[4], budget)) do
  local v = redis.call('HMGET', ARGV[3] .. name, 's', 'e', 'ok')
  if not v[1] or v[1] == '' or v[3] == v[1] .. '@' .. v[2] then
    redis.call('SREM', KEYS[4], name)
  end
end
return done
"#;

// KEYS: workers set, dead set, unsettled set, orphan set. ARGV: worker
// prefix, owner index prefix, row prefix, limit. Up to `limit` row names
// that need a wake: rows of lapsed or dead sessions (from their owner
// indexes), orphans whose index entry upkeep already took, and unsettled
// rows. Entries of the last two sets that no longer need one are dropped.
const WAKE: &str = r#"
local out, seen = {}, {}
local limit = tonumber(ARGV[4])
local function add(name)
  if not seen[name] and #out < limit then
    seen[name] = true
    table.insert(out, name)
  end
end
local function orphans_of(sid)
  for _, name in ipairs(redis.call('SMEMBERS', ARGV[2] .. sid)) do
    if #out >= limit then return end
    if redis.call('HGET', ARGV[3] .. name, 's') == sid then add(name) end
  end
end
for _, sid in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if #out >= limit then break end
  if redis.call('EXISTS', ARGV[1] .. sid) == 0 then orphans_of(sid) end
end
for _, sid in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if #out >= limit then break end
  orphans_of(sid)
end
for _, name in ipairs(redis.call('SMEMBERS', KEYS[4])) do
  local s = redis.call('HGET', ARGV[3] .. name, 's')
  if not s or s == '' or redis.call('EXISTS', ARGV[1] .. s) == 1 then
    redis.call('SREM', KEYS[4], name)
  else
    add(name)
  end
end
for _, name in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  local v = redis.call('HMGET', ARGV[3] .. name, 's', 'e', 'ok')
  if not v[1] or v[1] == '' or v[3] == v[1] .. '@' .. v[2] then
    redis.call('SREM', KEYS[3], name)
  else
    add(name)
  end
end
return out
"#;

// KEYS: generation key. ARGV: proposal. Returns the generation held.
const OPEN_GENERATION: &str = r#"
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
"#;

// KEYS: lease key. ARGV: token, ttl ms. Compare-and-set renewal.
const LEASE_RENEW: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"#;

// KEYS: lease key. ARGV: token. Compare-and-delete.
const LEASE_RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"#;

impl RedisStore {
    /// Connect to `url` (e.g. `redis://127.0.0.1:6379/0`), keys under
    /// `prefix`, batching claims and settles by [`Batching::default`].
    ///
    /// # Errors
    ///
    /// When the URL is invalid or the first connection fails.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, prefix, Batching::default()).await
    }

    /// As [`connect`](Self::connect), batching by `batching`. Starts the
    /// batcher's task on the current Tokio runtime.
    ///
    /// Every call of the store (connecting included) waits for Redis at
    /// most `batching.deadline`.
    ///
    /// # Errors
    ///
    /// When the URL is invalid or the first connection fails
    /// ([`StoreError::Timeout`] when it does not complete within the deadline).
    pub async fn connect_with(
        url: &str,
        prefix: &str,
        batching: Batching,
    ) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        // A reconnect attempt gets the deadline too, so a Redis that
        // accepts but never answers cannot hold the manager's reconnect.
        let config = ConnectionManagerConfig::new().set_connection_timeout(batching.deadline);
        let conn = tokio::time::timeout(
            batching.deadline,
            ConnectionManager::new_with_config(client, config),
        )
        .await
        .map_err(|_| StoreError::Timeout(batching.deadline))??;
        Ok(Self::over(RedisConn::Single(conn), prefix, batching))
    }

    /// A store over `conn` (one Redis, or one hash tag of a cluster: every
    /// key it touches starts with `prefix`), batching by `batching`.
    /// Starts the batcher's task on the current Tokio runtime.
    pub(super) fn over(conn: RedisConn, prefix: &str, batching: Batching) -> Self {
        let key = |kind: &str| format!("{prefix}{kind}");
        let layout = Layout {
            generation: key("gen"),
            unsettled: key("unsettled"),
            dropped: key("dropped"),
            workers: key("w:"),
            owners: key("o:"),
            rows: key("p:"),
        };
        Self {
            batcher: Arc::new(Batcher::start(conn.clone(), layout, batching)),
            conn,
            prefix: prefix.to_owned(),
            scripts: Arc::new(Scripts {
                admit: Script::new(ADMIT),
                renew: Script::new(RENEW),
                drain: Script::new(DRAIN),
                get: Script::new(GET),
                list: Script::new(LIST),
                reclaim: Script::new(RECLAIM),
                release: Script::new(RELEASE),
                tag: Script::new(TAG),
                row: Script::new(ROW),
                wake: Script::new(WAKE),
                acks: Script::new(ACKS),
                placements: Script::new(PLACEMENTS),
                lease_renew: Script::new(LEASE_RENEW),
                lease_release: Script::new(LEASE_RELEASE),
                expire_rows: Script::new(EXPIRE_ROWS),
                open_generation: Script::new(OPEN_GENERATION),
            }),
            row_grace_ms: 60_000,
            deadline: batching.deadline,
        }
    }

    /// What the claim batcher did so far.
    pub fn batch_stats(&self) -> BatchStats {
        self.batcher.stats()
    }

    /// Keep vacated rows for `ms` before Redis drops them (default one minute).
    #[must_use]
    pub fn with_row_grace(mut self, ms: u64) -> Self {
        self.row_grace_ms = ms.max(1);
        self
    }

    /// Sends `request` (a command, pipeline or script call) and decodes its
    /// answer, within the store's deadline: every call of the store but the
    /// batched ones (which keep their own) goes through here, so none waits
    /// on a frozen Redis for ever.
    ///
    /// Cancel safe as a single command is: a lapsed request may still run.
    async fn send<T: FromRedisValue + Send>(
        &self,
        request: &impl Request,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.deadline, request.run(&mut conn)).await {
            Ok(answer) => Ok(answer?),
            Err(_) => Err(StoreError::Timeout(self.deadline)),
        }
    }

    fn key(&self, kind: &str, rest: &str) -> String {
        let mut k = String::with_capacity(self.prefix.len() + kind.len() + rest.len());
        k.push_str(&self.prefix);
        k.push_str(kind);
        k.push_str(rest);
        k
    }

    fn row_name(ns: &str, id: &str) -> String {
        let mut k = String::with_capacity(ns.len() + id.len() + 1);
        k.push_str(ns);
        k.push('/');
        k.push_str(id);
        k
    }
}

/// What [`RedisStore::send`] sends: the three request shapes of `redis`.
trait Request: Sync {
    fn run<T: FromRedisValue + Send>(
        &self,
        conn: &mut RedisConn,
    ) -> impl Future<Output = RedisResult<T>> + Send;
}

impl Request for Cmd {
    fn run<T: FromRedisValue + Send>(
        &self,
        conn: &mut RedisConn,
    ) -> impl Future<Output = RedisResult<T>> + Send {
        self.query_async(conn)
    }
}

impl Request for Pipeline {
    fn run<T: FromRedisValue + Send>(
        &self,
        conn: &mut RedisConn,
    ) -> impl Future<Output = RedisResult<T>> + Send {
        self.query_async(conn)
    }
}

impl Request for ScriptInvocation<'_> {
    fn run<T: FromRedisValue + Send>(
        &self,
        conn: &mut RedisConn,
    ) -> impl Future<Output = RedisResult<T>> + Send {
        // EVALSHA, loading the script first when Redis lacks it.
        self.invoke_async(conn)
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

fn items(v: Value) -> Vec<Value> {
    match v {
        Value::Array(a) => a,
        _ => Vec::new(),
    }
}

/// Decode `{rec, headroom, draining, drain, pttl, retire?}`.
fn decode_worker(v: Value) -> Result<Option<LiveWorker>, StoreError> {
    let parts = items(v);
    if parts.len() < 5 {
        return Ok(None);
    }
    let raw = text(&parts[0]).ok_or_else(|| StoreError::Corrupt("worker rec".into()))?;
    let mut record: WorkerRecord =
        serde_json::from_str(&raw).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    if let Some(h) = text(&parts[1]).and_then(|h| h.parse().ok()) {
        record.headroom = h;
    }
    record.draining = text(&parts[2]).as_deref() == Some("1");
    record.server_drain = text(&parts[3]).and_then(|field| decode_drain(&field));
    let ttl: i64 = text(&parts[4]).and_then(|t| t.parse().ok()).unwrap_or(0);
    record.retire_at_wall_ms = parts.get(5).and_then(text).and_then(|r| r.parse().ok());
    Ok(Some(LiveWorker {
        record,
        expires_in_ms: ttl.max(0) as u64,
    }))
}

/// The `drain` field: empty (none), `-` (no deadline), `+<ms>` (a
/// deadline not yet delivered), else the deadline in wall ms.
fn drain_field(drain: Option<DrainDeadline>) -> String {
    match drain {
        None => String::new(),
        Some(DrainDeadline::Never) => "-".into(),
        Some(DrainDeadline::AfterDelivery(ms)) => format!("+{ms}"),
        Some(DrainDeadline::At(ms)) => ms.to_string(),
    }
}

/// Reads a [`drain_field`]; a deadline that does not parse is read as no
/// deadline (the drain itself stays).
fn decode_drain(field: &str) -> Option<DrainDeadline> {
    if field.is_empty() {
        return None;
    }
    Some(match field.strip_prefix('+') {
        Some(after) => after
            .parse()
            .map_or(DrainDeadline::Never, DrainDeadline::AfterDelivery),
        None => field
            .parse()
            .map_or(DrainDeadline::Never, DrainDeadline::At),
    })
}

/// A claim's answer: the new epoch when `candidate` claimed a row nobody
/// had, `{'moved', epoch, previous owner}` when it claimed one another
/// session owned, else `{kind, owner?, epoch?}` or `{'generation', held}`.
fn decode_claim(v: Value, candidate: Option<&str>) -> Result<ClaimOutcome, StoreError> {
    let claimed = |epoch: Option<u64>, from: Option<String>| {
        let (Some(session), Some(epoch)) = (candidate, epoch) else {
            return Err(StoreError::Corrupt(format!(
                "claim answered {epoch:?} for {candidate:?}"
            )));
        };
        Ok(ClaimOutcome::Claimed(
            Placement {
                session_id: session.to_owned(),
                epoch,
            },
            from,
        ))
    };
    if let Value::Int(epoch) = v {
        return claimed(u64::try_from(epoch).ok(), None);
    }
    let parts = items(v);
    let kind = parts.first().and_then(text).unwrap_or_default();
    if kind == "moved" {
        let epoch = parts.get(1).and_then(text).and_then(|e| e.parse().ok());
        return claimed(epoch, parts.get(2).and_then(text));
    }
    let placement = || -> Result<Placement, StoreError> {
        Ok(Placement {
            session_id: parts.get(1).and_then(text).unwrap_or_default(),
            epoch: epoch_of(parts.get(2))?,
        })
    };
    Ok(match kind.as_str() {
        "owned" => ClaimOutcome::Owned(placement()?),
        "vacant" => ClaimOutcome::Vacant,
        "gone" => ClaimOutcome::CandidateGone,
        "generation" => ClaimOutcome::GenerationLost(
            parts
                .get(1)
                .and_then(text)
                .filter(|g| !g.is_empty())
                .map(Generation),
        ),
        other => return Err(StoreError::Corrupt(format!("claim answered {other:?}"))),
    })
}

fn epoch_of(v: Option<&Value>) -> Result<u64, StoreError> {
    v.and_then(text)
        .and_then(|e| e.parse().ok())
        .ok_or_else(|| StoreError::Corrupt("placement epoch".into()))
}

impl PlacementStore for RedisStore {
    async fn deployment_version(&self) -> Result<u64, StoreError> {
        let held: Option<String> = self
            .send(redis::cmd("GET").arg(self.key("deployments", "")))
            .await?;
        held.map_or(Ok(0), |v| {
            v.parse()
                .map_err(|_| StoreError::Corrupt(format!("deployment version {v:?}")))
        })
    }

    async fn admit_worker(&self, admission: &Admission<'_>, _now: Now) -> Result<bool, StoreError> {
        let record = admission.record;
        let sid = record.session_id.as_str();
        let rec = serde_json::to_string(record).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let retire = record
            .retire_at_wall_ms
            .map_or_else(String::new, |ms| ms.to_string());
        let mut call = self.scripts.admit.prepare_invoke();
        call.key(self.key("deployments", ""))
            .key(self.key("w:", sid))
            .key(self.key("workers", ""))
            .key(self.key("dead", ""))
            .key(self.key("m:", sid))
            .arg(
                admission
                    .expected_version
                    .map_or_else(String::new, |v| v.to_string()),
            )
            .arg(sid)
            .arg(rec)
            .arg(record.headroom)
            .arg(if record.draining { "1" } else { "0" })
            .arg(drain_field(record.server_drain))
            .arg(retire)
            .arg(admission.ttl_ms)
            .arg(self.key("w:", ""))
            .arg(self.key("m:", ""))
            .arg(self.key("sup:", ""))
            .arg(admission.superseded_ttl_ms.max(1))
            .arg(if admission.moves_deployments() {
                "1"
            } else {
                "0"
            })
            .arg(admission.supersede.len());
        for (session, reason) in admission.supersede {
            call.arg(session).arg(reason);
        }
        for (session, deadline_wall_ms) in admission.wind_down {
            call.arg(session).arg(*deadline_wall_ms);
        }
        let admitted: i64 = self.send(&call).await?;
        Ok(admitted == 1)
    }

    async fn put_worker(
        &self,
        record: &WorkerRecord,
        ttl_ms: u64,
        _now: Now,
    ) -> Result<(), StoreError> {
        let key = self.key("w:", &record.session_id);
        let rec = serde_json::to_string(record).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let retire = record
            .retire_at_wall_ms
            .map_or_else(String::new, |ms| ms.to_string());
        let mut put = redis::pipe();
        put.atomic()
            .del(&key)
            .hset_multiple(
                &key,
                &[
                    ("rec", rec.as_str()),
                    ("headroom", &record.headroom.to_string()),
                    ("draining", if record.draining { "1" } else { "0" }),
                    ("drain", &drain_field(record.server_drain)),
                    ("retire", &retire),
                ],
            )
            .pexpire(&key, ttl_ms as i64)
            .sadd(self.key("workers", ""), &record.session_id)
            .del(self.key("m:", &record.session_id));
        self.send::<()>(&put).await
    }

    async fn renew_worker(
        &self,
        session_id: &str,
        headroom: i64,
        draining: bool,
        ttl_ms: u64,
        now: Now,
    ) -> Result<Option<WorkerRecord>, StoreError> {
        let v: Value = self
            .send(
                self.scripts
                    .renew
                    .key(self.key("w:", session_id))
                    .key(self.key("m:", session_id))
                    .arg(headroom)
                    .arg(if draining { "1" } else { "0" })
                    .arg(ttl_ms)
                    .arg(now.wall_ms),
            )
            .await?;
        Ok(decode_worker(v)?.map(|w| w.record))
    }

    async fn set_server_drain(
        &self,
        session_id: &str,
        drain: Option<DrainDeadline>,
        _now: Now,
    ) -> Result<bool, StoreError> {
        let n: i64 = self
            .send(
                self.scripts
                    .drain
                    .key(self.key("w:", session_id))
                    .arg(drain_field(drain)),
            )
            .await?;
        Ok(n == 1)
    }

    async fn get_worker(
        &self,
        session_id: &str,
        _now: Now,
    ) -> Result<Option<LiveWorker>, StoreError> {
        let v: Value = self
            .send(&self.scripts.get.key(self.key("w:", session_id)))
            .await?;
        decode_worker(v)
    }

    async fn remove_worker(&self, session_id: &str) -> Result<bool, StoreError> {
        let (n, _, _, _): (i64, i64, i64, i64) = self
            .send(
                redis::pipe()
                    .atomic()
                    .del(self.key("w:", session_id))
                    .srem(self.key("workers", ""), session_id)
                    .del(self.key("m:", session_id))
                    .sadd(self.key("dead", ""), session_id),
            )
            .await?;
        Ok(n == 1)
    }

    async fn list_workers(&self, _now: Now) -> Result<Vec<LiveWorker>, StoreError> {
        let v: Value = self
            .send(
                self.scripts
                    .list
                    .key(self.key("workers", ""))
                    .key(self.key("dead", ""))
                    .arg(self.key("w:", "")),
            )
            .await?;
        let mut out = Vec::new();
        for row in items(v) {
            if let Some(w) = decode_worker(row)? {
                out.push(w);
            }
        }
        out.sort_by(|a, b| a.record.session_id.cmp(&b.record.session_id));
        Ok(out)
    }

    async fn bind_hostname(&self, hostname: &str, now: Now) -> Result<(), StoreError> {
        let key = self.key("hostnames", "");
        // Keep the newest MAX_BOUND_HOSTNAMES: drop ranks 0 ..= len - MAX - 1.
        let keep = isize::try_from(MAX_BOUND_HOSTNAMES).unwrap_or(isize::MAX - 1);
        self.send::<()>(
            redis::pipe()
                .atomic()
                .zadd(&key, hostname.to_ascii_lowercase(), now.wall_ms)
                .ignore()
                .zremrangebyrank(&key, 0, -(keep + 1))
                .ignore(),
        )
        .await
    }

    async fn bound_hostnames(&self) -> Result<Vec<String>, StoreError> {
        self.send(
            redis::cmd("ZRANGE")
                .arg(self.key("hostnames", ""))
                .arg(0)
                .arg(-1),
        )
        .await
    }

    async fn mark_superseded(
        &self,
        session_id: &str,
        error: &str,
        ttl_ms: u64,
        _now: Now,
    ) -> Result<(), StoreError> {
        self.send::<()>(
            redis::cmd("SET")
                .arg(self.key("sup:", session_id))
                .arg(error)
                .arg("PX")
                .arg(ttl_ms.max(1)),
        )
        .await?;
        Ok(())
    }

    async fn superseded(&self, session_id: &str, _now: Now) -> Result<Option<String>, StoreError> {
        self.send(redis::cmd("GET").arg(self.key("sup:", session_id)))
            .await
    }

    async fn push_message(
        &self,
        session_id: &str,
        mut message: ControlMessage,
    ) -> Result<String, StoreError> {
        let n: u64 = self
            .send(redis::cmd("INCR").arg(self.key("mseq", "")))
            .await?;
        let msg_id = n.to_string();
        message.msg_id = Some(msg_id.clone());
        let raw =
            serde_json::to_string(&message).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        self.send::<()>(redis::cmd("RPUSH").arg(self.key("m:", session_id)).arg(raw))
            .await?;
        Ok(msg_id)
    }

    async fn pending_messages(
        &self,
        session_id: &str,
        acks: &[String],
    ) -> Result<Vec<ControlMessage>, StoreError> {
        let mut inv = self.scripts.acks.key(self.key("m:", session_id));
        for a in acks {
            inv.arg(a);
        }
        let raw: Vec<String> = self.send(&inv).await?;
        Ok(raw
            .iter()
            .filter_map(|r| serde_json::from_str(r).ok())
            .collect())
    }

    async fn resolve_or_claim(
        &self,
        instance: InstanceKey<'_>,
        candidate: Option<&str>,
        stale: Option<(&str, u64)>,
        floor: u64,
        generation: &Generation,
        _now: Now,
    ) -> Result<ClaimOutcome, StoreError> {
        let InstanceKey { ns, id } = instance;
        let v = self
            .batcher
            .call(Op::Claim {
                name: Self::row_name(ns, id),
                candidate: candidate.map(str::to_owned),
                floor,
                stale: stale.map(|(sid, epoch)| (sid.to_owned(), epoch)),
                generation: generation.0.clone(),
            })
            .await?;
        decode_claim(v, candidate)
    }

    async fn reclaim(
        &self,
        instance: InstanceKey<'_>,
        session_id: &str,
        prev_sessions: &[&str],
        floor: u64,
        _now: Now,
    ) -> Result<ReclaimOutcome, StoreError> {
        let InstanceKey { ns, id } = instance;
        let name = Self::row_name(ns, id);
        let mut call = self.scripts.reclaim.prepare_invoke();
        call.key(self.key("p:", &name))
            .key(self.key("o:", session_id))
            .key(self.key("unsettled", ""))
            .key(self.key("dropped", ""))
            .arg(session_id)
            .arg(floor)
            .arg(self.key("w:", ""))
            .arg(&name)
            .arg(self.key("o:", ""));
        for prev in prev_sessions {
            call.arg(*prev);
        }
        let v: Value = self.send(&call).await?;
        let parts = items(v);
        match parts.first().and_then(text).as_deref() {
            Some("reclaimed") => Ok(ReclaimOutcome::Reclaimed(Placement {
                session_id: session_id.to_owned(),
                epoch: epoch_of(parts.get(1))?,
            })),
            Some("duplicate") => Ok(ReclaimOutcome::Duplicate),
            other => Err(StoreError::Corrupt(format!("reclaim answered {other:?}"))),
        }
    }

    async fn release(
        &self,
        instance: InstanceKey<'_>,
        session_id: &str,
        epoch: Option<u64>,
    ) -> Result<bool, StoreError> {
        let InstanceKey { ns, id } = instance;
        let name = Self::row_name(ns, id);
        let n: i64 = self
            .send(
                self.scripts
                    .release
                    .key(self.key("p:", &name))
                    .key(self.key("o:", session_id))
                    .key(self.key("unsettled", ""))
                    .key(self.key("dropped", ""))
                    .arg(session_id)
                    .arg(epoch.map(|e| e.to_string()).unwrap_or_default())
                    .arg(self.row_grace_ms)
                    .arg(&name),
            )
            .await?;
        Ok(n == 1)
    }

    async fn tag(
        &self,
        instance: InstanceKey<'_>,
        session_id: &str,
        epoch: Option<u64>,
        tag: &str,
    ) -> Result<bool, StoreError> {
        let InstanceKey { ns, id } = instance;
        let n: i64 = self
            .send(
                self.scripts
                    .tag
                    .key(self.key("p:", &Self::row_name(ns, id)))
                    .arg(session_id)
                    .arg(epoch.map(|e| e.to_string()).unwrap_or_default())
                    .arg(tag),
            )
            .await?;
        Ok(n == 1)
    }

    async fn settle(
        &self,
        instance: InstanceKey<'_>,
        session_id: &str,
        epoch: u64,
    ) -> Result<bool, StoreError> {
        let InstanceKey { ns, id } = instance;
        let v = self
            .batcher
            .call(Op::Settle {
                name: Self::row_name(ns, id),
                session: session_id.to_owned(),
                epoch,
            })
            .await?;
        match v {
            Value::Int(n) => Ok(n == 1),
            other => Err(StoreError::Corrupt(format!("settle answered {other:?}"))),
        }
    }

    async fn placement(
        &self,
        instance: InstanceKey<'_>,
        _now: Now,
    ) -> Result<Option<PlacementEntry>, StoreError> {
        let InstanceKey { ns, id } = instance;
        let name = Self::row_name(ns, id);
        let v: Value = self
            .send(
                self.scripts
                    .row
                    .key(self.key("p:", &name))
                    .arg(self.key("w:", "")),
            )
            .await?;
        if matches!(v, Value::Nil) {
            return Ok(None);
        }
        let p = items(v);
        let tag = p.get(2).and_then(text).filter(|t| !t.is_empty());
        Ok(Some(PlacementEntry {
            ns: ns.to_owned(),
            id: id.to_owned(),
            placement: Placement {
                session_id: p.first().and_then(text).unwrap_or_default(),
                epoch: epoch_of(p.get(1))?,
            },
            tag,
            live: p.get(3).and_then(text).as_deref() == Some("1"),
            settled: p.get(4).and_then(text).as_deref() == Some("1"),
        }))
    }

    async fn wake_candidates(
        &self,
        limit: usize,
        _now: Now,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let v: Value = self
            .send(
                self.scripts
                    .wake
                    .key(self.key("workers", ""))
                    .key(self.key("dead", ""))
                    .key(self.key("unsettled", ""))
                    .key(self.key("orphans", ""))
                    .arg(self.key("w:", ""))
                    .arg(self.key("o:", ""))
                    .arg(self.key("p:", ""))
                    .arg(limit),
            )
            .await?;
        let mut out: Vec<(String, String)> = items(v)
            .iter()
            .filter_map(text)
            .filter_map(|name| {
                let cut = name.rfind('/').filter(|c| *c > 0)?;
                Some((name[..cut].to_owned(), name[cut + 1..].to_owned()))
            })
            .collect();
        out.sort();
        Ok(out)
    }

    async fn list_placements(&self, _now: Now) -> Result<Vec<PlacementEntry>, StoreError> {
        let v: Value = self
            .send(
                self.scripts
                    .placements
                    .key(self.key("workers", ""))
                    .key(self.key("dead", ""))
                    .arg(self.key("o:", ""))
                    .arg(self.key("p:", ""))
                    .arg(self.key("w:", "")),
            )
            .await?;
        let mut out = Vec::new();
        for row in items(v) {
            let p = items(row);
            let name = p.first().and_then(text).unwrap_or_default();
            // `<ns>/<id>` where ns starts with '/' and id has no '/'.
            let Some(cut) = name.rfind('/').filter(|c| *c > 0) else {
                continue;
            };
            let tag = p.get(3).and_then(text).filter(|t| !t.is_empty());
            out.push(PlacementEntry {
                ns: name[..cut].to_owned(),
                id: name[cut + 1..].to_owned(),
                placement: Placement {
                    session_id: p.get(1).and_then(text).unwrap_or_default(),
                    epoch: epoch_of(p.get(2))?,
                },
                tag,
                live: p.get(4).and_then(text).as_deref() == Some("1"),
                settled: p.get(5).and_then(text).as_deref() == Some("1"),
            });
        }
        out.sort_by(|a, b| (&a.ns, &a.id).cmp(&(&b.ns, &b.id)));
        Ok(out)
    }

    async fn open_generation(&self, proposal: &Generation) -> Result<Generation, StoreError> {
        let held: String = self
            .send(
                self.scripts
                    .open_generation
                    .key(self.key("gen", ""))
                    .arg(&proposal.0),
            )
            .await?;
        Ok(Generation(held))
    }

    async fn generation(&self) -> Result<Option<Generation>, StoreError> {
        let held: Option<String> = self
            .send(redis::cmd("GET").arg(self.key("gen", "")))
            .await?;
        Ok(held.map(Generation))
    }

    async fn expire_placements(&self, budget: usize, _now: Now) -> Result<usize, StoreError> {
        let n: i64 = self
            .send(
                self.scripts
                    .expire_rows
                    .key(self.key("workers", ""))
                    .key(self.key("dead", ""))
                    .key(self.key("orphans", ""))
                    .key(self.key("unsettled", ""))
                    .arg(self.key("w:", ""))
                    .arg(self.key("o:", ""))
                    .arg(self.key("p:", ""))
                    .arg(self.row_grace_ms)
                    .arg(budget.max(1))
                    .arg(self.key("m:", "")),
            )
            .await?;
        Ok(n.max(0) as usize)
    }

    async fn acquire_sweeper_lease(
        &self,
        token: &str,
        ttl_ms: u64,
        _now: Now,
    ) -> Result<bool, StoreError> {
        let set: Option<String> = self
            .send(
                redis::cmd("SET")
                    .arg(self.key("sweeper", ""))
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms.max(1)),
            )
            .await?;
        Ok(set.is_some())
    }

    async fn renew_sweeper_lease(
        &self,
        token: &str,
        ttl_ms: u64,
        _now: Now,
    ) -> Result<bool, StoreError> {
        let n: i64 = self
            .send(
                self.scripts
                    .lease_renew
                    .key(self.key("sweeper", ""))
                    .arg(token)
                    .arg(ttl_ms.max(1)),
            )
            .await?;
        Ok(n == 1)
    }

    async fn release_sweeper_lease(&self, token: &str) -> Result<bool, StoreError> {
        let n: i64 = self
            .send(
                self.scripts
                    .lease_release
                    .key(self.key("sweeper", ""))
                    .arg(token),
            )
            .await?;
        Ok(n == 1)
    }
}
