//! The resolve phase: the route this attempt goes to, from the route
//! directory (`crate::routes`), avoiding what earlier attempts learned.
//!
//! Owns what a failed resolution tells the client (a fleet that refused
//! for capacity is full, not gone); never retries itself: the directory
//! already re-reads the store where that can help.

use std::sync::Arc;

use super::context::RequestCtx;
use super::error::{ErrorKind, ProxyResult};
use crate::app::App;
use crate::placement::PlacementStore;
use crate::routes::{ResolveError, Route};

/// The route of this attempt; notes in `ctx` whether it claimed the id.
///
/// # Errors
///
/// [`ErrorKind::Unresolved`], or [`ErrorKind::FleetFull`] when no worker
/// is left after one refused for capacity. Never retried.
pub async fn resolve<S: PlacementStore>(
    app: &App<S>,
    ctx: &mut RequestCtx<'_>,
) -> ProxyResult<Arc<Route>> {
    let view = ctx.view.take();
    let resolved = app
        .routes
        .resolve_claiming_in(
            view,
            ctx.target.key(),
            ctx.target.ns(),
            ctx.target.id(),
            ctx.scope(),
            ctx.attempts.avoid(),
        )
        .await;
    match resolved {
        Ok((route, claimed)) => {
            ctx.attempts.claimed = claimed;
            Ok(route)
        }
        Err(ResolveError::NoWorker) if ctx.attempts.full => Err(ErrorKind::FleetFull.into()),
        Err(e) => Err(ErrorKind::Unresolved(e).into()),
    }
}
