//! The simulation's side of pinboard's I/O: virtual time ([`SimClock`]),
//! per-request seeded randomness ([`SimEntropy`]), the fake network
//! ([`SimNet`], an [`Exchange`] that turns calls into protocol effects) and
//! the durable store the nodes share ([`SimDurable`]: the activities index
//! and the epoch high-water mark, both outside what `wipe` clears).
//!
//! Never decides anything pinboard decides; only carries calls and answers.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::future::BoxFuture;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use parking_lot::Mutex;
use pinned_store::{DueAlarm, MarkedInstance, WorldStamp};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::Output;
use crate::clock::{Clock, DurableMark, Entropy, MarkError, Now};
use crate::outbound::Exchange;
use crate::sweeper::Activities;
use crate::upstream::SendError;

/// Virtual time: the wall clock is the latest request's `now`; the
/// monotonic clock adds up its forward steps only, so it never goes back
/// (a clock rollback moves the wall clock alone).
#[derive(Debug, Default)]
pub struct SimClock {
    state: Mutex<ClockState>,
}

#[derive(Debug, Default)]
struct ClockState {
    wall_ms: u64,
    mono_ms: u64,
    started: bool,
}

impl SimClock {
    /// Move to the wall time `now_ms` of a request.
    pub fn advance(&self, now_ms: u64) {
        let mut st = self.state.lock();
        if st.started && now_ms > st.wall_ms {
            st.mono_ms += now_ms - st.wall_ms;
        }
        st.started = true;
        st.wall_ms = now_ms;
    }
}

impl Clock for SimClock {
    fn now(&self) -> Now {
        let st = self.state.lock();
        Now {
            wall_ms: st.wall_ms,
            mono_ms: st.mono_ms,
        }
    }
}

/// Randomness reseeded from every request's `randomSeed`.
#[derive(Debug)]
pub struct SimEntropy {
    rng: Mutex<StdRng>,
}

impl Default for SimEntropy {
    fn default() -> Self {
        Self {
            rng: Mutex::new(StdRng::seed_from_u64(0)),
        }
    }
}

impl SimEntropy {
    /// Draw from `seed` from now on.
    pub fn reseed(&self, seed: u64) {
        *self.rng.lock() = StdRng::seed_from_u64(seed);
    }
}

impl Entropy for SimEntropy {
    fn next_u64(&self) -> u64 {
        self.rng.lock().random()
    }
}

/// The durable store shared by the nodes ("Postgres"): the activities
/// index with what the sweeper read of it, and the epoch high-water mark.
#[derive(Debug, Default)]
pub struct SimDurable {
    index: Mutex<Vec<(String, String)>>,
    served: Mutex<BTreeSet<(String, String)>>,
    mark: AtomicU64,
}

impl SimDurable {
    /// Replace the index (`syncActivities`); a new observation window.
    pub fn sync(&self, mut entries: Vec<(String, String)>) {
        entries.sort();
        entries.dedup();
        *self.index.lock() = entries;
        self.served.lock().clear();
    }

    /// What sweepers read since the last [`sync`](Self::sync), sorted.
    pub fn served(&self) -> Vec<(String, String)> {
        self.served.lock().iter().cloned().collect()
    }
}

impl Activities for SimDurable {
    fn due_alarms(
        &self,
        _due_by_ms: i64,
        _limit: usize,
    ) -> BoxFuture<'_, Result<Vec<DueAlarm>, pinned_store::StoreError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn marked_instances<'a>(
        &'a self,
        after: Option<(&'a str, &'a str)>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<MarkedInstance>, pinned_store::StoreError>> {
        let page: Vec<(String, String)> = self
            .index
            .lock()
            .iter()
            .filter(|(ns, id)| after.is_none_or(|(a, b)| (ns.as_str(), id.as_str()) > (a, b)))
            .take(limit)
            .cloned()
            .collect();
        self.served.lock().extend(page.iter().cloned());
        // The reference's simulation has one world.
        let page = page
            .into_iter()
            .map(|(ns, id)| MarkedInstance {
                ns,
                id,
                world: WorldStamp::any(),
            })
            .collect();
        Box::pin(async move { Ok(page) })
    }
}

impl DurableMark for SimDurable {
    fn load(&self) -> BoxFuture<'_, Result<u64, MarkError>> {
        let v = self.mark.load(Ordering::Acquire);
        Box::pin(async move { Ok(v) })
    }

    fn raise(&self, epoch: u64) -> BoxFuture<'_, Result<(), MarkError>> {
        self.mark.fetch_max(epoch, Ordering::AcqRel);
        Box::pin(async { Ok(()) })
    }
}

/// One worker origin as the fake network knows it.
#[derive(Debug, Clone, Default)]
struct Origin {
    up: bool,
    secret: String,
}

/// An answer to an effect.
#[derive(Debug)]
pub struct EffectResult {
    /// HTTP status; 0 when the connection died.
    pub status: u16,
    /// Body text.
    pub body: String,
}

/// The fake network: challenge probes answered in process, every other
/// call written out as an effect and parked until the sim answers it. At
/// most one effect is outstanding at a time (calls queue on a gate).
pub struct SimNet {
    out: Arc<Output>,
    origins: Mutex<HashMap<String, Origin>>,
    gate: tokio::sync::Mutex<()>,
    pending: Mutex<Option<(u64, oneshot::Sender<EffectResult>)>>,
    next_effect: AtomicU64,
}

impl std::fmt::Debug for SimNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimNet").finish_non_exhaustive()
    }
}

impl SimNet {
    /// A network with the `origins` of `init`, all down.
    pub fn new(out: Arc<Output>, origins: impl IntoIterator<Item = String>) -> Self {
        Self {
            out,
            origins: Mutex::new(
                origins
                    .into_iter()
                    .map(|o| (o, Origin::default()))
                    .collect(),
            ),
            gate: tokio::sync::Mutex::new(()),
            pending: Mutex::new(None),
            next_effect: AtomicU64::new(1),
        }
    }

    /// `setWorker`: an origin goes up (with its secret) or down.
    pub fn set(&self, origin: &str, up: bool, secret: Option<&str>) {
        let mut origins = self.origins.lock();
        let o = origins.entry(origin.to_owned()).or_default();
        o.up = up;
        if let Some(secret) = secret {
            o.secret = secret.to_owned();
        }
    }

    /// An effect result arrived; `false` when no effect with that id waits.
    pub fn answer(&self, effect_id: u64, result: EffectResult) -> bool {
        match self.pending.lock().take() {
            Some((id, tx)) if id == effect_id => tx.send(result).is_ok(),
            other => {
                *self.pending.lock() = other;
                false
            }
        }
    }

    fn challenge(
        &self,
        origin: &str,
        request: &Request<Bytes>,
    ) -> Result<Response<Bytes>, SendError> {
        let known = self.origins.lock().get(origin).cloned();
        let Some(o) = known.filter(|o| o.up) else {
            return Err(unreachable(origin));
        };
        let secret = request
            .headers()
            .get(pinned_wire::headers::PROXY_SECRET)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if secret != o.secret {
            return Ok(answer(
                StatusCode::FORBIDDEN,
                json!({"detail": "invalid proxy secret"}),
            ));
        }
        let challenge = request
            .uri()
            .query()
            .unwrap_or("")
            .split('&')
            .find_map(|kv| kv.strip_prefix("challenge="))
            .unwrap_or("");
        let challenge = percent_encoding::percent_decode_str(challenge).decode_utf8_lossy();
        Ok(answer(
            StatusCode::OK,
            json!({"value": format!("value-{challenge}")}),
        ))
    }

    async fn effect(
        &self,
        origin: &str,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, SendError> {
        let _turn = self.gate.lock().await;
        let id = self.next_effect.fetch_add(1, Ordering::Relaxed);
        let headers: serde_json::Map<String, Value> = request
            .headers()
            .iter()
            .filter(|(name, _)| *name != http::header::HOST)
            .map(|(name, value)| {
                (
                    name.as_str().to_owned(),
                    Value::String(String::from_utf8_lossy(value.as_bytes()).into_owned()),
                )
            })
            .collect();
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .to_owned();
        let (tx, rx) = oneshot::channel();
        *self.pending.lock() = Some((id, tx));
        self.out.line(&json!({
            "effect": {
                "origin": origin,
                "method": request.method().as_str(),
                "path": path,
                "headers": headers,
                "body": String::from_utf8_lossy(request.body()),
            },
            "effectId": id,
        }));
        let result = rx
            .await
            .map_err(|_| SendError::Dropped("the simulation never answered".into()))?;
        if result.status == 0 {
            return Err(SendError::Dropped("the worker connection died".into()));
        }
        let status = StatusCode::from_u16(result.status)
            .map_err(|_| SendError::Dropped(format!("bad status {}", result.status)))?;
        let mut res = Response::new(Bytes::from(result.body));
        *res.status_mut() = status;
        Ok(res)
    }
}

fn unreachable(origin: &str) -> SendError {
    SendError::Connect(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        format!("{origin} is down"),
    ))
}

fn answer(status: StatusCode, body: Value) -> Response<Bytes> {
    let mut res = Response::new(Bytes::from(body.to_string()));
    *res.status_mut() = status;
    res
}

impl Exchange for SimNet {
    fn exchange(
        &self,
        origin: &str,
        request: Request<Bytes>,
    ) -> BoxFuture<'_, Result<Response<Bytes>, SendError>> {
        let origin = origin.trim_end_matches('/').to_owned();
        Box::pin(async move {
            if request.uri().path() == "/_pinned/challenge" {
                return self.challenge(&origin, &request);
            }
            self.effect(&origin, request).await
        })
    }
}
