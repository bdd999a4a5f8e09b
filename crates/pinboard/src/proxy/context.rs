//! The per-request context: what the phases of one proxied request share,
//! built once by the prepare phase and carried through every attempt
//! (pingora's `CTX`).
//!
//! Owns the request's facts (its id, its caller and world, the worker's
//! request head, its body) and the attempts' state (how many, what the
//! next resolution avoids, a claim to hand back). Never does I/O: the
//! phases do, reading and writing this.

use std::pin::Pin;

use http::uri::PathAndQuery;
use http::HeaderValue;
use tokio::time::Sleep;

use super::body::{BodyWatch, ReqBody};
use super::classify::RetryAction;
use super::cluster::Caller;
use super::respond::ClientUpgrade;
use crate::placement::Placement;
use crate::routes::{Avoid, Route, View};
use crate::world::{Scope, World};

/// The client's own forwarding values, for a request that arrived with
/// none (see `headers::add_forwarded`).
pub type Forwarding<'c> = Option<(&'c HeaderValue, &'c HeaderValue)>;

/// The id a request is for, owned: its path and query as the client sent
/// them (shared bytes), and where its namespace and id end.
#[derive(Debug)]
pub struct IdTarget {
    /// The client's path and query: the worker's request target.
    pub path_and_query: PathAndQuery,
    /// Length of `/<ns>`.
    ns_len: usize,
    /// Length of `/<ns>/<id>` as sent.
    key_len: usize,
    /// `/<ns>/<id>` with the id percent-decoded, when it had escapes.
    decoded_key: Option<Box<str>>,
}

impl IdTarget {
    /// The target of `path_and_query` whose namespace is `ns_len` bytes
    /// and whose raw key is `key_len` bytes long; `decoded_id`: the id
    /// unescaped, when it had escapes.
    pub fn new(
        path_and_query: PathAndQuery,
        ns_len: usize,
        key_len: usize,
        decoded_id: Option<&str>,
    ) -> Self {
        let decoded_key = decoded_id
            .map(|id| format!("{}/{id}", &path_and_query.as_str()[..ns_len]).into_boxed_str());
        Self {
            path_and_query,
            ns_len,
            key_len,
            decoded_key,
        }
    }

    /// The namespace, with its leading slash.
    pub fn ns(&self) -> &str {
        &self.path_and_query.as_str()[..self.ns_len]
    }

    /// `<ns>/<id>`, the route cache's key.
    pub fn key(&self) -> &str {
        match &self.decoded_key {
            Some(key) => key,
            None => &self.path_and_query.as_str()[..self.key_len],
        }
    }

    /// `/<ns>/<id>` as the client sent it (escapes kept).
    pub fn raw_key(&self) -> &str {
        &self.path_and_query.as_str()[..self.key_len]
    }

    /// The id, unescaped.
    pub fn id(&self) -> &str {
        &self.key()[self.ns_len + 1..]
    }
}

/// Who asks, and so which world the request is in (validated by the
/// prepare phase). The rarer two are boxed: the context stays small for
/// the hostless request most traffic is.
#[derive(Debug)]
pub enum Asker {
    /// A client naming no world: the hostless world.
    Hostless,
    /// A verified cluster caller: its registration is the world.
    Caller(Box<Caller>),
    /// A client naming a world.
    Named(Box<NamedWorld>),
}

/// A world a client named: `Pinboard-Hostname` / `Pinboard-Env`, else a
/// bound hostname its `Host` names.
#[derive(Debug)]
pub struct NamedWorld {
    /// `Pinboard-Hostname`.
    pub hostname: Option<HeaderValue>,
    /// `Pinboard-Env`.
    pub env: Option<HeaderValue>,
    /// The bound hostname `Host` named.
    pub by_host: Option<String>,
}

/// The state the attempts share.
#[derive(Debug, Default)]
pub struct Attempts {
    /// Re-sends allowed (none for a body that cannot be sent twice).
    pub retries: u32,
    /// This attempt, from 0.
    pub attempt: u32,
    /// The next resolution treats this `(session, epoch)` as vacant.
    pub stale: Option<(String, u64)>,
    /// Sessions the next resolution does not place on (they refused).
    pub exclude: Vec<String>,
    /// The next resolution re-reads the worker list first.
    pub refresh: bool,
    /// A worker refused for capacity: if no other can take the id, the
    /// client hears that the fleet is full, not that it is gone.
    pub full: bool,
    /// This attempt's route was claimed by it (a new placement).
    pub claimed: bool,
    /// A placement claimed here that its worker refused to activate:
    /// handed back if no worker answers the request.
    pub refused: Option<Placement>,
}

impl Attempts {
    /// What the next resolution avoids.
    pub fn avoid(&self) -> Avoid<'_> {
        Avoid {
            stale: self.stale.as_ref().map(|(s, e)| (s.as_str(), *e)),
            exclude: &self.exclude,
            refresh: self.refresh,
        }
    }

    /// Set up the next attempt after `route` failed as `action` says.
    pub fn next(&mut self, action: RetryAction, route: &Route) {
        self.refresh = false;
        self.stale = None;
        let session = &route.worker.record.session_id;
        match action {
            RetryAction::Reread => {}
            RetryAction::RefreshWorkers => self.refresh = true,
            RetryAction::Replace => self.stale = Some((session.clone(), route.epoch)),
            RetryAction::MoveAway => {
                self.stale = Some((session.clone(), route.epoch));
                self.exclude.push(session.clone());
            }
        }
        self.attempt += 1;
    }
}

/// One proxied request's context (see the module doc); `'c` is the
/// client connection's.
pub struct RequestCtx<'c> {
    /// The id.
    pub target: IdTarget,
    /// Who asks: a cluster caller, or a client naming a world (or none).
    pub asker: Asker,
    /// The worker view read while preparing, for the first resolution.
    pub view: Option<View>,
    /// The worker's request head: the client's method and cleaned fields,
    /// HTTP/1.1; each attempt sets its target.
    pub head: http::request::Parts,
    /// The forwarding fields a request that had none gets.
    pub forwarding: Forwarding<'c>,
    /// The body, across attempts.
    pub body: ReqBody,
    /// A streamed body's progress.
    pub watch: Option<BodyWatch>,
    /// The request asks to switch protocols.
    pub upgrade: bool,
    /// The client side of that switch, while not yet taken.
    pub client_upgrade: Option<ClientUpgrade>,
    /// The socket id offered for holding on this handshake
    /// (`pinned_wire::held::SOCKET_OFFER`), if it was.
    pub held_offer: Option<Box<str>>,
    /// The attempts so far.
    pub attempts: Attempts,
    /// When the request arrived, on the app's monotonic clock.
    pub arrived_mono_ms: u64,
    /// The connection's timer for the response head's deadline, reset for
    /// each request (`None`: the send phase makes its own; see
    /// [`await_head`](super::send::await_head)).
    pub head_timer: Option<Pin<&'c mut Sleep>>,
}

impl std::fmt::Debug for RequestCtx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestCtx")
            .field("key", &self.target.key())
            .field("attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}

impl RequestCtx<'_> {
    /// The verified cluster caller, for a cluster call.
    pub fn caller(&self) -> Option<&Caller> {
        match &self.asker {
            Asker::Caller(caller) => Some(caller),
            Asker::Hostless | Asker::Named(_) => None,
        }
    }

    /// Which workers the request may reach.
    pub fn scope(&self) -> Scope<'_> {
        let world = match &self.asker {
            Asker::Hostless => World::HOSTLESS,
            Asker::Caller(caller) => World {
                hostname: caller.worker.record.hostname.as_deref(),
                env: caller.worker.record.env_for(self.target.ns()),
            },
            // Validated while preparing: a second read cannot fail.
            Asker::Named(named) => World::from_values(
                named.hostname.as_ref(),
                named.env.as_ref(),
                named.by_host.as_deref(),
            )
            .unwrap_or(World::HOSTLESS),
        };
        Scope::World(world)
    }
}
