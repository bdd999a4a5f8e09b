//! The HTTP edge that `pinboard` and the `pinned` worker share: what every
//! accepted client connection is held to, whichever binary accepts it.
//!
//! - [`accept`]: the accept loop both binaries run with their
//!   per-connection service: the cap, the TLS handshake, the drain.
//! - [`defaults`]: the deadlines and bounds both binaries start from.
//! - [`phase`]: where a connection is in its life (waiting for a head,
//!   reading one, busy, idle) and the deadline of each phase.
//! - [`drive`]: runs one connection to its end under those deadlines, and
//!   finishes it gracefully on a stop signal.
//! - [`front`]: the HTTP/1.1 server both binaries put before hyper: a
//!   connection's simple requests served on its own task with the codec,
//!   the rest of the connection handed to hyper.
//! - [`h1`]: the HTTP/1.1 codec both binaries' hand-written paths share,
//!   server and client role (heads, body framing, writing).
//! - [`cap`]: the connection cap, lowered to what the open-file limit
//!   carries.
//! - [`roster`]: which connections are idle, longest idle first, so the
//!   accept loop at the cap closes one of them to admit a new one.
//! - [`backoff`]: what a failing `accept` does (pause, never a hot loop),
//!   the cap's admission, and the log throttle.
//! - [`tls`]: rustls server and client configurations from PEM files, and
//!   the server handshake under a deadline.
//! - [`logging`]: the subscriber setup of every binary (text or JSON, no
//!   colours into files), errors with their causes, and repeated failures
//!   logged once with a count.
//! - [`trace`]: the W3C trace context in and out of a hop, and the OTLP
//!   export of spans when the `OTEL_*` variables ask for it (feature
//!   `otlp`).
//!
//! This crate owns no router: each binary decides what a request is, in
//! the per-connection service it hands the accept loop (pinboard's
//! spreads connections over single-threaded I/O threads, the worker's runs
//! on the application's runtime). It never depends on `pinboard` or
//! `pinned`.
#![forbid(unsafe_code)]

pub mod accept;
pub mod backoff;
pub mod cap;
pub mod defaults;
pub mod drive;
pub mod front;
pub mod h1;
pub mod logging;
pub mod phase;
pub mod roster;
pub mod tls;
pub mod trace;
