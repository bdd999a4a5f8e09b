//! The Python reference's interpreter.

use std::path::{Path, PathBuf};

/// The Python interpreter with `pinned==0.16.0` and `uvicorn`: `PINNED_PY`,
/// else the workspace's `.venv` (which `scripts/venv` creates).
///
/// # Panics
///
/// When neither exists.
pub fn python() -> PathBuf {
    let default = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    let py = std::env::var_os("PINNED_PY").map_or(default, PathBuf::from);
    assert!(
        py.exists(),
        "Python interpreter {} not found: run scripts/venv or set PINNED_PY",
        py.display()
    );
    py
}

/// A free loopback port (bound then released), for a child process that
/// takes its port as an argument. In-process listeners bind port 0 and read
/// their address instead.
///
/// # Panics
///
/// When no port can be bound.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}
