//! Examples live beside this crate; run them with `cargo run --example <name>`.
//! The crate itself holds what the examples share: the crash point their
//! crash tests switch on ([`crash_point`]).

pub mod crash_point;
