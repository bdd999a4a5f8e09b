//! [`Opened`]: an open tray as the instance's open map holds it, erased
//! over its type so one map holds trays of many types.
//!
//! Only the contract lives here, at the bottom of the tray modules, so the
//! declarations and the open map can name it without naming the tray
//! itself; `lifecycle` implements it for every typed tray.

use std::any::Any;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::Value as Json;

use super::TrayError;
use crate::instance::Instance;
use crate::namespace::context::Context;

/// An open tray, erased so an instance can hold trays of many types.
pub(crate) trait Opened: Send + Sync {
    fn any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
    /// Reads back what the restored tray keeps in rows of their own (the
    /// newest page of each log) before anyone uses it.
    fn load(self: Arc<Self>) -> BoxFuture<'static, Result<(), TrayError>>;
    /// Starts the pump when the row claims work or the tray is always open.
    fn resume(self: Arc<Self>);
    /// Marked with work a pump could do (not parked, not retired).
    fn pending(&self) -> bool;
    /// Deleted or being deleted.
    fn deleted(&self) -> bool;
    /// Waits until a delete under way finished.
    fn freed(&self) -> BoxFuture<'static, ()>;
    /// Runs `on_open` once (when the object exists), then resumes the pump.
    fn open(
        self: Arc<Self>,
        instance: Instance,
        ctx: Context,
    ) -> BoxFuture<'static, Result<(), TrayError>>;
    /// Releases a keyed admission's `key` from the tray's `~ignore`
    /// (phase two of the dispatch that admitted it).
    fn release(&self, key: &Json) -> Result<(), TrayError>;
    /// The operator's controls on this tray.
    fn operated(self: Arc<Self>) -> Arc<dyn super::operate::Operated>;
    /// Runs `on_close` (after `open`), logging a failure.
    fn close(self: Arc<Self>, instance: Instance, ctx: Context) -> BoxFuture<'static, ()>;
}
