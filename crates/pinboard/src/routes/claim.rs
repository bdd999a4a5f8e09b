//! The placement side of resolution: a claim round (candidate choice and
//! the store's compare-and-claim), the move log it feeds, and the
//! hand-back of a claim the worker refused.
//!
//! Owns which live worker a new id goes to and what the move log says of
//! it; never sends anything to a worker and never reads the route cache
//! (a round's caller does).
//!
//! # What a claim says moved
//!
//! Every claim that takes a row from another session is a move, whoever
//! noticed the owner go (this node, another node, nobody before the
//! claim): the store's claim answers the session the row moved from. Why
//! it left, in this order:
//!
//! 1. the resolution was told to treat that owner as vacant: it refused
//!    the id (a drain when it is draining, a takeover when a newer
//!    deployment winds it down);
//! 2. a departure this node remembers from that session (a release, a
//!    wind-down, a deregistration, a supersession seen here, a store
//!    loss): the row's owner is empty after a release and the row is gone
//!    after a store loss, so only a node that saw those can say;
//! 3. what the store says of the session (one read, only for such a
//!    move): superseded by a new process at its URL (`replaced`) or by a
//!    newer deployment (`takeover`), else its lease lapsed.
//!
//! A claim of a row no session owned, with no departure remembered, is a
//! first placement: no move.
//!
//! # Refused claims
//!
//! [`Routes::resolve_claiming`] says whether this call claimed the id.
//! When the worker then refuses to activate it and the request ends
//! without an answer from any worker, the proxy hands the claim back
//! ([`Routes::roll_back`]): an invented id leaves no row behind but the
//! short grace of a released one. The hand-back is a compare-and-release
//! at the claimed `(session, epoch)`, so a row another request moved on
//! since is left alone; it trusts the refusal as the re-placement after a
//! refusal always has (`Avoid::stale`): a worker that refused an id did
//! not activate it.

use std::sync::Arc;

use super::workers::Snapshot;
use super::{no_worker, Avoid, Lookup, ResolveError, Route, Routes};
use crate::clock::Now;
use crate::operator::moves::{Claim, MoveReason};
use crate::placement::{
    choose_candidate, ClaimOutcome, Generation, InstanceKey, Placement, PlacementStore, StoreError,
};
use crate::upstream::WorkerConn;

/// How one claim round ended, short of an error.
pub(super) enum Round {
    /// The id's route, and whether this round claimed it.
    Resolved(Arc<Route>, bool),
    /// The candidate or the owner went between the read and the claim:
    /// read the workers again and retry.
    Again,
}

impl<S: PlacementStore> Routes<S> {
    /// One claim round on `snap`: the store's live owner of the id, else a
    /// new placement on a candidate of `lookup`'s world (none during a
    /// quarantine).
    pub(super) async fn claim_round(
        &self,
        lookup: Lookup<'_>,
        avoid: Avoid<'_>,
        snap: &Snapshot,
    ) -> Result<Round, ResolveError> {
        let Lookup {
            key, ns, id, scope, ..
        } = lookup;
        let now = self.clock.now();
        let (generation, quarantined) = self.standing_at(now.mono_ms);
        let mut candidates: Vec<&Arc<WorkerConn>> = snap
            .by_session
            .values()
            .filter(|w| {
                w.record.hosts(ns)
                    && !w.record.refuses_new_ids()
                    && scope.admits(&w.record, ns)
                    && !avoid.exclude.contains(&w.record.session_id)
            })
            .collect();
        // A map has no order: sort, so a seeded roll picks the same worker.
        candidates.sort_unstable_by(|a, b| a.record.session_id.cmp(&b.record.session_id));
        let candidate = if quarantined {
            None
        } else {
            choose_candidate(&candidates, |w| w.record.headroom, self.entropy.next_u64())
                .map(|i| candidates[i].record.session_id.as_str())
        };
        let floor = self.floor.floor_for_claim(now).await;
        let unknown = Generation(String::new());
        let (placement, claimed) = match self
            .store
            .resolve_or_claim(
                InstanceKey::new(ns, id),
                candidate,
                avoid.stale,
                floor,
                generation.as_deref().unwrap_or(&unknown),
                now,
            )
            .await?
        {
            ClaimOutcome::Owned(p) => {
                self.counters.moves.owned(key, &p.session_id);
                (p, false)
            }
            ClaimOutcome::Claimed(p, from) => {
                self.counters.placements.inc();
                let departure = self.departure(key, from, avoid, snap, now).await;
                self.counters.moves.claimed(
                    Claim {
                        ns,
                        id,
                        to: &p.session_id,
                        epoch: p.epoch,
                        at_ms: now.wall_ms,
                        by: lookup.by,
                    },
                    departure.as_ref().map(|(from, why)| (from.as_str(), *why)),
                );
                self.floor.minted(p.epoch).await;
                (p, true)
            }
            ClaimOutcome::Vacant if quarantined => return Err(ResolveError::Quarantined),
            ClaimOutcome::Vacant => return Err(no_worker(scope)),
            ClaimOutcome::CandidateGone => return Ok(Round::Again),
            ClaimOutcome::ShardLost { quarantine_left_ms } => {
                // Epochs minted in that shard before its loss are gone
                // from the store: the next claim keeps above the mark.
                self.floor.reload_durable();
                if quarantine_left_ms > 0 {
                    return Err(ResolveError::Quarantined);
                }
                return Ok(Round::Again);
            }
            ClaimOutcome::GenerationLost(held) => {
                self.store_lost(held).await?;
                if self.quarantine_left_ms() > 0 {
                    return Err(ResolveError::Quarantined);
                }
                return Ok(Round::Again);
            }
        };
        self.floor.observe(placement.epoch);
        let worker = match snap.by_session.get(&placement.session_id) {
            Some(w) => w.clone(),
            None => match self.store.get_worker(&placement.session_id, now).await? {
                Some(live) => match WorkerConn::new(live.record, self.upstream_tls.as_ref()) {
                    Some(c) => Arc::new(c),
                    None => return Ok(Round::Again),
                },
                None => return Ok(Round::Again),
            },
        };
        if !scope.admits(&worker.record, ns) {
            // Found, not claimed: a claim only ever names a candidate
            // of this world.
            return Err(ResolveError::OtherWorld);
        }
        Ok(Round::Resolved(
            Arc::new(Route::new(worker, placement.epoch)),
            claimed,
        ))
    }

    /// Hand back a claim the worker refused (see the module doc): the row
    /// is released if it is still `placement`, and the route forgotten.
    ///
    /// # Errors
    ///
    /// When the store fails.
    pub async fn roll_back(
        &self,
        key: &str,
        ns: &str,
        id: &str,
        placement: &Placement,
    ) -> Result<bool, StoreError> {
        self.invalidate(key);
        let released = self
            .store
            .release(
                InstanceKey::new(ns, id),
                &placement.session_id,
                Some(placement.epoch),
            )
            .await?;
        if released {
            self.counters.rolled_back.inc();
        }
        Ok(released)
    }

    /// Where a claimed row came from and why (see the module doc): `from`
    /// is the session the store says owned it, if another.
    async fn departure(
        &self,
        key: &str,
        from: Option<String>,
        avoid: Avoid<'_>,
        snap: &Snapshot,
        now: Now,
    ) -> Option<(String, MoveReason)> {
        let remembered = self.counters.moves.take_departure(key);
        if let Some((refused, _)) = avoid.stale {
            // An owner that released the id before it refused it (a stale
            // route) left it for the release.
            if let Some((seen, Some(reason))) = &remembered {
                if seen == refused {
                    return Some((seen.clone(), *reason));
                }
            }
            let reason = if self.counters.moves.refused_winding(key, refused) {
                MoveReason::WindDown
            } else {
                snap.letting_go(refused, MoveReason::Refusal)
            };
            return Some((refused.to_owned(), reason));
        }
        let from = match (from, remembered) {
            (Some(from), Some((seen, Some(reason)))) if seen == from => {
                return Some((from, reason))
            }
            (None, Some((seen, Some(reason)))) => return Some((seen, reason)),
            (Some(from), _) => from,
            // The row is gone and this node lost sight of its owner
            // unexplained: its grace ran out (a store loss this node
            // noticed since would have said so).
            (None, Some((seen, None))) => seen,
            (None, None) => return None,
        };
        let reason = self.gone_reason(&from, now).await;
        Some((from, reason))
    }

    /// Why the session `from` that owned a row this node just claimed is
    /// gone, as far as the store knows (its supersession note; none: its
    /// lease lapsed, or it deregistered through another node). Only for a
    /// move this node remembers nothing of, so it costs one store read per
    /// such move.
    async fn gone_reason(&self, from: &str, now: Now) -> MoveReason {
        match self.store.superseded(from, now).await {
            Ok(reason) => MoveReason::of_gone_session(reason.as_deref()),
            Err(error) => {
                tracing::debug!(target: "pinboard::placement", from, error = %pinned_edge::logging::Chain(&error), "could not read why a session went");
                MoveReason::LeaseLapsed
            }
        }
    }
}
