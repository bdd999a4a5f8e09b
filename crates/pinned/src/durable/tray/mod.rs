//! Trays: durable work queues inside an instance.
//!
//! A tray is a struct of durable fields ([`Value`], [`Queue`], [`Outbox`],
//! and [`Log`], whose pages live in rows beside it) kept in one row of the
//! worker's state store, plus a handler that the
//! tray's pump drives its items through, at least once, across crashes,
//! evictions and moves between workers. The rows are the Python
//! reference's (`tray_ns` = the tray's [`NAME`](Tray::NAME), singleton id
//! `~`, one doc entry per field), so a Python worker and a Rust worker can
//! take over each other's trays on a shared store.
//!
//! ```
//! use pinned::tray::{Fields, Queue, Tray, TrayCtx, TrayHandler, Trays, Value};
//! use pinned::{BoxError, Context, Object, Routes};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Clone, Serialize, Deserialize)]
//! struct Job { name: String }
//!
//! #[derive(Default)]
//! struct Jobs { queue: Queue<Job>, done: Value<Vec<String>> }
//!
//! impl Tray for Jobs {
//!     const NAME: &'static str = "jobs";
//!     type Item = Job;
//!     fn fields(&mut self, fields: &mut Fields<'_>) {
//!         fields.field("queue", &mut self.queue);
//!         fields.field("done", &mut self.done);
//!     }
//!     // Derived from durable state only: the head of the queue.
//!     fn head(&self) -> Option<Job> { self.queue.front().cloned() }
//!     // The durable ack, in the same store write as the handler's `on_ack` edits.
//!     fn ack(&mut self, _job: &Job) { self.queue.pop_front(); }
//! }
//!
//! struct Runner;
//!
//! impl Object for Runner {
//!     async fn activate(_ctx: &Context) -> Result<Self, BoxError> { Ok(Runner) }
//!     fn routes() -> Routes<Self> { axum::Router::new() }
//!     fn trays() -> Trays<Self> { Trays::new().singleton::<Jobs>() }
//! }
//!
//! impl TrayHandler<Jobs> for Runner {
//!     async fn handle(&self, ctx: TrayCtx<Jobs>, job: Job) -> Result<(), BoxError> {
//!         // ... the work ...
//!         ctx.on_ack(move |jobs| jobs.done.push(job.name));
//!         Ok(())
//!     }
//! }
//!
//! // In a request handler:
//! # async fn enqueue(ctx: pinned::Context, job: Job) -> Result<(), BoxError> {
//! let jobs = ctx.tray::<Jobs>().await?;
//! jobs.admit(|jobs| jobs.queue.push_back(job))?.await?; // durable now
//! # Ok(())
//! # }
//! ```
//!
//! Guarantees: an admission's mark and payload land in one row write; a
//! handler runs at least once per item (its attempt is durable before it
//! runs); its [`on_ack`](TrayCtx::on_ack) edits and the ack land in one row
//! write, so effects on the tray's own state happen exactly once.
//!
//! # How the tray modules stack
//!
//! Each file imports only from the ones below it (and this one), bottom
//! to top:
//!
//! 1. `paged`: the contract of a field kept in page rows of its own;
//!    `keyed`: the contract of a field a keyed admission tags; then
//!    `field`, `row`, `frontier`: the durable field kinds, a row's encoded
//!    entries, the instance's ordered log of effects; then `log`: the
//!    paged field kind [`Log`]; `sends` and `received`: the reserved
//!    entries of messages between objects (a sender's `~outgoing`, a
//!    receiver's `~received`);
//! 2. `opened`: the erased open tray the open map holds; `env`: what an
//!    open tray is given (its slot, the log, the store, the map as an
//!    `OpenMap`); `pages`: a paged field's rows, named and read;
//! 3. `spec`: the declarations as plain data, their opener a function
//!    pointer over the two above;
//! 4. `machine`: one open tray, its state and its one write path; then
//!    `dispatch`: the two-phase ledger of keyed cross-tray admissions;
//! 5. `pump`: the dispatch loop over `machine`; `courier`: the loop that
//!    delivers a tray's sent messages; `lifecycle`: opening and closing a
//!    tray for the map, which starts both;
//! 6. `open`: the open map of one instance, which builds the `env` once;
//! 7. `handle`: what user code holds (`TrayHandle`, `KeyedTrays`,
//!    `TrayCtx`); `message`: messages between objects as user code sees
//!    them ([`Receive`], [`Recipient`], the sends) and the route that
//!    admits them;
//! 8. `declare`: [`Trays`], the one place that knows the object's type; its
//!    opener binds the object's handler into the tray, wrapping what the
//!    tray hands over into `handle`'s types.
//!
//! A tray reaches up only through what it is given: the map through
//! `env`, the handler and hooks through function pointers. `wake` stands
//! apart: it activates instances whose rows claim work, naming none of
//! the above. `python3 shared/tools/import_circles.py` finds any circle.

use std::future::Future;
use std::time::Duration;

use crate::{BoxError, Context};

// Bottom to top, a group a step of the order in the module docs (rustfmt
// sorts the files within a group by name, not by rank).
mod keyed;
mod paged;

mod field;
mod frontier;
mod row;

mod log;
mod received;
mod sends;

mod env;
mod opened;
mod pages;

mod spec;

pub(crate) mod machine;

mod courier;
mod dispatch;
mod lifecycle;
mod pump;

mod open;

mod handle;
mod message;

mod declare;

pub(crate) mod operate;
pub(crate) mod wake;

pub use declare::Trays;
pub use dispatch::Dispatched;
pub use field::{Entry, Field, FieldError, Fields, Outbox, Queue, Value};
pub use frontier::Receipt;
pub use handle::{Admission, KeyedTrays, TrayCtx, TrayHandle};
pub use log::{Log, LogRead, LogSlice};
pub use message::{Receive, Recipient};

pub(crate) use courier::MESSAGE_PATH;
pub(crate) use message::{admit as admit_message, Receiver};
pub(crate) use open::InstanceTrays;
pub(crate) use spec::Declared;

/// The singleton tray's id in its row (`tray_id`).
pub const SINGLETON_ID: &str = pinned_store::SINGLETON_TRAY_ID;

/// Default [`Tray::MAX_ATTEMPTS`].
pub const DEFAULT_MAX_ATTEMPTS: u64 = 10;

/// Default [`Tray::DISPATCH_TIMEOUT`]: 12 hours.
pub const DEFAULT_DISPATCH_TIMEOUT: Duration = Duration::from_secs(43_200);

/// Default [`Tray::ADMISSION_WINDOW`].
pub const DEFAULT_ADMISSION_WINDOW: usize = 128;

/// Largest [`Tray::ADMISSION_WINDOW`] honoured: the keys live in the
/// tray's row, written with every change of it.
pub const MAX_ADMISSION_WINDOW: usize = 4096;

/// Longest admission key, in bytes.
pub const MAX_ADMISSION_KEY_BYTES: usize = 200;

/// Default [`Tray::SENDER_WINDOW`].
pub const DEFAULT_SENDER_WINDOW: usize = 256;

/// Largest [`Tray::SENDER_WINDOW`] honoured: the marks live in the tray's
/// row, written with every change of it.
pub const MAX_SENDER_WINDOW: usize = 4096;

/// Largest message a send takes, in bytes of its JSON.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Most messages one tray keeps waiting for their receivers' answers.
pub const MAX_OUTGOING: usize = 1024;

/// Most bytes of messages one tray keeps waiting for their receivers'
/// answers: they live in its row.
pub const MAX_OUTGOING_BYTES: usize = 1024 * 1024;

/// How many tray handlers run at once in one process, across all instances.
pub const MAX_CONCURRENT_DISPATCHES: usize = 256;

/// A tray: durable fields and how items are derived from them.
///
/// The type's `Default` is the tray's initial state (a fresh row); its
/// fields are restored from the stored row on every hydration.
pub trait Tray: Default + Send + Sync + 'static {
    /// The tray's name: the row's `tray_ns` (for rows shared with Python
    /// workers, the `@tray` attribute name there). Must not be `pinned`.
    const NAME: &'static str;
    /// The schema version: a stored row of another version is discarded
    /// (the tray activates blank, and a stale mark is dropped).
    const VERSION: i64 = 0;
    /// Deliveries of one item before the tray parks it.
    const MAX_ATTEMPTS: u64 = DEFAULT_MAX_ATTEMPTS;
    /// How long one handler run may take before it is cancelled and the
    /// item redelivered.
    const DISPATCH_TIMEOUT: Duration = DEFAULT_DISPATCH_TIMEOUT;
    /// Keep dispatching while the instance winds down (for intake trays
    /// whose queued work must finish before release); by default the pump
    /// pauses and the next owner resumes it.
    const DRAIN_ON_EVICTION: bool = false;
    /// How many admission keys of [`TrayHandle::admit_once`] the tray
    /// remembers (the newest; at most [`MAX_ADMISSION_WINDOW`]): a repeat
    /// of one of them admits nothing. They live in the tray's row.
    const ADMISSION_WINDOW: usize = DEFAULT_ADMISSION_WINDOW;
    /// For a tray that [receives](Receive) messages: how many senders'
    /// marks it keeps (at most [`MAX_SENDER_WINDOW`]), the least recently
    /// heard forgotten first. They live in the tray's row.
    const SENDER_WINDOW: usize = DEFAULT_SENDER_WINDOW;

    /// What one item is.
    type Item: Clone + Send + 'static;

    /// Lists the durable fields with their doc entry names.
    fn fields(&mut self, fields: &mut Fields<'_>);

    /// The item to dispatch next, derived from durable state only; `None`
    /// when there is no work.
    fn head(&self) -> Option<Self::Item>;

    /// Acknowledges `item`, the last head: the durable ack (usually popping
    /// it). It lands in the same row write as the handler's
    /// [`on_ack`](TrayCtx::on_ack) edits.
    fn ack(&mut self, item: &Self::Item);
}

/// The handler of tray `T` on an object: runs each item of `T` at least
/// once.
///
/// An error or a panic redelivers the item (after a short back-off, with
/// [`TrayCtx::attempts`] one higher); after [`Tray::MAX_ATTEMPTS`]
/// deliveries the tray parks until [`TrayHandle::unpark`]. To keep one
/// item's failure from parking the tray, catch it and return `Ok`.
pub trait TrayHandler<T: Tray>: Send + Sync + Sized + 'static {
    /// Handles one item.
    fn handle(
        &self,
        ctx: TrayCtx<T>,
        item: T::Item,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;

    /// Runs each time tray `T` opens on this instance (hydrated from its
    /// row, or created), before its pump starts: the place to mount what
    /// the tray's handler needs for this hydration. An error refuses the
    /// opening (at activation, the activation fails).
    fn on_open(
        &self,
        ctx: &Context,
        tray: &TrayHandle<T>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send {
        let _ = (ctx, tray);
        async { Ok(()) }
    }

    /// Runs when the open tray closes: it passivated (drained dry), it was
    /// deleted, or the instance is being torn down. Errors are logged.
    fn on_close(
        &self,
        ctx: &Context,
        tray: &TrayHandle<T>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send {
        let _ = (ctx, tray);
        async { Ok(()) }
    }
}

/// Why a tray operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrayError {
    /// The worker has no state store, so it cannot hold trays.
    #[error("trays require a state store (Options::store)")]
    NoStore,
    /// The object does not declare this tray type (in [`Object::trays`](crate::Object::trays)),
    /// or declares it with the other kind (singleton vs keyed).
    #[error("tray {0:?} is not declared on this object with that kind")]
    NotDeclared(&'static str),
    /// [`KeyedTrays::get`]: no tray with that key was ever created.
    #[error("tray {tray}/{key} does not exist")]
    NotFound {
        /// The tray name.
        tray: &'static str,
        /// The key asked for.
        key: String,
    },
    /// A keyed tray's key is empty.
    #[error("a keyed tray needs a non-empty key")]
    EmptyKey,
    /// The tray was deleted (or is being deleted); its key is free again
    /// once the delete finished.
    #[error("tray {0} is deleted; writes are rejected")]
    Deleted(String),
    /// [`TrayHandle::unpark`] on a tray that is not parked.
    #[error("tray {0} is not parked")]
    NotParked(String),
    /// An ad-hoc storage name is empty, reserved (starts with `~`), or a
    /// declared field's.
    #[error("invalid tray storage name {0:?}: it must be non-empty, not start with '~', and not name a declared field")]
    InvalidName(String),
    /// The stored row does not restore: a malformed field entry, a marked
    /// row of an undeclared tray, a kind mismatch.
    #[error("tray row {tray}/{key} does not restore: {reason}")]
    Malformed {
        /// The row's `tray_ns`.
        tray: String,
        /// The row's `tray_id`.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A value did not serialize to JSON; the instance was aborted so its
    /// memory does not run ahead of the store.
    #[error("tray value does not serialize: {0}")]
    Encode(String),
    /// A store call failed.
    #[error(transparent)]
    Store(#[from] pinned_store::StoreError),
    /// An earlier durable write failed: the instance was aborted and no
    /// later write can land.
    #[error("durable effects are poisoned: {0}")]
    Poisoned(String),
    /// The instance is closed.
    #[error("the instance is closed")]
    Closed,
    /// [`TrayHandler::on_open`] failed: the tray did not open.
    #[error("tray {tray} did not open: {reason}")]
    Hook {
        /// `tray_ns/tray_id`.
        tray: String,
        /// The hook's error.
        reason: String,
    },
    /// An admission closure panicked: the instance was aborted.
    #[error("a tray write segment panicked; the instance was aborted")]
    Panicked,
    /// An admission key of [`TrayHandle::admit_once`] is empty or longer
    /// than [`MAX_ADMISSION_KEY_BYTES`] (for [`TrayCtx::dispatch`], its JSON
    /// text).
    #[error("an admission key must be 1 to 200 bytes long")]
    AdmissionKey,
    /// A send's recipient is not a valid namespace, id and tray key.
    #[error("invalid message recipient: {0}")]
    Recipient(String),
    /// A message's JSON is larger than [`MAX_MESSAGE_BYTES`], or does not
    /// serialize.
    #[error("a message must serialize to at most 65536 bytes of JSON: {0}")]
    Message(String),
    /// The tray's sends waiting for an answer would pass [`MAX_OUTGOING`]
    /// messages or [`MAX_OUTGOING_BYTES`]: retry once receivers answered.
    #[error("too many messages waiting to be delivered ({letters} messages, {bytes} bytes)")]
    OutboxFull {
        /// Messages waiting, with this send.
        letters: usize,
        /// Their bytes, with this send.
        bytes: usize,
    },
    /// [`TrayCtx::dispatch`] was refused: the target tray is on another
    /// instance, the key was recorded against another tray, or the
    /// handler's run had ended.
    #[error("tray dispatch refused: {0}")]
    Dispatch(String),
}
