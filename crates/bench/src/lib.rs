//! The benchmark harness: a closed-loop HTTP/1.1 load generator
//! ([`load`]) and the child-process plumbing ([`child`]) the bench binaries
//! share. Figures are printed, never asserted: speed is reported, not tested.

pub mod child;
pub mod load;
