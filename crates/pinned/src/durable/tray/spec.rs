//! The tray declarations of one hosted namespace as plain data: a
//! [`Spec`] per declared tray type (its name, kind and opener) and the
//! namespace's [`Declared`] list.
//!
//! The builder that fills them (`declare`, above every other tray module)
//! is the one place that knows the object's type; here the opener is only
//! a function pointer whose signature names nothing above this file. Nothing
//! here touches a store or an instance.

use std::any::TypeId;
use std::sync::Arc;

use pinned_store::Doc;

use super::env::TrayEnv;
use super::opened::Opened;
use super::{Tray, TrayError};

/// Builds the typed tray of one declaration from its row (`None`: a fresh
/// row), in the surroundings its instance gives it.
pub(crate) type OpenFn =
    fn(&TrayEnv, &Spec, String, Option<(bool, Doc)>) -> Result<Arc<dyn Opened>, TrayError>;

/// One declared tray type.
pub(crate) struct Spec {
    pub(crate) name: &'static str,
    pub(crate) type_id: TypeId,
    pub(crate) keyed: bool,
    pub(crate) always_open: bool,
    pub(crate) open: OpenFn,
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
