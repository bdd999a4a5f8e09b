//! Starting a Python reference worker (pinned 0.16.0 under uvicorn) through
//! the launcher `py/serve.py`, which binds `127.0.0.1:0` itself.

use std::path::PathBuf;
use std::process::Command;

use super::{listening_line, Proc};

/// The launcher: binds the socket, sets `ADVERTISE_URL` from it before the
/// app is imported, prints `python worker listening on <url>`, and hands
/// the socket to uvicorn.
const LAUNCHER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/py/serve.py");

/// The test app of pinboard's suites (a counter object under `/counter`;
/// the fleet suites share it).
const REFERENCE_APP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../pinboard/tests/py");

/// How to start a Python worker: pinboard's test app (`app:app`) unless
/// [`app`](Self::app) names another, with `PINBOARD_URL` and
/// `PINBOARD_TOKEN` set; `ADVERTISE_URL` is the address it bound.
#[derive(Debug, Clone)]
#[must_use]
pub struct PythonWorker {
    app_dir: PathBuf,
    app: String,
    env: Vec<(String, String)>,
    name: String,
}

impl PythonWorker {
    /// Pinboard's test app, registering with the pinboard at
    /// `pinboard_url` with [`TOKEN`](crate::TOKEN).
    pub fn new(pinboard_url: &str) -> Self {
        Self::local()
            .env("PINBOARD_URL", pinboard_url)
            .env("PINBOARD_TOKEN", crate::TOKEN)
    }

    /// Pinboard's test app given no pinboard (an [`app`](Self::app) in the
    /// reference's local mode).
    pub fn local() -> Self {
        Self {
            app_dir: PathBuf::from(REFERENCE_APP),
            app: "app:app".into(),
            env: Vec::new(),
            name: "python-worker".into(),
        }
    }

    /// Serves `app` (`module:attribute`) from the directory `dir` instead.
    pub fn app(mut self, dir: impl Into<PathBuf>, app: &str) -> Self {
        self.app_dir = dir.into();
        self.app = app.to_owned();
        self
    }

    /// Sets an environment variable (the last value of a key wins;
    /// `ADVERTISE_URL` is always the bound address).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Sets each of `vars` (see [`env`](Self::env)).
    pub fn envs(self, vars: &[(&str, &str)]) -> Self {
        vars.iter().fold(self, |w, (k, v)| w.env(k, v))
    }

    /// Names its log file after `name` (default `python-worker`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// Starts it and waits for the launcher's listening line (printed
    /// before the app is imported: connections wait in the socket's
    /// backlog until uvicorn accepts them).
    ///
    /// # Panics
    ///
    /// When the interpreter is missing ([`python`](crate::python)), or the
    /// launcher cannot start or exits first (the panic carries its log).
    pub fn start(self) -> Proc {
        let mut command = Command::new(crate::python());
        command
            .arg(LAUNCHER)
            .arg(&self.app_dir)
            .arg(&self.app)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            // Its stdout is a pipe: unbuffered, so lines reach the log as
            // they are printed.
            .env("PYTHONUNBUFFERED", "1");
        Proc::spawn(command, &self.name, listening_line)
    }
}
