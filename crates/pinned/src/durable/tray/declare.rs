//! [`Trays`]: which tray types an object declares, built once per hosted
//! namespace from [`Object::trays`](crate::Object::trays).
//!
//! A declaration is a name, a kind (singleton, keyed, keyed and always
//! open) and a monomorphized opener that builds the typed tray from a row.
//! Nothing here touches a store or an instance.

use std::any::TypeId;
use std::marker::PhantomData;
use std::sync::Arc;

use pinned_store::Doc;

use super::machine::{self, Opened};
use super::open::InstanceTrays;
use super::{Tray, TrayError, TrayHandler};
use crate::durable::store::RESERVED_TRAY_NS;

/// Builds the typed tray of one declaration from its row (`None`: a fresh
/// row).
pub(crate) type OpenFn = fn(
    &Arc<InstanceTrays>,
    &Spec,
    String,
    Option<(bool, Doc)>,
) -> Result<Arc<dyn Opened>, TrayError>;

/// One declared tray type.
pub(crate) struct Spec {
    pub(crate) name: &'static str,
    pub(crate) type_id: TypeId,
    pub(crate) keyed: bool,
    pub(crate) always_open: bool,
    pub(crate) open: OpenFn,
}

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
            object: PhantomData,
        }
    }

    /// Declares the singleton tray `T` (row id `~`): opened at every
    /// activation, reached with [`Context::tray`](crate::Context::tray).
    ///
    /// # Panics
    ///
    /// When a tray named `T::NAME` is declared already, or the name is
    /// empty or `pinned`.
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
        assert!(
            !name.is_empty() && name != RESERVED_TRAY_NS,
            "tray name {name:?} is empty or reserved"
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
            open: machine::open::<O, T>,
        });
        self
    }

    pub(crate) fn into_declared(self) -> Declared {
        Declared { specs: self.specs }
    }
}

/// A namespace's declared trays.
#[derive(Default)]
pub(crate) struct Declared {
    pub(crate) specs: Vec<Spec>,
}

impl Declared {
    pub(crate) fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    pub(crate) fn by_name(&self, name: &str) -> Option<&Spec> {
        self.specs.iter().find(|spec| spec.name == name)
    }

    /// The declaration of tray type `T` as `keyed` (or not).
    pub(crate) fn of<T: Tray>(&self, keyed: bool) -> Result<&Spec, TrayError> {
        self.by_name(T::NAME)
            .filter(|spec| spec.type_id == TypeId::of::<T>() && spec.keyed == keyed)
            .ok_or(TrayError::NotDeclared(T::NAME))
    }
}
