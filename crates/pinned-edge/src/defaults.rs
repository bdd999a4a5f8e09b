//! The edge's defaults, one set for both binaries: pinboard's flags and the
//! worker's options start from these, so the two edges hold a client to the
//! same deadlines and bounds unless configured otherwise.

/// Time a client has to send a complete request head, in milliseconds,
/// counted from its first byte (from accept, TLS handshake included, for a
/// connection's first request).
pub const HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// Time a keep-alive connection may sit idle between two requests, in
/// milliseconds.
pub const KEEP_ALIVE_TIMEOUT_MS: u64 = 60_000;
/// Time open connections get to finish after the shutdown signal (for the
/// worker: after its drain), in milliseconds; then they are dropped.
pub const SHUTDOWN_TIMEOUT_MS: u64 = 10_000;
/// Most client connections open at once per process (lowered to what the
/// open-file limit carries, see [`cap`](crate::cap)).
pub const MAX_CONNECTIONS: usize = 10_000;
/// Largest request head (request line and headers), in bytes.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Smallest accepted largest-head setting, in bytes.
pub const MIN_MAX_HEADER_BYTES: usize = 1024;
/// Smallest read buffer hyper accepts (its `max_buf_size` panics below it).
pub const MIN_READ_BUFFER: usize = 8192;
