//! [`Trays`]: which tray types an object declares, built once per hosted
//! namespace from [`Object::trays`](crate::Object::trays).
//!
//! A declaration is a name, a kind (singleton, keyed, keyed and always
//! open) and a monomorphized opener that builds the typed tray from a row.
//! This is the one place that knows both the object's type and the tray's,
//! so it sits above every other tray module: its opener binds the object's
//! [`TrayHandler`] into the tray as plain function pointers, wrapping what
//! the tray hands them into the user-facing [`TrayCtx`] and [`TrayHandle`].
//! Nothing here touches a store or an instance.

use std::any::TypeId;
use std::marker::PhantomData;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use pinned_store::Doc;

use super::env::TrayEnv;
use super::handle::{TrayCtx, TrayHandle};
use super::machine::{self, Delivery, Hooks, OpenTray};
use super::message::{Receive, Receiver};
use super::opened::Opened;
use super::spec::{Declared, Spec};
use super::{Tray, TrayError, TrayHandler};
use crate::durable::store::RESERVED_TRAY_NS;
use crate::instance::Instance;
use crate::namespace::context::Context;
use crate::BoxError;

/// The tray types an object declares, returned from
/// [`Object::trays`](crate::Object::trays).
///
/// ```
/// # use pinned::tray::{Fields, Queue, Tray, TrayCtx, TrayHandler, Trays};
/// # use pinned::{BoxError, Context, Object, Routes};
/// # #[derive(Default)] struct Jobs { queue: Queue<u32> }
/// # impl Tray for Jobs {
/// #     const NAME: &'static str = "jobs";
/// #     type Item = u32;
/// #     fn fields(&mut self, f: &mut Fields<'_>) { f.field("queue", &mut self.queue) }
/// #     fn head(&self) -> Option<u32> { self.queue.front().copied() }
/// #     fn ack(&mut self, _: &u32) { self.queue.pop_front(); }
/// # }
/// # #[derive(Default)] struct Inbox { queue: Queue<u32> }
/// # impl Tray for Inbox {
/// #     const NAME: &'static str = "inbox";
/// #     type Item = u32;
/// #     fn fields(&mut self, f: &mut Fields<'_>) { f.field("queue", &mut self.queue) }
/// #     fn head(&self) -> Option<u32> { self.queue.front().copied() }
/// #     fn ack(&mut self, _: &u32) { self.queue.pop_front(); }
/// # }
/// # struct Runner;
/// # impl TrayHandler<Jobs> for Runner { async fn handle(&self, _: TrayCtx<Jobs>, _: u32) -> Result<(), BoxError> { Ok(()) } }
/// # impl TrayHandler<Inbox> for Runner { async fn handle(&self, _: TrayCtx<Inbox>, _: u32) -> Result<(), BoxError> { Ok(()) } }
/// impl Object for Runner {
/// #   async fn activate(_: &Context) -> Result<Self, BoxError> { Ok(Runner) }
/// #   fn routes() -> Routes<Self> { axum::Router::new() }
///     fn trays() -> Trays<Self> {
///         Trays::new()
///             .singleton::<Jobs>()   // one per instance, open whenever the instance is
///             .keyed::<Inbox>()      // one per key, opened on use
///     }
/// }
/// ```
pub struct Trays<O> {
    specs: Vec<Spec>,
    receivers: Vec<Receiver>,
    object: PhantomData<fn() -> O>,
}

impl<O> std::fmt::Debug for Trays<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.specs.iter().map(|spec| spec.name))
            .finish()
    }
}

impl<O: Send + Sync + 'static> Default for Trays<O> {
    fn default() -> Self {
        Self::new()
    }
}

impl<O: Send + Sync + 'static> Trays<O> {
    /// No trays.
    pub fn new() -> Self {
        Self {
            specs: Vec::new(),
            receivers: Vec::new(),
            object: PhantomData,
        }
    }

    /// Declares the singleton tray `T` (row id `~`): opened at every
    /// activation, reached with [`Context::tray`](crate::Context::tray).
    ///
    /// # Panics
    ///
    /// When a tray named `T::NAME` is declared already, or the name is
    /// empty, `pinned` or holds `~`.
    pub fn singleton<T: Tray>(self) -> Self
    where
        O: TrayHandler<T>,
    {
        self.declare::<T>(false, true)
    }

    /// Declares the keyed tray type `T`, one tray per key, reached with
    /// [`Context::keyed`](crate::Context::keyed). A keyed tray opens on use
    /// (and at activation when its row is marked) and passivates when it
    /// drains dry.
    ///
    /// # Panics
    ///
    /// As [`singleton`](Self::singleton).
    pub fn keyed<T: Tray>(self) -> Self
    where
        O: TrayHandler<T>,
    {
        self.declare::<T>(true, false)
    }

    /// Like [`keyed`](Self::keyed), but every stored tray of the type opens
    /// at activation and stays open.
    ///
    /// # Panics
    ///
    /// As [`singleton`](Self::singleton).
    pub fn keyed_always_open<T: Tray>(self) -> Self
    where
        O: TrayHandler<T>,
    {
        self.declare::<T>(true, true)
    }

    fn declare<T: Tray>(mut self, keyed: bool, always_open: bool) -> Self
    where
        O: TrayHandler<T>,
    {
        let name = T::NAME;
        // `~` never appears in a tray name, so the page rows of a log
        // (`<tray>~<field>`) can never be read as a tray.
        assert!(
            !name.is_empty() && name != RESERVED_TRAY_NS && !name.contains('~'),
            "tray name {name:?} is empty, reserved or holds '~'"
        );
        assert!(
            self.specs.iter().all(|spec| spec.name != name),
            "tray {name:?} is declared twice"
        );
        self.specs.push(Spec {
            name,
            type_id: TypeId::of::<T>(),
            keyed,
            always_open,
            open: open::<O, T>,
        });
        self
    }

    /// Lets other objects send messages to the declared tray `T`
    /// (`POST /<ns>/<id>/_pinned/messages`, from attested instances only):
    /// see [`Receive`].
    ///
    /// # Panics
    ///
    /// When `T` is not declared (before this call) or takes messages
    /// already.
    pub fn receives<T: Receive>(mut self) -> Self {
        let Some(spec) = self
            .specs
            .iter()
            .find(|spec| spec.type_id == TypeId::of::<T>())
        else {
            panic!("tray {:?} must be declared before it receives", T::NAME);
        };
        assert!(
            self.receivers.iter().all(|r| r.name != T::NAME),
            "tray {:?} receives twice",
            T::NAME
        );
        self.receivers.push(Receiver::of::<T>(spec.keyed));
        self
    }

    /// The trays that take messages.
    pub(crate) fn receivers(&self) -> Arc<[Receiver]> {
        self.receivers.iter().cloned().collect()
    }

    pub(crate) fn into_declared(self) -> Declared {
        Declared { specs: self.specs }
    }
}

/// The instance's object as an `O`.
fn object<O: Send + Sync + 'static>(instance: Instance) -> Result<Arc<O>, BoxError> {
    instance
        .downcast::<O>()
        .map_err(|_| BoxError::from("a tray reached an instance of another object type"))
}

fn handler<O: TrayHandler<T>, T: Tray>(
    instance: Instance,
    delivery: Delivery<T>,
    item: T::Item,
) -> BoxFuture<'static, Result<(), BoxError>> {
    let ctx = TrayCtx::new(delivery);
    Box::pin(async move { object::<O>(instance)?.handle(ctx, item).await })
}

fn on_open<O: TrayHandler<T>, T: Tray>(
    instance: Instance,
    ctx: Context,
    tray: Arc<OpenTray<T>>,
) -> BoxFuture<'static, Result<(), BoxError>> {
    let tray = TrayHandle::new(tray);
    Box::pin(async move { object::<O>(instance)?.on_open(&ctx, &tray).await })
}

fn on_close<O: TrayHandler<T>, T: Tray>(
    instance: Instance,
    ctx: Context,
    tray: Arc<OpenTray<T>>,
) -> BoxFuture<'static, Result<(), BoxError>> {
    let tray = TrayHandle::new(tray);
    Box::pin(async move { object::<O>(instance)?.on_close(&ctx, &tray).await })
}

/// Opens tray `T` of object `O` from its row (`None`: a fresh row, written
/// at once so a created tray lives until deleted).
fn open<O: TrayHandler<T>, T: Tray>(
    env: &TrayEnv,
    spec: &Spec,
    key: String,
    row: Option<(bool, Doc)>,
) -> Result<Arc<dyn Opened>, TrayError> {
    let hooks = Hooks {
        handler: handler::<O, T>,
        on_open: on_open::<O, T>,
        on_close: on_close::<O, T>,
    };
    Ok(machine::restore(env, spec, key, row, hooks)?)
}
