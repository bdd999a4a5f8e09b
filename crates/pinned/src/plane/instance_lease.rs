//! What an instance knows of its lease ([`InstanceLease`]): the worker's
//! lease with pinboard and the instance's own wind-down, as one snapshot;
//! and [`EvictionRequested`], the error long work returns from
//! [`Context::eviction_checkpoint`](crate::Context::eviction_checkpoint)
//! to yield to a wind-down.
//!
//! A snapshot is read-only and taken on demand; nothing here schedules or
//! refuses anything.

use std::time::{Duration, SystemTime};

/// A snapshot of an instance's lease, from
/// [`Context::lease`](crate::Context::lease).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct InstanceLease {
    /// New activations are allowed: no heartbeat ack is overdue (always
    /// true in local mode).
    pub healthy: bool,
    /// The lease ran out: nothing is served until a fresh ack.
    pub expired: bool,
    /// When pinboard may re-place this worker's ids, as wall time; `None`
    /// before the first ack and in local mode.
    pub expires_at: Option<SystemTime>,
    /// The margin before `expires_at` in which new activations are refused.
    pub buffer: Duration,
    /// The instance is winding down (its own wind-down, pinboard's, or its
    /// worker draining).
    pub winding_down: bool,
    /// When a winding-down instance is aborted, as wall time (the earlier of
    /// its own deadline and its worker's drain deadline); `None` when it is
    /// not winding down or has no deadline.
    pub eviction_deadline: Option<SystemTime>,
}

/// The instance is winding down: long work should stop at this checkpoint
/// and leave what is unfinished to the next activation (a durable row
/// marked for it resumes it elsewhere).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the instance is winding down; unfinished work resumes on its next activation")]
pub struct EvictionRequested;
