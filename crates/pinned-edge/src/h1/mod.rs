//! One HTTP/1.1 codec for both roles: the server's (read a request head,
//! write a response) and the client's (write a request head, read a
//! response), sharing head parsing ([`head`]), body framing ([`framing`], [`body`])
//! and field writing ([`write`](mod@write)), as hyper's `proto::h1::role` and
//! pingora's `protocols::http::v1` serve both roles from one codec.
//!
//! Owns the wire format only: bytes in a buffer to `http` heads and body
//! pieces, and `http` heads and bodies to bytes. Never owns a socket's
//! life, a deadline or a pool (the callers' loops do), and never answers
//! a request itself.
//!
//! Why hand-written beside hyper: hyper's server and client drive every
//! exchange through a dispatcher and, for the client, a task of its own
//! joined by channels; on pinboard's proxied request those cost about a
//! third of its instructions over nginx's (`proxy-bench`). The parse of a
//! start line and fields is `httparse`'s, as hyper's is; what is written
//! here is the framing, held to hyper's and nginx's strictness and checked
//! against hyper byte for byte (`tests/h1_differential.rs`) and under
//! fuzzing (`fuzz/`).

pub mod body;
pub mod framing;
pub mod head;
pub mod rewind;
pub mod write;
