//! Fleet tests: real `pinboard` processes, Rust workers
//! (`fleet-worker`) and Python reference workers, Redis, and signals
//! (SIGKILL, SIGSTOP, SIGTERM). The tests live in `tests/`; the binaries in
//! `src/bin/` are the processes they start.
//!
//! [`counter`] is the object those Rust workers host; the benchmarks host it
//! too. [`guarded`] is an object behind `authorize`, hosted on request;
//! [`jobs`] a job queue on a tray that parks a poisoned job, for the
//! storage inspector's tests; [`rooms`] a room whose sockets pinboard
//! holds (they survive moves), for the held-socket tests.

pub mod counter;
pub mod guarded;
pub mod jobs;
pub mod rooms;
