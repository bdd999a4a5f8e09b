//! Starting a Rust worker binary in control-plane mode.

use std::path::PathBuf;
use std::process::Command;

use super::{listening_line, Proc};

/// How to start a Rust worker: a binary that binds `127.0.0.1:0` itself and
/// prints `secret <hex>` (optional) then `… listening on <url>`, like
/// `pinned::serve` and the fleet's `fleet-worker`. It gets `PINBOARD_URL`,
/// `PINBOARD_TOKEN` and `RUST_LOG=info`; the rest is the caller's.
#[derive(Debug, Clone)]
#[must_use]
pub struct RustWorker {
    bin: PathBuf,
    env: Vec<(String, String)>,
    name: String,
}

impl RustWorker {
    /// The worker at `bin` (the caller's `env!("CARGO_BIN_EXE_…")`),
    /// registering with the pinboard at `pinboard_url` with
    /// [`TOKEN`](crate::TOKEN).
    pub fn new(bin: impl Into<PathBuf>, pinboard_url: &str) -> Self {
        Self {
            bin: bin.into(),
            env: Vec::new(),
            name: "rust-worker".into(),
        }
        .env("PINBOARD_URL", pinboard_url)
        .env("PINBOARD_TOKEN", crate::TOKEN)
        .env("RUST_LOG", "info")
    }

    /// Sets an environment variable (the last value of a key wins).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Sets each of `vars` (see [`env`](Self::env)).
    pub fn envs(self, vars: &[(&str, &str)]) -> Self {
        vars.iter().fold(self, |w, (k, v)| w.env(k, v))
    }

    /// Binds a port the system picks on `127.0.0.1` and registers under it
    /// (`PORT=0`, `HOST=127.0.0.1`, `ADVERTISE_URL=http://127.0.0.1:0`): how
    /// the examples run beside each other in a test.
    pub fn on_any_port(self) -> Self {
        self.envs(&[
            ("PORT", "0"),
            ("HOST", "127.0.0.1"),
            ("ADVERTISE_URL", "http://127.0.0.1:0"),
        ])
    }

    /// Names its log file after `name` (default `rust-worker`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// Starts it and waits for its listening line; its secret is
    /// [`Proc::secret`].
    ///
    /// # Panics
    ///
    /// When it cannot start or exits first (the panic carries its log).
    pub fn start(self) -> Proc {
        let mut command = Command::new(&self.bin);
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        Proc::spawn(command, &self.name, listening_line)
    }
}
