//! One open tray: its typed fields, its reserved bookkeeping (attempts,
//! park, built-in commands, dispatch state) and the one write path that
//! turns a mutation segment into a row image on the frontier.
//!
//! Every mutation happens under the tray's lock, in a synchronous segment,
//! and ends in [`OpenTray::commit`]: the fields that changed are
//! re-serialized into the cached doc and, if anything differs from what was
//! last enlisted, the whole row goes on the frontier. The lock is never held
//! across an await. Row layout (wire.md §12.4): one entry per field, and the
//! reserved `~v`, `~inbox`, `~attempts`, `~parked`, `~state`; `~dispatch`
//! and `~ignore` are the dispatch ledger's (`dispatch`, which writes them
//! through this path); other `~` entries a Python worker wrote are kept as
//! they are. A paged field's page
//! rows ([`Log`](super::Log)) are enlisted with the row, in one batch.
//!
//! The tray never names what holds it or what user code holds of it: the
//! open map reaches it as [`TrayEnv`] (built by the map), and its handler
//! and hooks as plain function pointers ([`Hooks`], built by `declare`,
//! which wraps a [`Delivery`] or the tray into the user-facing handles).

use std::collections::HashSet;
use std::sync::{Arc, Weak};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use parking_lot::Mutex;
use pinned_store::Doc;
use serde_json::Value as Json;
use tokio::sync::watch;

use super::env::{OpenMap, TrayEnv};
use super::field::{Entry, Fields};
use super::frontier::{Effect, Frontier, Receipt, Urgency};
use super::pages::StorePages;
use super::row::Entries;
use super::spec::Spec;
use super::{Tray, TrayError};
use crate::instance::Instance;
use crate::namespace::context::Context;
use crate::namespace::Record;
use crate::BoxError;

pub(crate) const VERSION_KEY: &str = "~v";
pub(crate) const INBOX_KEY: &str = "~inbox";
pub(crate) const ATTEMPTS_KEY: &str = "~attempts";
pub(crate) const PARKED_KEY: &str = "~parked";
pub(crate) const STATE_KEY: &str = "~state";
/// The tray's last admission keys (Rust-only; the reference keeps entries
/// it does not know when it rewrites a row, so they survive a Python
/// owner).
pub(crate) const ADMITTED_KEY: &str = "~admitted";

/// An open tray's `on_open` has not run (or `on_close` ran).
pub(crate) const CLOSED: u8 = 0;
/// Its `on_open` runs.
pub(crate) const OPENING: u8 = 1;
/// Open: it may pump.
pub(crate) const OPEN: u8 = 2;

/// The built-in command a delete admits into `~inbox`.
pub(crate) fn delete_command() -> Json {
    serde_json::json!({ "command": "delete" })
}

/// A handler of tray `T`, erased over its object type: it gets the
/// instance's object and one delivery of an item.
pub(crate) type HandlerFn<T> =
    fn(Instance, Delivery<T>, <T as Tray>::Item) -> BoxFuture<'static, Result<(), BoxError>>;

/// [`TrayHandler::on_open`](super::TrayHandler::on_open) or
/// [`TrayHandler::on_close`](super::TrayHandler::on_close), erased over the
/// object type.
pub(crate) type HookFn<T> =
    fn(Instance, Context, Arc<OpenTray<T>>) -> BoxFuture<'static, Result<(), BoxError>>;

/// An `on_ack` edit staged by a handler.
pub(crate) type AckEdit<T> = Box<dyn FnOnce(&mut T) + Send>;

/// An `after_ack` hook staged by a handler.
pub(crate) type AfterAck = Box<dyn FnOnce() + Send>;

/// What one handler run stages for its ack: edits that land with it, and
/// hooks that run once it landed.
pub(crate) struct Staged<T> {
    pub(crate) edits: Vec<AckEdit<T>>,
    pub(crate) after: Vec<AfterAck>,
    /// Messages to other objects, queued with the ack.
    pub(crate) sends: Vec<super::sends::Draft>,
}

impl<T> Default for Staged<T> {
    fn default() -> Self {
        Self {
            edits: Vec::new(),
            after: Vec::new(),
            sends: Vec::new(),
        }
    }
}

/// What a tray runs of its object, built by the declaration that knows the
/// object's type.
pub(crate) struct Hooks<T: Tray> {
    pub(crate) handler: HandlerFn<T>,
    pub(crate) on_open: HookFn<T>,
    pub(crate) on_close: HookFn<T>,
}

/// One delivery of an item to the handler, as the pump hands it over: what
/// the user's `TrayCtx` is made of.
pub(crate) struct Delivery<T: Tray> {
    pub(crate) tray: Arc<OpenTray<T>>,
    pub(crate) ctx: Context,
    /// This delivery's number (durable, counted before the handler runs).
    pub(crate) attempts: u64,
    /// The dispatch state an earlier delivery recorded.
    pub(crate) state: Option<Json>,
    /// The `on_ack` edits and `after_ack` hooks the handler stages.
    pub(crate) staged: Arc<Mutex<Staged<T>>>,
    pub(crate) cancel: tokio_util::sync::CancellationToken,
    /// Set once the run ended (returned, failed, timed out, cancelled):
    /// what the handler left behind (a task holding its `TrayCtx`) may no
    /// longer dispatch in its name.
    pub(crate) ended: Arc<std::sync::atomic::AtomicBool>,
}

/// How a tray stopped taking writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retired {
    /// Passivated (drained dry): the row stays; the next access reopens it.
    Closed,
    /// Deleted (or being deleted): the row goes, the key is freed.
    Deleted,
}

/// What the pump knows of one handler run under way.
pub(crate) struct Active {
    pub(crate) cancel: tokio_util::sync::CancellationToken,
}

/// The mutable half of an open tray.
pub(crate) struct TrayState<T: Tray> {
    pub(crate) tray: T,
    pub(crate) fields: Vec<&'static str>,
    /// The page rows of each paged field, by field name.
    pub(crate) pages: Vec<(&'static str, Arc<StorePages>)>,
    pub(crate) marked: bool,
    pub(crate) doc: Entries,
    /// The row differs from what was last enlisted.
    pub(crate) changed: bool,
    pub(crate) inbox: Vec<Json>,
    pub(crate) attempts: u64,
    pub(crate) parked: bool,
    pub(crate) dispatch_state: Option<Json>,
    /// The last [`Tray::ADMISSION_WINDOW`] admission keys, oldest first.
    pub(crate) admitted: std::collections::VecDeque<String>,
    /// Messages to other objects waiting for an answer (`~outgoing`): the
    /// row stays marked while any wait.
    pub(crate) sends: super::sends::Sends,
    pub(crate) retired: Option<Retired>,
    pub(crate) pumping: bool,
    /// An admission found the pump idle and counted the head item's next
    /// delivery (in `attempts`) in its own row write: the pump runs that
    /// delivery once the write landed, with no write of its own before it.
    pub(crate) primed: bool,
    pub(crate) active: Option<Active>,
    /// The last handler run ended within the frontier's linger of its
    /// start: an admission made while the next one runs waits for that
    /// run's ack to carry its row.
    pub(crate) quick: bool,
}

/// An open tray of type `T`.
pub(crate) struct OpenTray<T: Tray> {
    pub(crate) key: String,
    pub(crate) keyed: bool,
    pub(crate) always_open: bool,
    /// Weak, like the slot below: the instance's trays (and through them
    /// the slot) own this tray, so strong pointers back would be cycles.
    pub(crate) owner: Weak<dyn OpenMap>,
    pub(crate) slot: Weak<Record>,
    pub(crate) frontier: Arc<Frontier>,
    pub(crate) handler: HandlerFn<T>,
    pub(crate) on_open: HookFn<T>,
    pub(crate) on_close: HookFn<T>,
    /// [`CLOSED`], [`OPENING`] (its `on_open` runs) or [`OPEN`] (it may
    /// pump).
    pub(crate) opened: std::sync::atomic::AtomicU8,
    pub(crate) state: Mutex<TrayState<T>>,
    /// Turns true once a delete finished (the key is free).
    pub(crate) freed: watch::Sender<bool>,
}

fn malformed(spec: &Spec, key: &str, reason: impl Into<String>) -> TrayError {
    TrayError::Malformed {
        tray: spec.name.to_owned(),
        key: key.to_owned(),
        reason: reason.into(),
    }
}

/// Restores tray `T` from its row, running `hooks`. `None` is a fresh
/// row: a keyed tray's is written at once, so a created tray lives until
/// deleted (the reference's rule); a singleton's only with its first
/// write, since every activation opens the singletons and an id that
/// writes nothing must leave no data row (a scanner's random ids, a bare
/// read). Unwritten, a singleton reads as fresh on every activation, which
/// is what the written `{}` row would have given.
pub(crate) fn restore<T: Tray>(
    env: &TrayEnv,
    spec: &Spec,
    key: String,
    row: Option<(bool, Doc)>,
    hooks: Hooks<T>,
) -> Result<Arc<OpenTray<T>>, TrayError> {
    let fresh = || {
        let mut doc = Doc::new();
        if T::VERSION != 0 {
            doc.insert(VERSION_KEY.to_owned(), Json::from(T::VERSION));
        }
        doc
    };
    let stored = row.is_some();
    let (mut marked, mut doc) = row.unwrap_or_else(|| (false, fresh()));
    let version = match doc.get(VERSION_KEY) {
        None => 0,
        Some(version) => version
            .as_i64()
            .ok_or_else(|| malformed(spec, &key, format!("malformed version {version}")))?,
    };
    // A row of another schema version activates blank; a stale mark (a
    // dead work claim every restart would resurrect) is dropped durably.
    let mut changed = !stored && spec.keyed;
    let mut discarded = None;
    if version != T::VERSION {
        changed = true;
        marked = false;
        discarded = Some(std::mem::replace(&mut doc, fresh()));
    }
    let mut tray = T::default();
    let mut fields: Vec<&'static str> = Vec::new();
    let mut pages: Vec<(&'static str, Arc<StorePages>)> = Vec::new();
    let mut problem: Option<String> = None;
    {
        let mut seen = HashSet::new();
        let mut visit = |name: &'static str, field: &mut dyn super::Field| {
            if problem.is_some() {
                return;
            }
            if name.is_empty() || name.starts_with('~') || !seen.insert(name) {
                problem = Some(format!(
                    "field name {name:?} is empty, reserved or declared twice"
                ));
                return;
            }
            fields.push(name);
            if let Err(reason) = field.restore(doc.get(name).cloned()) {
                problem = Some(
                    super::FieldError {
                        kind: field.kind(),
                        name: name.to_owned(),
                        reason,
                    }
                    .to_string(),
                );
                return;
            }
            if let Some(paged) = field.paged() {
                let source = Arc::new(StorePages::new(
                    T::NAME,
                    name,
                    &key,
                    env.store.clone(),
                    env.slot.clone(),
                    env.frontier.clone(),
                ));
                paged.bind(source.clone());
                // The pages of a discarded version go with the first write.
                if let Some(discarded) = &discarded {
                    paged.discard(discarded.get(name));
                }
                pages.push((name, source));
            }
        };
        tray.fields(&mut Fields::new(&mut visit));
    }
    if let Some(problem) = problem {
        return Err(malformed(spec, &key, problem));
    }
    let inbox = match doc.get(INBOX_KEY) {
        None => Vec::new(),
        Some(Json::Array(commands)) => commands.clone(),
        Some(Json::Object(entry)) => {
            // A queue entry with pending takes: takes first.
            let list = |name: &str| match entry.get(name) {
                Some(Json::Array(list)) => list.clone(),
                _ => Vec::new(),
            };
            list("taken").into_iter().chain(list("items")).collect()
        }
        Some(other) => return Err(malformed(spec, &key, format!("malformed inbox {other}"))),
    };
    let attempts = match doc.get(ATTEMPTS_KEY) {
        None => 0,
        Some(attempts) => attempts
            .as_u64()
            .filter(|attempts| *attempts > 0)
            .ok_or_else(|| malformed(spec, &key, format!("malformed attempts {attempts}")))?,
    };
    let parked = match doc.get(PARKED_KEY) {
        None => false,
        Some(Json::Bool(true)) => true,
        Some(other) => return Err(malformed(spec, &key, format!("malformed parked {other}"))),
    };
    let dispatch_state = doc.get(STATE_KEY).cloned();
    let admitted = match doc.get(ADMITTED_KEY) {
        None => std::collections::VecDeque::new(),
        Some(Json::Array(keys)) => keys
            .iter()
            .map(|key| key.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| malformed(spec, &key, "malformed admission keys"))?,
        Some(other) => {
            return Err(malformed(
                spec,
                &key,
                format!("malformed admission keys {other}"),
            ))
        }
    };
    let sends = super::sends::Sends::restore(doc.get(super::sends::OUTGOING_KEY))
        .map_err(|reason| malformed(spec, &key, reason))?;
    let doc = Entries::of(&doc).map_err(|error| malformed(spec, &key, error.to_string()))?;
    let tray = Arc::new(OpenTray {
        key,
        keyed: spec.keyed,
        always_open: spec.always_open,
        owner: env.map.clone(),
        slot: env.slot.clone(),
        frontier: env.frontier.clone(),
        handler: hooks.handler,
        on_open: hooks.on_open,
        on_close: hooks.on_close,
        opened: std::sync::atomic::AtomicU8::new(CLOSED),
        state: Mutex::new(TrayState {
            tray,
            fields,
            pages,
            marked,
            doc,
            changed,
            inbox,
            attempts,
            parked,
            dispatch_state,
            admitted,
            sends,
            retired: None,
            pumping: false,
            primed: false,
            quick: false,
            active: None,
        }),
        freed: watch::Sender::new(false),
    });
    {
        let mut state = tray.state.lock();
        let _written = tray.commit(&mut state)?;
    }
    Ok(tray)
}

impl<T: Tray> OpenTray<T> {
    /// Runs `on_close` once after an `on_open`, logging a failure.
    pub(crate) async fn run_close(self: Arc<Self>, instance: Instance, ctx: Context) {
        if self
            .opened
            .swap(CLOSED, std::sync::atomic::Ordering::SeqCst)
            != OPEN
        {
            return;
        }
        let label = self.label();
        let hook = (self.on_close)(instance, ctx, self);
        let failure = match std::panic::AssertUnwindSafe(hook).catch_unwind().await {
            Ok(Ok(())) => return,
            Ok(Err(error)) => error.to_string(),
            Err(panic) => crate::namespace::panic_message(panic.as_ref()),
        };
        tracing::error!(tray = %label, error = %failure, "TrayHandler::on_close failed");
    }

    /// Runs `on_close` in the background after a passivation.
    pub(crate) fn close_later(self: &Arc<Self>) {
        let Some(slot) = self.slot.upgrade() else {
            return;
        };
        let Some(instance) = slot.instance() else {
            return;
        };
        let tray = self.clone();
        let ctx = Context::new(slot.clone());
        ctx.clone().wait_until(async move {
            tray.run_close(instance, ctx).await;
            Ok(())
        });
    }

    /// Passivates a keyed tray (not always open) that rests dry, when
    /// `holders` references are all that is left of it: the open map's and
    /// the caller's. Called by the pump going dry and by the last handle
    /// going away, whichever comes last. Takes the state lock, then the
    /// open map's.
    pub(crate) fn passivate_if_dry(&self, state: &mut TrayState<T>, holders: usize) -> bool {
        if !self.keyed || self.always_open || state.retired.is_some() {
            return false;
        }
        if state.marked || !state.inbox.is_empty() {
            return false;
        }
        if let Some(owner) = self.owner.upgrade() {
            let me = (self as *const Self).cast::<()>();
            if owner.passivate(T::NAME, &self.key, me, holders) {
                state.retired = Some(Retired::Closed);
                return true;
            }
        }
        false
    }

    /// `tray_ns/tray_id`, for errors and logs.
    pub(crate) fn label(&self) -> String {
        format!("{}/{}", T::NAME, self.key)
    }

    /// Refuses writes to a retired tray.
    pub(crate) fn writable(&self, state: &TrayState<T>) -> Result<(), TrayError> {
        match state.retired {
            None => Ok(()),
            Some(Retired::Deleted) => Err(TrayError::Deleted(self.label())),
            // A passivated tray left the open map with no handle left, so
            // nothing reaches one; refuse rather than write behind a reopen.
            Some(Retired::Closed) => Err(TrayError::Closed),
        }
    }

    /// Whether the pump, deciding now, would deliver the head item: the
    /// tray is live, holds no built-in command, is not parked, and the
    /// instance does not wind down (unless the tray drains on eviction).
    pub(crate) fn deliverable(slot: &Record, state: &TrayState<T>) -> bool {
        state.retired.is_none()
            && state.inbox.is_empty()
            && !state.parked
            && (T::DRAIN_ON_EVICTION || !slot.winding_down())
            && state.tray.head().is_some()
    }

    /// Ends an admission's write segment as [`commit`](Self::commit) does;
    /// when the pump is idle (not running, no delivery counted) and would
    /// deliver the head item next, that delivery is counted in the same
    /// row write ([`TrayState::primed`]). An admission to an idle tray then
    /// costs one store write before its handler runs, not two in turn, and
    /// the count is still durable before the handler runs. The caller
    /// starts the pump after.
    pub(crate) fn commit_admission(&self, state: &mut TrayState<T>) -> Result<Receipt, TrayError> {
        let idle = !state.pumping
            && !state.primed
            && state.active.is_none()
            && state.attempts < T::MAX_ATTEMPTS
            && self.opened.load(std::sync::atomic::Ordering::SeqCst) == OPEN;
        if idle {
            if let Some(slot) = self.slot.upgrade() {
                if Self::deliverable(&slot, state) {
                    state.attempts += 1;
                    state.primed = true;
                    state.changed = true;
                }
            }
        }
        // A quick run under way acks within the linger: this row leaves
        // with that ack (and the next delivery's count) in one write, not
        // alone just before it. A slow run's admissions are written at once.
        if state.active.is_some() && state.quick {
            return Ok(self.commit_with(state, Urgency::Soon)?.patient());
        }
        self.commit(state)
    }

    /// Ends a write segment: re-serializes the fields that changed, syncs
    /// the reserved entries and, when the row differs from what was last
    /// enlisted, enlists it. Returns a receipt covering the segment.
    ///
    /// A value that does not serialize aborts the instance: its memory
    /// already holds the change, which must never outlive the store.
    pub(crate) fn commit(&self, state: &mut TrayState<T>) -> Result<Receipt, TrayError> {
        self.commit_with(state, Urgency::Now)
    }

    /// As [`commit`](Self::commit), the row leaving when `urgency` says:
    /// [`Urgency::Soon`] for a write nobody waits for.
    pub(crate) fn commit_with(
        &self,
        state: &mut TrayState<T>,
        urgency: Urgency,
    ) -> Result<Receipt, TrayError> {
        let TrayState {
            tray,
            doc,
            changed,
            pages,
            ..
        } = state;
        let mut failure: Option<String> = None;
        // Page rows of paged fields: they leave with the tray's row, in one
        // batch, before it.
        let mut effects: Vec<Effect> = Vec::new();
        {
            let mut visit = |name: &'static str, field: &mut dyn super::Field| {
                if !field.take_dirty() {
                    return;
                }
                match field.entry() {
                    Ok(entry) => *changed |= doc.put(name, entry),
                    Err(error) => failure = Some(format!("{name}: {error}")),
                }
                let Some(paged) = field.paged() else {
                    return;
                };
                let mut writes = Vec::new();
                if let Err(error) = paged.take_writes(&mut writes) {
                    failure = Some(format!("{name}: {error}"));
                }
                if let Some((_, source)) = pages.iter().find(|(field, _)| *field == name) {
                    effects.extend(writes.into_iter().map(|(page, image)| Effect::Row {
                        tray_ns: source.tray_ns().to_owned(),
                        tray_id: source.tray_id(page),
                        image: image.map(|image| (false, image)),
                    }));
                }
            };
            tray.fields(&mut Fields::new(&mut visit));
        }
        if let Some(failure) = failure {
            if let Some(slot) = self.slot.upgrade() {
                tracing::error!(namespace = %slot.host.ns, id = %slot.id, tray = %self.label(), error = %failure, "a tray value does not serialize; aborting the instance");
                crate::namespace::Namespace::abort(&slot);
            }
            return Err(TrayError::Encode(failure));
        }
        let reserved = [
            (
                VERSION_KEY,
                (T::VERSION != 0).then(|| Entry::of(&T::VERSION)),
            ),
            (
                INBOX_KEY,
                (!state.inbox.is_empty()).then(|| Entry::of(&state.inbox)),
            ),
            (
                ATTEMPTS_KEY,
                (state.attempts > 0).then(|| Entry::of(&state.attempts)),
            ),
            (PARKED_KEY, state.parked.then(|| Entry::of(&true))),
            (STATE_KEY, state.dispatch_state.as_ref().map(Entry::of)),
            (
                ADMITTED_KEY,
                (!state.admitted.is_empty()).then(|| Entry::of(&state.admitted)),
            ),
        ];
        for (name, entry) in reserved {
            // Plain JSON values and numbers always encode.
            let entry = entry
                .transpose()
                .map_err(|error| TrayError::Encode(format!("{name}: {error}")))?;
            state.changed |= state.doc.put(name, entry);
        }
        if std::mem::take(&mut state.changed) || !effects.is_empty() {
            effects.push(Effect::Row {
                tray_ns: T::NAME.to_owned(),
                tray_id: self.key.clone(),
                image: Some((state.marked, state.doc.text())),
            });
            self.frontier.enlist_all(effects, urgency)?;
        }
        Ok(self.frontier.receipt())
    }

    /// Reads back the newest page of each paged field that has one, before
    /// the tray is used: an append rewrites that page whole.
    pub(crate) async fn load_pages(&self) -> Result<(), TrayError> {
        let wanted: Vec<(&'static str, u64, Arc<StorePages>)> = {
            let mut state = self.state.lock();
            let TrayState { tray, pages, .. } = &mut *state;
            let mut wanted = Vec::new();
            tray.fields(&mut Fields::new(&mut |name, field| {
                let page = field.paged().and_then(|paged| paged.page_to_load());
                let source = pages.iter().find(|(field, _)| *field == name);
                if let (Some(page), Some((_, source))) = (page, source) {
                    wanted.push((name, page, source.clone()));
                }
            }));
            wanted
        };
        for (name, page, source) in wanted {
            let row = source.fetch(page).await?;
            let mut state = self.state.lock();
            let mut problem = None;
            state
                .tray
                .fields(&mut Fields::new(&mut |field_name, field| {
                    if field_name != name {
                        return;
                    }
                    if let Some(paged) = field.paged() {
                        problem = paged.load(row.as_ref()).err();
                    }
                }));
            if let Some(reason) = problem {
                return Err(TrayError::Malformed {
                    tray: T::NAME.to_owned(),
                    key: self.key.clone(),
                    reason: format!("log {name:?}: {reason}"),
                });
            }
        }
        Ok(())
    }

    /// The deletes of every page row of the tray's paged fields.
    pub(crate) fn page_deletes(state: &mut TrayState<T>) -> Vec<Effect> {
        let TrayState { tray, pages, .. } = state;
        let mut deletes = Vec::new();
        tray.fields(&mut Fields::new(&mut |name, field| {
            let held = field.paged().map(|paged| paged.pages());
            let source = pages.iter().find(|(field, _)| *field == name);
            if let (Some(held), Some((_, source))) = (held, source) {
                deletes.extend(held.map(|page| Effect::Row {
                    tray_ns: source.tray_ns().to_owned(),
                    tray_id: source.tray_id(page),
                    image: None,
                }));
            }
        }));
        deletes
    }

    /// Moves the mark.
    pub(crate) fn set_marked(state: &mut TrayState<T>, marked: bool) {
        if state.marked != marked {
            state.marked = marked;
            state.changed = true;
        }
    }

    /// Runs `edit` on the tray as one write segment: a panic inside it
    /// aborts the instance (its memory may be half-changed).
    pub(crate) fn segment<R>(
        &self,
        state: &mut TrayState<T>,
        edit: impl FnOnce(&mut T) -> R,
    ) -> Result<R, TrayError> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| edit(&mut state.tray))) {
            Ok(answer) => Ok(answer),
            Err(_) => {
                if let Some(slot) = self.slot.upgrade() {
                    tracing::error!(namespace = %slot.host.ns, id = %slot.id, tray = %self.label(), "a tray write segment panicked; aborting the instance");
                    crate::namespace::Namespace::abort(&slot);
                }
                Err(TrayError::Panicked)
            }
        }
    }
}
