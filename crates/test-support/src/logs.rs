//! Log lines a test reads back: a `tracing` subscriber that formats into
//! memory (plain text, no colours) instead of a terminal.
//!
//! Owns only the capture; what a line must say is each test's business.

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use tracing::subscriber::DefaultGuard;
use tracing::{Level, Subscriber};

/// The formatted lines written so far, shared by every clone.
#[derive(Clone, Default)]
pub struct LogLines(Arc<Mutex<Vec<u8>>>);

impl LogLines {
    /// Lines at `level` and above, collected while the guard is held (this
    /// thread's default subscriber).
    pub fn capture(level: Level) -> (Self, DefaultGuard) {
        let lines = Self::default();
        let subscriber = lines.subscriber(level);
        (lines, tracing::subscriber::set_default(subscriber))
    }

    /// The lines `run` writes at `level` and above, one string each.
    pub fn during(level: Level, run: impl FnOnce()) -> Vec<String> {
        let lines = Self::default();
        tracing::subscriber::with_default(lines.subscriber(level), run);
        lines.text().lines().map(str::to_owned).collect()
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn subscriber(&self, level: Level) -> impl Subscriber + Send + Sync {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(level)
            .finish()
    }
}

impl Write for LogLines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
