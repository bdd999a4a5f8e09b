//! The Redis placement store: any number of pinboard nodes share one Redis
//! and behave as one.
//!
//! Owns the key layout and the Lua scripts; never holds state of its own
//! beyond the connection (a `ConnectionManager`: one multiplexed connection,
//! reconnecting on failure). Every claim, release and reclaim is one Lua
//! script, so it is atomic and costs one round trip.
//!
//! # Key layout (inferred; all under a configurable prefix `P`, default `pinboard:`)
//!
//! | key | type | content |
//! | --- | --- | --- |
//! | `P w:<session>` | hash, `PX` = lease TTL | `rec` (static worker JSON), `headroom`, `draining` (`0`/`1`), `drain` (operator drain: empty = none, `-` = no deadline, else wall ms) |
//! | `P workers` | set | session ids; members whose hash expired are pruned while listing |
//! | `P m:<session>` | list | queued control messages (JSON with `msgId`), oldest first |
//! | `P mseq` | string | `INCR` counter for `msgId`s |
//! | `P sup:<session>` | string, `PX` | the supersession reason |
//! | `P b:<hostname>` | string | hostname binding JSON |
//! | `P p:<ns>/<id>` | hash, no TTL | `s` owner session (empty when released), `e` epoch, `t` tag |
//! | `P placements` | set | `<ns>/<id>` of every placement row, for the overview |
//! | `P sweeper` | string, `PX` = sweeper lease TTL | token of the node holding the sweeper lease |
//!
//! Worker secrets are stored in `rec` (every node must mint attestations
//! for every worker): protect the Redis like the deployment token.
//! Known limit: placement rows and the `placements` set are never trimmed
//! (one small hash per id ever placed); a later sweeper can prune rows
//! whose owner is gone.
//!
//! A placement is live while `P w:<s>` exists. Rows are never deleted by the
//! data path, so the per-id epoch survives a release; a wiped Redis falls back
//! to the wall-clock epoch floor.

use pinned_wire::registry::ControlMessage;
use redis::aio::ConnectionManager;
use redis::{Script, Value};

use super::{
    Binding, ClaimOutcome, LiveWorker, Placement, PlacementEntry, PlacementStore, ReclaimOutcome,
    StoreError, WorkerRecord,
};
use crate::clock::Now;

/// Placement store shared through Redis.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: String,
    scripts: std::sync::Arc<Scripts>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish()
    }
}

struct Scripts {
    renew: Script,
    drain: Script,
    get: Script,
    list: Script,
    claim: Script,
    reclaim: Script,
    release: Script,
    tag: Script,
    acks: Script,
    placements: Script,
    lease_renew: Script,
    lease_release: Script,
}

// Lua numbers are doubles: epochs (< 2^53) are formatted with %.0f so they
// never come back in exponent notation.
const GET: &str = r#"
local v = redis.call('HMGET', KEYS[1], 'rec', 'headroom', 'draining', 'drain')
if not v[1] then return false end
return {v[1], v[2], v[3], v[4], tostring(redis.call('PTTL', KEYS[1]))}
"#;

const RENEW: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSET', KEYS[1], 'headroom', ARGV[1], 'draining', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
local v = redis.call('HMGET', KEYS[1], 'rec', 'headroom', 'draining', 'drain')
return {v[1], v[2], v[3], v[4], ARGV[3]}
"#;

const DRAIN: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'drain', ARGV[1])
return 1
"#;

const LIST: &str = r#"
local out = {}
for _, sid in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local key = ARGV[1] .. sid
  local v = redis.call('HMGET', key, 'rec', 'headroom', 'draining', 'drain')
  if v[1] then
    table.insert(out, {v[1], v[2], v[3], v[4], tostring(redis.call('PTTL', key))})
  else
    redis.call('SREM', KEYS[1], sid)
  end
end
return out
"#;

// KEYS: placement row, candidate worker key (or ''), placements set.
// ARGV: candidate sid ('' = none), floor, stale sid, stale epoch, worker prefix, row name.
const CLAIM: &str = r#"
local owner = redis.call('HGET', KEYS[1], 's') or ''
local epoch = tonumber(redis.call('HGET', KEYS[1], 'e') or '0')
local stale = owner == ARGV[3] and string.format('%.0f', epoch) == ARGV[4]
if owner ~= '' and not stale and redis.call('EXISTS', ARGV[5] .. owner) == 1 then
  return {'owned', owner, string.format('%.0f', epoch)}
end
if ARGV[1] == '' then return {'vacant'} end
if redis.call('EXISTS', KEYS[2]) == 0 then return {'gone'} end
local next = math.max(epoch + 1, tonumber(ARGV[2]))
local e = string.format('%.0f', next)
redis.call('HSET', KEYS[1], 's', ARGV[1], 'e', e)
redis.call('HDEL', KEYS[1], 't')
redis.call('SADD', KEYS[3], ARGV[6])
return {'claimed', ARGV[1], e}
"#;

// KEYS: placement row, placements set. ARGV: new sid, prev sid, floor, worker prefix, row name.
const RECLAIM: &str = r#"
local owner = redis.call('HGET', KEYS[1], 's') or ''
local epoch = tonumber(redis.call('HGET', KEYS[1], 'e') or '0')
if owner == ARGV[1] then return {'reclaimed', string.format('%.0f', epoch)} end
local from_prev = owner ~= '' and owner == ARGV[2]
if owner ~= '' and not from_prev and redis.call('EXISTS', ARGV[4] .. owner) == 1 then
  return {'duplicate'}
end
if not from_prev then epoch = math.max(epoch + 1, tonumber(ARGV[3])) end
local e = string.format('%.0f', epoch)
redis.call('HSET', KEYS[1], 's', ARGV[1], 'e', e)
redis.call('SADD', KEYS[2], ARGV[5])
return {'reclaimed', e}
"#;

// ARGV: sid, epoch ('' = any)
const RELEASE: &str = r#"
local owner = redis.call('HGET', KEYS[1], 's')
if owner ~= ARGV[1] then return 0 end
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'e') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 's', '')
redis.call('HDEL', KEYS[1], 't')
return 1
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

const PLACEMENTS: &str = r#"
local out = {}
for _, name in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local v = redis.call('HMGET', ARGV[1] .. name, 's', 'e', 't')
  if v[1] and v[1] ~= '' then
    local live = redis.call('EXISTS', ARGV[2] .. v[1])
    table.insert(out, {name, v[1], v[2], v[3] or '', live})
  end
end
return out
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
    /// Connect to `url` (e.g. `redis://127.0.0.1:6379/0`), keys under `prefix`.
    ///
    /// # Errors
    ///
    /// When the URL is invalid or the first connection fails.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        let conn = ConnectionManager::new(client).await?;
        Ok(Self {
            conn,
            prefix: prefix.to_owned(),
            scripts: std::sync::Arc::new(Scripts {
                renew: Script::new(RENEW),
                drain: Script::new(DRAIN),
                get: Script::new(GET),
                list: Script::new(LIST),
                claim: Script::new(CLAIM),
                reclaim: Script::new(RECLAIM),
                release: Script::new(RELEASE),
                tag: Script::new(TAG),
                acks: Script::new(ACKS),
                placements: Script::new(PLACEMENTS),
                lease_renew: Script::new(LEASE_RENEW),
                lease_release: Script::new(LEASE_RELEASE),
            }),
        })
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

/// Decode `{rec, headroom, draining, drain, pttl}`.
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
    record.server_drain = match text(&parts[3]).as_deref() {
        None | Some("") => None,
        Some("-") => Some(None),
        Some(ms) => Some(ms.parse().ok()),
    };
    let ttl: i64 = text(&parts[4]).and_then(|t| t.parse().ok()).unwrap_or(0);
    Ok(Some(LiveWorker {
        record,
        expires_in_ms: ttl.max(0) as u64,
    }))
}

fn drain_field(drain: Option<Option<u64>>) -> String {
    match drain {
        None => String::new(),
        Some(None) => "-".into(),
        Some(Some(ms)) => ms.to_string(),
    }
}

fn epoch_of(v: Option<&Value>) -> Result<u64, StoreError> {
    v.and_then(text)
        .and_then(|e| e.parse().ok())
        .ok_or_else(|| StoreError::Corrupt("placement epoch".into()))
}

impl PlacementStore for RedisStore {
    async fn put_worker(
        &self,
        record: &WorkerRecord,
        ttl_ms: u64,
        _now: Now,
    ) -> Result<(), StoreError> {
        let key = self.key("w:", &record.session_id);
        let rec = serde_json::to_string(record).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let mut conn = self.conn.clone();
        redis::pipe()
            .atomic()
            .del(&key)
            .hset_multiple(
                &key,
                &[
                    ("rec", rec.as_str()),
                    ("headroom", &record.headroom.to_string()),
                    ("draining", if record.draining { "1" } else { "0" }),
                    ("drain", &drain_field(record.server_drain)),
                ],
            )
            .pexpire(&key, ttl_ms as i64)
            .sadd(self.key("workers", ""), &record.session_id)
            .del(self.key("m:", &record.session_id))
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    async fn renew_worker(
        &self,
        session_id: &str,
        headroom: i64,
        draining: bool,
        ttl_ms: u64,
        _now: Now,
    ) -> Result<Option<WorkerRecord>, StoreError> {
        let mut conn = self.conn.clone();
        let v: Value = self
            .scripts
            .renew
            .key(self.key("w:", session_id))
            .key(self.key("m:", session_id))
            .arg(headroom)
            .arg(if draining { "1" } else { "0" })
            .arg(ttl_ms)
            .invoke_async(&mut conn)
            .await?;
        Ok(decode_worker(v)?.map(|w| w.record))
    }

    async fn set_server_drain(
        &self,
        session_id: &str,
        drain: Option<Option<u64>>,
        _now: Now,
    ) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let n: i64 = self
            .scripts
            .drain
            .key(self.key("w:", session_id))
            .arg(drain_field(drain))
            .invoke_async(&mut conn)
            .await?;
        Ok(n == 1)
    }

    async fn get_worker(
        &self,
        session_id: &str,
        _now: Now,
    ) -> Result<Option<LiveWorker>, StoreError> {
        let mut conn = self.conn.clone();
        let v: Value = self
            .scripts
            .get
            .key(self.key("w:", session_id))
            .invoke_async(&mut conn)
            .await?;
        decode_worker(v)
    }

    async fn remove_worker(&self, session_id: &str) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let (n, _, _): (i64, i64, i64) = redis::pipe()
            .atomic()
            .del(self.key("w:", session_id))
            .srem(self.key("workers", ""), session_id)
            .del(self.key("m:", session_id))
            .query_async(&mut conn)
            .await?;
        Ok(n == 1)
    }

    async fn list_workers(&self, _now: Now) -> Result<Vec<LiveWorker>, StoreError> {
        let mut conn = self.conn.clone();
        let v: Value = self
            .scripts
            .list
            .key(self.key("workers", ""))
            .arg(self.key("w:", ""))
            .invoke_async(&mut conn)
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

    async fn mark_superseded(
        &self,
        session_id: &str,
        error: &str,
        ttl_ms: u64,
        _now: Now,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        redis::cmd("SET")
            .arg(self.key("sup:", session_id))
            .arg(error)
            .arg("PX")
            .arg(ttl_ms.max(1))
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    async fn superseded(&self, session_id: &str, _now: Now) -> Result<Option<String>, StoreError> {
        let mut conn = self.conn.clone();
        Ok(redis::cmd("GET")
            .arg(self.key("sup:", session_id))
            .query_async(&mut conn)
            .await?)
    }

    async fn binding(&self, hostname: &str) -> Result<Option<Binding>, StoreError> {
        let mut conn = self.conn.clone();
        let raw: Option<String> = redis::cmd("GET")
            .arg(self.key("b:", hostname))
            .query_async(&mut conn)
            .await?;
        raw.map(|r| serde_json::from_str(&r).map_err(|e| StoreError::Corrupt(e.to_string())))
            .transpose()
    }

    async fn set_binding(&self, hostname: &str, binding: &Binding) -> Result<(), StoreError> {
        let raw = serde_json::to_string(binding).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let mut conn = self.conn.clone();
        redis::cmd("SET")
            .arg(self.key("b:", hostname))
            .arg(raw)
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    async fn push_message(
        &self,
        session_id: &str,
        mut message: ControlMessage,
    ) -> Result<String, StoreError> {
        let mut conn = self.conn.clone();
        let n: u64 = redis::cmd("INCR")
            .arg(self.key("mseq", ""))
            .query_async(&mut conn)
            .await?;
        let msg_id = n.to_string();
        message.msg_id = Some(msg_id.clone());
        let raw =
            serde_json::to_string(&message).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        redis::cmd("RPUSH")
            .arg(self.key("m:", session_id))
            .arg(raw)
            .query_async::<()>(&mut conn)
            .await?;
        Ok(msg_id)
    }

    async fn pending_messages(
        &self,
        session_id: &str,
        acks: &[String],
    ) -> Result<Vec<ControlMessage>, StoreError> {
        let mut conn = self.conn.clone();
        let mut inv = self.scripts.acks.key(self.key("m:", session_id));
        for a in acks {
            inv.arg(a);
        }
        let raw: Vec<String> = inv.invoke_async(&mut conn).await?;
        Ok(raw
            .iter()
            .filter_map(|r| serde_json::from_str(r).ok())
            .collect())
    }

    async fn resolve_or_claim(
        &self,
        ns: &str,
        id: &str,
        candidate: Option<&str>,
        stale: Option<(&str, u64)>,
        floor: u64,
        _now: Now,
    ) -> Result<ClaimOutcome, StoreError> {
        let name = Self::row_name(ns, id);
        let mut conn = self.conn.clone();
        let v: Value = self
            .scripts
            .claim
            .key(self.key("p:", &name))
            .key(candidate.map(|c| self.key("w:", c)).unwrap_or_default())
            .key(self.key("placements", ""))
            .arg(candidate.unwrap_or(""))
            .arg(floor)
            .arg(stale.map(|s| s.0).unwrap_or(""))
            .arg(stale.map(|s| s.1.to_string()).unwrap_or_default())
            .arg(self.key("w:", ""))
            .arg(&name)
            .invoke_async(&mut conn)
            .await?;
        let parts = items(v);
        let kind = parts.first().and_then(text).unwrap_or_default();
        let placement = || -> Result<Placement, StoreError> {
            Ok(Placement {
                session_id: parts.get(1).and_then(text).unwrap_or_default(),
                epoch: epoch_of(parts.get(2))?,
            })
        };
        Ok(match kind.as_str() {
            "owned" => ClaimOutcome::Owned(placement()?),
            "claimed" => ClaimOutcome::Claimed(placement()?),
            "vacant" => ClaimOutcome::Vacant,
            "gone" => ClaimOutcome::CandidateGone,
            other => return Err(StoreError::Corrupt(format!("claim answered {other:?}"))),
        })
    }

    async fn reclaim(
        &self,
        ns: &str,
        id: &str,
        session_id: &str,
        prev_session: Option<&str>,
        floor: u64,
        _now: Now,
    ) -> Result<ReclaimOutcome, StoreError> {
        let name = Self::row_name(ns, id);
        let mut conn = self.conn.clone();
        let v: Value = self
            .scripts
            .reclaim
            .key(self.key("p:", &name))
            .key(self.key("placements", ""))
            .arg(session_id)
            .arg(prev_session.unwrap_or(""))
            .arg(floor)
            .arg(self.key("w:", ""))
            .arg(&name)
            .invoke_async(&mut conn)
            .await?;
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
        ns: &str,
        id: &str,
        session_id: &str,
        epoch: Option<u64>,
    ) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let n: i64 = self
            .scripts
            .release
            .key(self.key("p:", &Self::row_name(ns, id)))
            .arg(session_id)
            .arg(epoch.map(|e| e.to_string()).unwrap_or_default())
            .invoke_async(&mut conn)
            .await?;
        Ok(n == 1)
    }

    async fn tag(
        &self,
        ns: &str,
        id: &str,
        session_id: &str,
        epoch: Option<u64>,
        tag: &str,
    ) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let n: i64 = self
            .scripts
            .tag
            .key(self.key("p:", &Self::row_name(ns, id)))
            .arg(session_id)
            .arg(epoch.map(|e| e.to_string()).unwrap_or_default())
            .arg(tag)
            .invoke_async(&mut conn)
            .await?;
        Ok(n == 1)
    }

    async fn list_placements(&self, _now: Now) -> Result<Vec<PlacementEntry>, StoreError> {
        let mut conn = self.conn.clone();
        let v: Value = self
            .scripts
            .placements
            .key(self.key("placements", ""))
            .arg(self.key("p:", ""))
            .arg(self.key("w:", ""))
            .invoke_async(&mut conn)
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
            });
        }
        out.sort_by(|a, b| (&a.ns, &a.id).cmp(&(&b.ns, &b.id)));
        Ok(out)
    }

    async fn acquire_sweeper_lease(
        &self,
        token: &str,
        ttl_ms: u64,
        _now: Now,
    ) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let set: Option<String> = redis::cmd("SET")
            .arg(self.key("sweeper", ""))
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms.max(1))
            .query_async(&mut conn)
            .await?;
        Ok(set.is_some())
    }

    async fn renew_sweeper_lease(
        &self,
        token: &str,
        ttl_ms: u64,
        _now: Now,
    ) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let n: i64 = self
            .scripts
            .lease_renew
            .key(self.key("sweeper", ""))
            .arg(token)
            .arg(ttl_ms.max(1))
            .invoke_async(&mut conn)
            .await?;
        Ok(n == 1)
    }

    async fn release_sweeper_lease(&self, token: &str) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let n: i64 = self
            .scripts
            .lease_release
            .key(self.key("sweeper", ""))
            .arg(token)
            .invoke_async(&mut conn)
            .await?;
        Ok(n == 1)
    }
}
