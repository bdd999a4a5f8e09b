//! Resolution: `(ns, id)` → its [`Route`]: the cached route while its
//! owner is in the live worker view, else the store's live owner, else a
//! new placement ([`claim`](super::claim)).
//!
//! Owns the order of those three and the errors a caller sees; never
//! sends anything to a worker.

use std::sync::Arc;

use super::claim::Round;
use super::workers::View;
use super::{no_worker, Avoid, Lookup, ResolveError, Route, Routes};
use crate::operator::moves::MovedBy;
use crate::placement::PlacementStore;
use crate::world::Scope;

/// Store reads one resolution makes at most before giving up (a candidate
/// or an owner that vanished between the read and the claim).
const ROUNDS: usize = 3;

impl<S: PlacementStore> Routes<S> {
    /// Resolve `(ns, id)` (cache key `key`): cached route, else the store's
    /// live owner, else a new placement on a live undrained host of `ns`.
    ///
    /// # Errors
    ///
    /// [`ResolveError`]: no worker, quarantine, or a store failure.
    pub async fn resolve(
        &self,
        key: &str,
        ns: &str,
        id: &str,
        scope: Scope<'_>,
        avoid: Avoid<'_>,
    ) -> Result<Arc<Route>, ResolveError> {
        Ok(self.resolve_claiming(key, ns, id, scope, avoid).await?.0)
    }

    /// As [`resolve`](Self::resolve) for `by`: a claim it makes that moves
    /// the id is recorded as made by it (the sweeper's calls say so).
    ///
    /// # Errors
    ///
    /// [`ResolveError`]: no worker, quarantine, or a store failure.
    pub async fn resolve_as(
        &self,
        by: MovedBy,
        key: &str,
        ns: &str,
        id: &str,
        scope: Scope<'_>,
        avoid: Avoid<'_>,
    ) -> Result<Arc<Route>, ResolveError> {
        let lookup = Lookup {
            key,
            ns,
            id,
            scope,
            by,
        };
        Ok(self.resolve_lookup(None, lookup, avoid).await?.0)
    }

    /// As [`resolve`](Self::resolve), and whether this call claimed the id
    /// (a new placement) rather than finding an owner.
    ///
    /// # Errors
    ///
    /// [`ResolveError`]: no worker, quarantine, or a store failure.
    pub async fn resolve_claiming(
        &self,
        key: &str,
        ns: &str,
        id: &str,
        scope: Scope<'_>,
        avoid: Avoid<'_>,
    ) -> Result<(Arc<Route>, bool), ResolveError> {
        self.resolve_claiming_in(None, key, ns, id, scope, avoid)
            .await
    }

    /// As [`resolve_claiming`](Self::resolve_claiming), on `view` (read
    /// for this request already, [`view`](Self::view)) rather than a
    /// second read of the worker view, unless `avoid` asks for a fresh one.
    ///
    /// # Errors
    ///
    /// [`ResolveError`]: no worker, quarantine, or a store failure.
    pub async fn resolve_claiming_in(
        &self,
        view: Option<View>,
        key: &str,
        ns: &str,
        id: &str,
        scope: Scope<'_>,
        avoid: Avoid<'_>,
    ) -> Result<(Arc<Route>, bool), ResolveError> {
        let lookup = Lookup {
            key,
            ns,
            id,
            scope,
            by: MovedBy::Request,
        };
        self.resolve_lookup(view, lookup, avoid).await
    }

    async fn resolve_lookup(
        &self,
        mut view: Option<View>,
        lookup: Lookup<'_>,
        avoid: Avoid<'_>,
    ) -> Result<(Arc<Route>, bool), ResolveError> {
        let Lookup { key, ns, scope, .. } = lookup;
        if avoid.stale.is_none() && !avoid.refresh {
            if let Some(r) = self.cached(key) {
                // A cached owner is trusted only while it is in the live
                // worker view (refreshed at most every `refresh_ms`, so this
                // costs no store call per request): a frozen or dead owner
                // answers nothing at all, and must lose its ids once its
                // lease lapsed, not after a client timeout. Why it went is
                // the next claim's to say (see `claim`): the store knows,
                // unless it lost the row.
                let snap = match view.take() {
                    Some(View(snap)) => snap,
                    None => self.workers(false).await?,
                };
                if snap.by_session.contains_key(&r.worker.record.session_id) {
                    // Routes are cached per id (ids are global); the world
                    // is checked on every hit.
                    if !scope.admits(&r.worker.record, ns) {
                        return Err(ResolveError::OtherWorld);
                    }
                    return Ok((r, false));
                }
                self.counters
                    .moves
                    .lost_sight(key, &r.worker.record.session_id);
                self.invalidate(key);
            }
        }
        let mut force = avoid.refresh;
        for _ in 0..ROUNDS {
            let snap = match view.take() {
                Some(View(snap)) if !force => snap,
                _ => self.workers(force).await?,
            };
            force = true;
            if let Round::Resolved(route, claimed) = self.claim_round(lookup, avoid, &snap).await? {
                self.cache.insert(key.to_owned(), route.clone());
                return Ok((route, claimed));
            }
        }
        Err(no_worker(scope))
    }
}
