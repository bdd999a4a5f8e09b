//! What user code holds: [`TrayHandle`] (one open tray: admit, read,
//! update, unpark, delete, ad-hoc storage), [`KeyedTrays`] (a keyed tray
//! type's trays by key) and [`TrayCtx`] (one handler run).
//!
//! Every write is one synchronous segment under the tray's lock and returns
//! a [`Receipt`]; nothing here awaits while holding the lock.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value as Json;
use tokio_util::sync::CancellationToken;

use super::dispatch::{Dispatched, Record};
use super::field::Entry;
use super::frontier::{Effect, Receipt};
use super::machine::{delete_command, Delivery, OpenTray, Retired, Staged};
use super::open::InstanceTrays;
use super::opened::Opened;
use super::{Tray, TrayError};
use crate::namespace::context::Context;
use crate::BoxError;

/// One open tray of type `T`. Cheap to clone.
pub struct TrayHandle<T: Tray> {
    pub(super) tray: Arc<OpenTray<T>>,
}

impl<T: Tray> Clone for TrayHandle<T> {
    fn clone(&self) -> Self {
        Self {
            tray: self.tray.clone(),
        }
    }
}

impl<T: Tray> std::fmt::Debug for TrayHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrayHandle")
            .field("tray", &T::NAME)
            .field("key", &self.tray.key)
            .finish()
    }
}

impl<T: Tray> Drop for TrayHandle<T> {
    fn drop(&mut self) {
        // The last handle of a keyed tray that went dry while it was held
        // passivates it: the open map's reference and this one are left.
        if Arc::strong_count(&self.tray) <= 2 {
            let mut state = self.tray.state.lock();
            if !state.pumping && self.tray.passivate_if_dry(&mut state, 2) {
                self.tray.close_later();
            }
        }
    }
}

fn check_name<T: Tray>(fields: &[&'static str], name: &str) -> Result<(), TrayError> {
    if name.is_empty() || name.starts_with('~') || fields.contains(&name) {
        return Err(TrayError::InvalidName(name.to_owned()));
    }
    let _ = T::NAME;
    Ok(())
}

/// What [`TrayHandle::admit_once`] did.
#[derive(Debug)]
#[must_use = "await the receipt for a durable answer"]
pub enum Admission {
    /// The key was new: the work is admitted.
    Admitted(Receipt),
    /// The key was among the last admitted: nothing was admitted again.
    Repeat(Receipt),
}

impl Admission {
    /// The key had been admitted before.
    pub fn is_repeat(&self) -> bool {
        matches!(self, Self::Repeat(_))
    }

    /// Resolves once the key's (first) admission is durable.
    pub fn receipt(self) -> Receipt {
        match self {
            Self::Admitted(receipt) | Self::Repeat(receipt) => receipt,
        }
    }
}

impl<T: Tray> TrayHandle<T> {
    pub(crate) fn new(tray: Arc<OpenTray<T>>) -> Self {
        Self { tray }
    }

    /// The tray's key (`~` for a singleton).
    pub fn key(&self) -> &str {
        &self.tray.key
    }

    /// Reads the tray's current state.
    pub fn read<R>(&self, read: impl FnOnce(&T) -> R) -> R {
        read(&self.tray.state.lock().tray)
    }

    /// Admits work: marks the row as holding work, runs `edit` (typically a
    /// push onto a queue), and writes mark and payload in one row write; the
    /// pump then starts if it is not running. Await the receipt for a
    /// durable answer.
    ///
    /// # Errors
    ///
    /// A deleted tray; a write that cannot land (poisoned effects, a closed
    /// instance); a value that does not serialize or a panic in `edit`
    /// (both abort the instance).
    pub fn admit(&self, edit: impl FnOnce(&mut T)) -> Result<Receipt, TrayError> {
        let receipt = {
            let mut state = self.tray.state.lock();
            self.tray.writable(&state)?;
            OpenTray::<T>::set_marked(&mut state, true);
            self.tray.segment(&mut state, edit)?;
            self.tray.commit_admission(&mut state)?
        };
        self.tray.start_pump();
        Ok(receipt)
    }

    /// Admits work at most once per `key` (a request id, a message id):
    /// as [`admit`](Self::admit) when `key` is not among the tray's last
    /// [`Tray::ADMISSION_WINDOW`] admission keys, and then remembered in
    /// the same row write; else nothing is admitted and the answer says it
    /// was a repeat. The keys live in the row, so a repeat is known after a
    /// crash or a move to another worker, as long as the first admission
    /// landed. Either answer's receipt resolves once the first admission
    /// is durable (a repeat can arrive while it is still on its way).
    ///
    /// A client that retries a request (pinboard answers 502 for one whose
    /// connection was lost after the send, and never re-sends it itself)
    /// sends the same key again, for instance in an `Idempotency-Key`
    /// header; the handler answers a repeat as it answered the first time.
    ///
    /// # Errors
    ///
    /// [`TrayError::AdmissionKey`] for an empty key or one longer than
    /// [`MAX_ADMISSION_KEY_BYTES`](super::MAX_ADMISSION_KEY_BYTES), and as
    /// [`admit`](Self::admit).
    pub fn admit_once(&self, key: &str, edit: impl FnOnce(&mut T)) -> Result<Admission, TrayError> {
        if key.is_empty() || key.len() > super::MAX_ADMISSION_KEY_BYTES {
            return Err(TrayError::AdmissionKey);
        }
        let window = T::ADMISSION_WINDOW.clamp(1, super::MAX_ADMISSION_WINDOW);
        let admission = {
            let mut state = self.tray.state.lock();
            self.tray.writable(&state)?;
            if state.admitted.iter().any(|seen| seen == key) {
                return Ok(Admission::Repeat(self.tray.frontier.receipt()));
            }
            OpenTray::<T>::set_marked(&mut state, true);
            self.tray.segment(&mut state, edit)?;
            while state.admitted.len() >= window {
                state.admitted.pop_front();
            }
            state.admitted.push_back(key.to_owned());
            state.changed = true;
            Admission::Admitted(self.tray.commit_admission(&mut state)?)
        };
        self.tray.start_pump();
        Ok(admission)
    }

    /// Changes the tray's fields without admitting work (no mark, no pump).
    ///
    /// # Errors
    ///
    /// As [`admit`](Self::admit).
    pub fn update<R>(&self, edit: impl FnOnce(&mut T) -> R) -> Result<(R, Receipt), TrayError> {
        let mut state = self.tray.state.lock();
        self.tray.writable(&state)?;
        let answer = self.tray.segment(&mut state, edit)?;
        let receipt = self.tray.commit(&mut state)?;
        Ok((answer, receipt))
    }

    /// Whether the head item hit [`Tray::MAX_ATTEMPTS`]: the pump stopped
    /// and the row stays marked until [`unpark`](Self::unpark).
    pub fn parked(&self) -> bool {
        self.tray.state.lock().parked
    }

    /// Deliveries of the head item so far (durable; 0 when none is under
    /// way).
    pub fn attempts(&self) -> u64 {
        self.tray.state.lock().attempts
    }

    /// Clears the park and the delivery count: the head item is delivered
    /// afresh.
    ///
    /// # Errors
    ///
    /// [`TrayError::NotParked`], and as [`admit`](Self::admit).
    pub fn unpark(&self) -> Result<Receipt, TrayError> {
        let receipt = {
            let mut state = self.tray.state.lock();
            self.tray.writable(&state)?;
            if !state.parked {
                return Err(TrayError::NotParked(self.tray.label()));
            }
            state.parked = false;
            state.attempts = 0;
            state.changed = true;
            OpenTray::<T>::set_marked(&mut state, true);
            self.tray.commit_admission(&mut state)?
        };
        self.tray.start_pump();
        Ok(receipt)
    }

    /// Cancels the handler run under way, if any: its future is dropped and
    /// its item consumed (acked without its `on_ack` edits), never
    /// redelivered. True when a run was cancelled.
    pub fn cancel_dispatch(&self) -> bool {
        let state = self.tray.state.lock();
        match &state.active {
            Some(active) => {
                active.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// Deletes the tray: admits the built-in delete command (durably, so a
    /// crash re-runs it at the next activation), lets a handler run under
    /// way finish, then deletes the row in one write and frees the key.
    /// Resolves once the key is free.
    ///
    /// # Errors
    ///
    /// As [`admit`](Self::admit) when the command cannot be admitted.
    pub async fn delete(&self) -> Result<(), TrayError> {
        {
            let mut state = self.tray.state.lock();
            if state.retired != Some(Retired::Deleted) {
                self.tray.writable(&state)?;
                OpenTray::<T>::set_marked(&mut state, true);
                let command = delete_command();
                if !state.inbox.contains(&command) {
                    state.inbox.push(command);
                    state.changed = true;
                }
                let _receipt = self.tray.commit(&mut state)?;
            }
        }
        self.tray.start_pump();
        Opened::freed(&*self.tray).await;
        Ok(())
    }

    /// Reads ad-hoc storage entry `name` (outside the declared fields).
    ///
    /// # Errors
    ///
    /// [`TrayError::InvalidName`]; a stored entry that does not decode as
    /// `V` ([`TrayError::Malformed`]).
    pub fn storage_get<V: DeserializeOwned>(&self, name: &str) -> Result<Option<V>, TrayError> {
        let state = self.tray.state.lock();
        check_name::<T>(&state.fields, name)?;
        state
            .doc
            .get(name)
            .map(|entry| serde_json::from_str(entry.json()))
            .transpose()
            .map_err(|error| TrayError::Malformed {
                tray: T::NAME.to_owned(),
                key: self.tray.key.clone(),
                reason: format!("storage entry {name:?}: {error}"),
            })
    }

    /// Writes ad-hoc storage entry `name`.
    ///
    /// # Errors
    ///
    /// [`TrayError::InvalidName`], [`TrayError::Encode`], and as
    /// [`admit`](Self::admit).
    pub fn storage_set<V: Serialize + ?Sized>(
        &self,
        name: &str,
        value: &V,
    ) -> Result<Receipt, TrayError> {
        let entry = Entry::of(value).map_err(|error| TrayError::Encode(error.to_string()))?;
        self.storage_put(name, Some(entry))
    }

    /// Deletes ad-hoc storage entry `name`.
    ///
    /// # Errors
    ///
    /// As [`storage_set`](Self::storage_set).
    pub fn storage_delete(&self, name: &str) -> Result<Receipt, TrayError> {
        self.storage_put(name, None)
    }

    fn storage_put(&self, name: &str, entry: Option<Entry>) -> Result<Receipt, TrayError> {
        let mut state = self.tray.state.lock();
        self.tray.writable(&state)?;
        check_name::<T>(&state.fields, name)?;
        state.changed |= state.doc.put(name, entry);
        self.tray.commit(&mut state)
    }
}

/// The trays of keyed tray type `T` on one instance, by key. Get it from
/// [`Context::keyed`](crate::Context::keyed).
pub struct KeyedTrays<T: Tray> {
    trays: Arc<InstanceTrays>,
    tray: PhantomData<fn() -> T>,
}

impl<T: Tray> std::fmt::Debug for KeyedTrays<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedTrays")
            .field("tray", &T::NAME)
            .finish()
    }
}

impl<T: Tray> KeyedTrays<T> {
    pub(crate) fn new(trays: Arc<InstanceTrays>) -> Self {
        Self {
            trays,
            tray: PhantomData,
        }
    }

    /// The tray under `key`, created (with its row) on first use.
    ///
    /// # Errors
    ///
    /// An empty key; a row that does not restore; a store failure.
    pub async fn get_or_create(&self, key: &str) -> Result<TrayHandle<T>, TrayError> {
        self.trays
            .obtain::<T>(key, true, true)
            .await
            .map(TrayHandle::new)
    }

    /// The tray under `key`.
    ///
    /// # Errors
    ///
    /// [`TrayError::NotFound`] for a key never created (or deleted), and as
    /// [`get_or_create`](Self::get_or_create).
    pub async fn get(&self, key: &str) -> Result<TrayHandle<T>, TrayError> {
        self.trays
            .obtain::<T>(key, true, false)
            .await
            .map(TrayHandle::new)
    }

    /// Deletes the tray under `key`, opening it first if it is passivated;
    /// resolves once the key is free.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get) and [`TrayHandle::delete`].
    pub async fn delete(&self, key: &str) -> Result<(), TrayError> {
        self.get(key).await?.delete().await
    }

    /// The keys of the trays open now (passivated ones are not listed).
    pub fn open_keys(&self) -> Vec<String> {
        self.trays.keys::<T>()
    }
}

/// One handler run of tray `T`.
pub struct TrayCtx<T: Tray> {
    pub(super) tray: Arc<OpenTray<T>>,
    ctx: Context,
    attempts: u64,
    state: Option<Json>,
    pub(super) staged: Arc<Mutex<Staged<T>>>,
    cancel: CancellationToken,
    /// The run ended (see [`dispatch`](Self::dispatch)).
    ended: Arc<std::sync::atomic::AtomicBool>,
}

impl<T: Tray> std::fmt::Debug for TrayCtx<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrayCtx")
            .field("tray", &T::NAME)
            .field("key", &self.tray.key)
            .field("attempts", &self.attempts)
            .finish()
    }
}

impl<T: Tray> TrayCtx<T> {
    /// The handle user code gets for one delivery.
    pub(crate) fn new(delivery: Delivery<T>) -> Self {
        Self {
            tray: delivery.tray,
            ctx: delivery.ctx,
            attempts: delivery.attempts,
            state: delivery.state,
            staged: delivery.staged,
            cancel: delivery.cancel,
            ended: delivery.ended,
        }
    }

    /// This delivery's number: 1 on the first, higher after a crash, an
    /// error or a timeout (durable, counted before the handler ran).
    pub fn attempts(&self) -> u64 {
        self.attempts
    }

    /// The tray's key (`~` for a singleton).
    pub fn key(&self) -> &str {
        &self.tray.key
    }

    /// The tray itself (to read it, or admit more work).
    pub fn tray(&self) -> TrayHandle<T> {
        TrayHandle::new(self.tray.clone())
    }

    /// The instance's context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Stages an edit of the tray's fields that lands together with this
    /// item's ack, in the same row write: it happens exactly once, although
    /// the handler may run more than once. Edits apply in the order staged,
    /// only if the handler returns `Ok`.
    pub fn on_ack(&self, edit: impl FnOnce(&mut T) + Send + 'static) {
        self.staged.lock().edits.push(Box::new(edit));
    }

    /// Stages `hook` to run once this item's ack (with its
    /// [`on_ack`](Self::on_ack) edits) is durable in the store: the output
    /// gate for what must never run ahead of the store, such as pushing a
    /// reply to a socket. It runs at most once, only if the handler returns
    /// `Ok` and the ack's write lands; a crash before that runs it never,
    /// and the redelivered item stages it again. A run that stages a hook
    /// writes its ack at once (an ack without one rides the next write).
    ///
    /// Nothing else is gated: a socket send or an HTTP answer made in the
    /// handler itself leaves when it is made (a handler that answers after
    /// a durable write awaits that write's [`Receipt`](super::Receipt)).
    ///
    /// ```
    /// use pinned::tray::{Fields, Log, Queue, Tray, TrayCtx, TrayHandler};
    /// use pinned::{BoxError, Context, Object};
    ///
    /// #[derive(Default)]
    /// struct Inbox { queue: Queue<String>, replies: Log<String> }
    ///
    /// impl Tray for Inbox {
    ///     const NAME: &'static str = "inbox";
    ///     type Item = String;
    ///     fn fields(&mut self, fields: &mut Fields<'_>) {
    ///         fields.field("queue", &mut self.queue);
    ///         fields.field("replies", &mut self.replies);
    ///     }
    ///     fn head(&self) -> Option<String> { self.queue.front().cloned() }
    ///     fn ack(&mut self, _item: &String) { self.queue.pop_front(); }
    /// }
    ///
    /// struct Room;
    /// # impl Object for Room {
    /// #     async fn activate(_: &Context) -> Result<Self, BoxError> { Ok(Room) }
    /// #     fn routes() -> pinned::Routes<Self> { axum::Router::new() }
    /// #     fn trays() -> pinned::tray::Trays<Self> { pinned::tray::Trays::new().singleton::<Inbox>() }
    /// # }
    ///
    /// impl TrayHandler<Inbox> for Room {
    ///     async fn handle(&self, ctx: TrayCtx<Inbox>, item: String) -> Result<(), BoxError> {
    ///         let reply = format!("re: {item}");
    ///         let stored = reply.clone();
    ///         ctx.on_ack(move |inbox| { inbox.replies.append(stored); });
    ///         let room = ctx.context().clone();
    ///         // Sent only once the reply is in the store.
    ///         ctx.after_ack(move || { room.broadcast(None, reply); });
    ///         Ok(())
    ///     }
    /// }
    /// ```
    pub fn after_ack(&self, hook: impl FnOnce() + Send + 'static) {
        self.staged.lock().after.push(Box::new(hook));
    }

    /// This item's dispatch state: what an earlier delivery recorded with
    /// [`set_state`](Self::set_state) (progress through a long item).
    ///
    /// # Errors
    ///
    /// The stored state does not decode as `V`.
    pub fn state<V: DeserializeOwned>(&self) -> Result<Option<V>, TrayError> {
        self.state
            .clone()
            .map(serde_json::from_value)
            .transpose()
            .map_err(|error| TrayError::Malformed {
                tray: T::NAME.to_owned(),
                key: self.tray.key.clone(),
                reason: format!("dispatch state: {error}"),
            })
    }

    /// Durably records this item's dispatch state now; a redelivery reads
    /// it back with [`state`](Self::state); the ack clears it.
    ///
    /// # Errors
    ///
    /// [`TrayError::Encode`], and as [`TrayHandle::admit`].
    pub fn set_state<V: Serialize + ?Sized>(&mut self, value: &V) -> Result<Receipt, TrayError> {
        let value =
            serde_json::to_value(value).map_err(|error| TrayError::Encode(error.to_string()))?;
        let mut state = self.tray.state.lock();
        self.tray.writable(&state)?;
        state.dispatch_state = Some(value.clone());
        state.changed = true;
        self.state = Some(value);
        self.tray.commit(&mut state)
    }

    /// Enlists an effect of the application's own (a write elsewhere) on
    /// the instance's durable log: it runs after everything enlisted before
    /// it landed, and later writes wait for it. A failure aborts the
    /// instance like a failed row write.
    ///
    /// # Errors
    ///
    /// As [`TrayHandle::admit`].
    pub fn enlist<F>(&self, effect: F) -> Result<Receipt, TrayError>
    where
        F: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        self.tray
            .frontier
            .enlist(Effect::Opaque(Box::pin(effect)))?;
        Ok(self.tray.frontier.receipt())
    }

    /// Admits work into `target`, another tray of this instance, at most
    /// once per `key` across redeliveries of this item (the reference's
    /// `ctx.dispatch`): the first run admits `edit` into `target` (marking
    /// it, starting its pump) and records the key in this tray's row; a
    /// re-run finds the record and admits nothing, or, when the record was
    /// lost to a crash, absorbs `edit`'s queue appends because `target`
    /// still holds the key. Both runs answer the outcome of the first.
    ///
    /// `edit` runs as one write segment of `target` and must depend only on
    /// its arguments and `target`'s durable state. Its
    /// [`Queue::push_back`](super::Queue::push_back)s carry the key in the
    /// stored item under `"~admit"` (so each item must serialize as a JSON
    /// object); other writes it makes land on every run. The key is plain
    /// JSON (for instance `["relay", 7]`), at most
    /// [`MAX_ADMISSION_KEY_BYTES`](super::MAX_ADMISSION_KEY_BYTES) of it.
    ///
    /// The rows are the reference's: this tray's `~dispatch` lists the
    /// item's admissions, `target`'s `~ignore` the keys it holds. Before
    /// the item's ack each key is released from its target; the ack drops
    /// the records. Durable with the next write of the instance: await
    /// [`written`](Self::written) to wait for it.
    ///
    /// ```
    /// use pinned::tray::{Dispatched, Fields, Queue, Tray, TrayCtx, TrayHandler};
    /// use pinned::{BoxError, Context, Object};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Clone, Serialize, Deserialize)]
    /// struct Order { n: u64 }
    ///
    /// #[derive(Default)]
    /// struct Intake { queue: Queue<Order> }
    /// #[derive(Default)]
    /// struct Billing { queue: Queue<Order> }
    /// # macro_rules! tray { ($t:ident, $name:literal) => {
    /// impl Tray for $t {
    ///     const NAME: &'static str = $name;
    ///     type Item = Order;
    ///     fn fields(&mut self, fields: &mut Fields<'_>) { fields.field("queue", &mut self.queue); }
    ///     fn head(&self) -> Option<Order> { self.queue.front().cloned() }
    ///     fn ack(&mut self, _: &Order) { self.queue.pop_front(); }
    /// }
    /// # } }
    /// # tray!(Intake, "intake");
    /// # tray!(Billing, "billing");
    ///
    /// struct Shop;
    /// # impl Object for Shop {
    /// #     async fn activate(_: &Context) -> Result<Self, BoxError> { Ok(Shop) }
    /// #     fn routes() -> pinned::Routes<Self> { axum::Router::new() }
    /// #     fn trays() -> pinned::tray::Trays<Self> {
    /// #         pinned::tray::Trays::new().singleton::<Intake>().singleton::<Billing>()
    /// #     }
    /// # }
    /// # impl TrayHandler<Billing> for Shop {
    /// #     async fn handle(&self, _: TrayCtx<Billing>, _: Order) -> Result<(), BoxError> { Ok(()) }
    /// # }
    ///
    /// impl TrayHandler<Intake> for Shop {
    ///     async fn handle(&self, ctx: TrayCtx<Intake>, order: Order) -> Result<(), BoxError> {
    ///         let billing = ctx.context().tray::<Billing>().await?;
    ///         let key = ("bill", order.n);
    ///         let outcome = ctx.dispatch(&billing, &key, |b| b.queue.push_back(order))?;
    ///         // Admitted the first time; Absorbed on a redelivery whose record was lost.
    ///         let _ = outcome == Dispatched::Admitted;
    ///         Ok(())
    ///     }
    /// }
    /// ```
    ///
    /// # Errors
    ///
    /// [`TrayError::AdmissionKey`] for a key longer than the limit;
    /// [`TrayError::Dispatch`] for a target on another instance, a key
    /// this item recorded against another tray, or a call after the
    /// handler's run ended (from a task it left behind); [`TrayError::Malformed`]
    /// for a `~dispatch` or `~ignore` entry that does not decode; and as
    /// [`TrayHandle::admit`] on either tray.
    pub fn dispatch<U: Tray, K: Serialize + ?Sized>(
        &self,
        target: &TrayHandle<U>,
        key: &K,
        edit: impl FnOnce(&mut U),
    ) -> Result<Dispatched, TrayError> {
        // The ledger is the run's: once it ended (its phase two may have
        // released its keys, its ack dropped its records), an admission in
        // its name would land outside both (the reference refuses it too).
        if self.ended.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(TrayError::Dispatch(
                "dispatch after this dispatch settled: the handler's run ended".to_owned(),
            ));
        }
        let key =
            serde_json::to_value(key).map_err(|error| TrayError::Encode(error.to_string()))?;
        let length = serde_json::to_string(&key).map_or(usize::MAX, |text| text.len());
        if length > super::MAX_ADMISSION_KEY_BYTES {
            return Err(TrayError::AdmissionKey);
        }
        if !Arc::ptr_eq(&self.tray.frontier, &target.tray.frontier) {
            return Err(TrayError::Dispatch(format!(
                "{} is not a tray of this instance",
                target.tray.label()
            )));
        }
        let coordinates = (U::NAME.to_owned(), target.tray.key.clone());
        if let Some(record) = self.tray.dispatch_record(&key)? {
            if record.target != coordinates {
                return Err(TrayError::Dispatch(format!(
                    "key {key} was recorded against tray {}/{}",
                    record.target.0, record.target.1
                )));
            }
            return Ok(record.outcome);
        }
        let outcome = target.tray.admit_keyed(&key, edit)?;
        let _receipt = self.tray.record_dispatch(Record {
            key,
            target: coordinates,
            outcome,
            cleaned: false,
        })?;
        Ok(outcome)
    }

    /// Resolves once every write this instance made so far is durable
    /// (this run's [`dispatch`](Self::dispatch)es, [`set_state`](Self::set_state),
    /// [`enlist`](Self::enlist)ed effects, other trays' admissions).
    pub fn written(&self) -> Receipt {
        self.tray.frontier.receipt()
    }

    /// Completes when [`TrayHandle::cancel_dispatch`] cancelled this run.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await;
    }
}
