//! The retry-or-respond phase: after a failed attempt, either set up the
//! next one or end the request on the error.
//!
//! Owns the retry budget (`--proxy-retries`, none for a body that cannot
//! be sent twice), what a retry changes (the cached route dropped, with
//! its owner remembered for the move log; what the next resolution
//! avoids; the backoff) and dropping the route of a request that ends on
//! its worker's failure. Never decides *whether* an
//! error may be retried: that came with the error, from `classify`'s
//! table.

use std::time::Duration;

use super::context::RequestCtx;
use super::error::{ProxyError, ProxyResult};
use crate::app::App;
use crate::placement::PlacementStore;
use crate::routes::Route;

/// `Ok` when another attempt follows (after its backoff), else the error
/// the request ends on.
///
/// # Errors
///
/// `error` itself, when it is not retried or no retry is left.
pub async fn retry_or_respond<S: PlacementStore>(
    app: &App<S>,
    ctx: &mut RequestCtx<'_>,
    route: &Route,
    error: Box<ProxyError>,
) -> ProxyResult<()> {
    let key = ctx.target.key();
    let attempt = ctx.attempts.attempt;
    let retry = match error.retry {
        Some(retry) if attempt < ctx.attempts.retries => retry,
        _ => {
            if error.kind.drops_route() {
                app.routes.lose_sight(key, &route.worker.record.session_id);
            }
            return Err(error);
        }
    };
    app.metrics.proxy_retries.inc();
    app.routes.lose_sight(key, &route.worker.record.session_id);
    let action = retry.action;
    tracing::debug!(target: "pinboard::proxy", key, attempt, ?action, "retrying");
    ctx.attempts.next(action, route);
    if retry.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(retry.delay_ms)).await;
    }
    Ok(())
}
