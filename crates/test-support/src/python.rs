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
