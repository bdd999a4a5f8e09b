//! Wire facts shared by the `pinned` worker and `pinboard`: instance ids and
//! namespaces, header names, placement epochs, HS256 attestation tokens,
//! refusal bodies, the registry's JSON shapes and the exchange of the
//! sockets pinboard holds for its workers ([`held`]).
//!
//! This crate owns bytes on the wire and nothing else: it never does I/O,
//! never reads a clock on its own (callers pass `now`), and never depends on
//! the worker or the control plane.
#![forbid(unsafe_code)]

pub mod attestation;
pub mod epoch;
pub mod headers;
pub mod held;
pub mod ids;
pub mod refusal;
pub mod registry;
