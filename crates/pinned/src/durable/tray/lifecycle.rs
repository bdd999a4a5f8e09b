//! An open tray's life as the open map sees it: the [`Opened`] impl that
//! opens a typed tray (runs `on_open` once, then resumes its pump), closes
//! it (runs `on_close`) and says whether it holds work or was deleted.
//!
//! It sits above the pump, which it starts; it never writes a row.

use std::any::Any;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use super::machine::{OpenTray, Retired, CLOSED, OPEN, OPENING};
use super::opened::Opened;
use super::{Tray, TrayError};
use crate::instance::Instance;
use crate::namespace::context::Context;

impl<T: Tray> Opened for OpenTray<T> {
    fn any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }

    fn load(self: Arc<Self>) -> BoxFuture<'static, Result<(), TrayError>> {
        Box::pin(async move { self.load_pages().await })
    }

    fn resume(self: Arc<Self>) {
        if self.opened.load(Ordering::SeqCst) != OPEN {
            return;
        }
        let start = {
            let state = self.state.lock();
            state.marked || self.always_open
        };
        if start {
            self.start_pump();
        }
        self.start_courier();
    }

    fn operated(self: Arc<Self>) -> Arc<dyn super::operate::Operated> {
        self
    }

    fn pending(&self) -> bool {
        let state = self.state.lock();
        state.marked && !state.parked && state.retired.is_none()
    }

    fn deleted(&self) -> bool {
        self.state.lock().retired == Some(Retired::Deleted)
    }

    fn freed(&self) -> BoxFuture<'static, ()> {
        let mut freed = self.freed.subscribe();
        Box::pin(async move {
            let _ = freed.wait_for(|freed| *freed).await;
        })
    }

    fn open(
        self: Arc<Self>,
        instance: Instance,
        ctx: Context,
    ) -> BoxFuture<'static, Result<(), TrayError>> {
        Box::pin(async move {
            if self
                .opened
                .compare_exchange(CLOSED, OPENING, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                return Ok(());
            }
            let hook = (self.on_open)(instance, ctx, self.clone());
            let failure = match std::panic::AssertUnwindSafe(hook).catch_unwind().await {
                Ok(Ok(())) => None,
                Ok(Err(error)) => Some(error.to_string()),
                Err(panic) => Some(crate::namespace::panic_message(panic.as_ref())),
            };
            if let Some(reason) = failure {
                self.opened.store(CLOSED, Ordering::SeqCst);
                return Err(TrayError::Hook {
                    tray: self.label(),
                    reason,
                });
            }
            self.opened.store(OPEN, Ordering::SeqCst);
            self.resume();
            Ok(())
        })
    }

    fn release(&self, key: &serde_json::Value) -> Result<(), TrayError> {
        OpenTray::release(self, key)
    }

    fn close(self: Arc<Self>, instance: Instance, ctx: Context) -> BoxFuture<'static, ()> {
        Box::pin(async move { self.run_close(instance, ctx).await })
    }
}
