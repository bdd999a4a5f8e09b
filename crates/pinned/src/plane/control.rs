//! [`ControlPlane`]: how this worker relates to placement, as one value
//! every part asks instead of branching on "is there a pinboard?".
//!
//! In *local* mode the process is its own placement: every id is served
//! here, attestation is optional, a closed worker answers 500, alarms of
//! evicted ids fire from process timers. Behind *pinboard* a lease gates
//! serving, attestations are required, closes release placements, refusals
//! are the retryable ones that make pinboard re-place, and pinboard's
//! sweeper owns the alarms of evicted ids.
//!
//! This module only answers policy questions and forwards calls; the
//! registration loop itself lives in [`registration`](crate::plane::registration)
//! and the lease in [`lease`](crate::plane::lease).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::plane::lease::Lease;
use crate::plane::pinboard::Plane;

/// The worker's placement mode (see the module docs).
#[derive(Clone)]
pub(crate) enum ControlPlane {
    /// No pinboard: the reference's dev mode.
    Local,
    /// Registered with (or registering to) a pinboard.
    Pinboard(Arc<Plane>),
}

impl ControlPlane {
    /// The pinboard connection, in control-plane mode.
    pub(crate) fn pinboard(&self) -> Option<&Arc<Plane>> {
        match self {
            Self::Local => None,
            Self::Pinboard(plane) => Some(plane),
        }
    }

    /// The worker's lease, in control-plane mode.
    pub(crate) fn lease(&self) -> Option<&Lease> {
        self.pinboard().map(|plane| &*plane.lease)
    }

    /// Instance routes require a valid `Pinboard-Attestation`.
    pub(crate) fn requires_attestation(&self) -> bool {
        matches!(self, Self::Pinboard(_))
    }

    /// Whether `aud` is the current pinboard session.
    pub(crate) fn is_session(&self, aud: &str) -> bool {
        self.pinboard().is_some_and(|plane| plane.is_session(aud))
    }

    /// Nothing may be served: the lease ran out (never in local mode).
    pub(crate) fn lease_expired(&self) -> bool {
        self.lease().is_some_and(Lease::expired)
    }

    /// New activations are allowed (always in local mode).
    pub(crate) fn lease_healthy(&self) -> bool {
        self.lease().is_none_or(Lease::healthy)
    }

    /// The last granted lease TTL (fence entries live that long).
    pub(crate) fn lease_ttl(&self) -> Option<Duration> {
        self.lease().and_then(Lease::ttl)
    }

    /// Caps lease renewals at a drain deadline.
    pub(crate) fn cap_lease(&self, deadline: Option<Instant>) {
        if let Some(lease) = self.lease() {
            lease.cap(deadline);
        }
    }

    /// pinboard's durable entry points (`_alarm`, `_wake`) are served.
    pub(crate) fn serves_durable_entry_points(&self) -> bool {
        matches!(self, Self::Pinboard(_))
    }

    /// A closed (or closing-and-releasing) record answers a refusal that
    /// makes the proxy re-resolve, rather than being waited out here.
    pub(crate) fn refuses_while_releasing(&self) -> bool {
        matches!(self, Self::Pinboard(_))
    }

    /// A closed worker answers the retryable `host draining; retry`, so a
    /// request routed just before the deregistration landed is placed
    /// elsewhere (locally: the reference's 500).
    pub(crate) fn closed_is_retryable(&self) -> bool {
        matches!(self, Self::Pinboard(_))
    }

    /// Alarms fire from process timers for evicted ids too, retrying after
    /// a failure (local mode); behind pinboard only resident instances
    /// inside the lease fire here and the sweeper delivers the rest.
    pub(crate) fn fires_evicted_alarms(&self) -> bool {
        matches!(self, Self::Local)
    }

    /// In-process cluster calls may reach any hosted id (local mode), not
    /// only resident ones.
    pub(crate) fn calls_every_id_in_process(&self) -> bool {
        matches!(self, Self::Local)
    }
}
