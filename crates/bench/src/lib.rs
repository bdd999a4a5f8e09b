//! The benchmark harness: a closed-loop HTTP/1.1 load generator
//! ([`load`]), the child-process plumbing ([`child`]) the bench binaries
//! share, a loopback control-plane deployment ([`deploy`]: pinboard, Rust
//! and Python workers, Redis clean-up), nginx as the reference proxy
//! ([`nginx`]) and new-id placements on pinboard's Redis store alone
//! ([`placements`]). Figures are printed, never asserted: speed is reported, not
//! tested.

pub mod child;
pub mod counters;
pub mod deploy;
pub mod instructions;
pub mod load;
pub mod nginx;
pub mod placements;
