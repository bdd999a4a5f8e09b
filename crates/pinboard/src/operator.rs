//! The operator's read views beyond the wire's `/registry/workers` and
//! `/registry/overview`: placements filtered and paged, the sweeper's state
//! and what moved recently. The `pinboard` operator commands
//! ([`crate::operator_cli`]) and the dashboard read these.
//!
//! [`state`] is the storage inspector and the per-key controls, answered
//! by the workers' `/_pinned/state/…` routes.
//!
//! [`traffic`] keeps the proxy's per-namespace request, error and latency
//! counters the dashboard draws.
//!
//! Owns the shapes of those answers and their bounds (a page holds at most
//! [`MAX_PAGE_LIMIT`] rows, the move ring [`moves::MOVE_RING_CAPACITY`]).
//! Never changes placement or a worker itself: worker actions go through
//! `/registry/push`, state controls through the id's owner ([`state`]).

pub mod audit;
pub mod http;
pub mod moves;
pub mod placements;
pub mod state;
pub mod sweeper_status;
pub mod traffic;

/// Rows of a placements page when the caller names no `limit`.
pub const DEFAULT_PAGE_LIMIT: usize = 100;
/// Most rows one placements page holds.
pub const MAX_PAGE_LIMIT: usize = 1000;
/// Moves answered when the caller names no `limit`.
pub const DEFAULT_MOVES_LIMIT: usize = 50;
