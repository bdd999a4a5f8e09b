//! Starting a real `pinboard` process on `127.0.0.1:0`.

use std::path::PathBuf;
use std::process::Command;

use super::{listening_line, Proc};

/// The shared Redis the services script starts (`scripts/services`).
pub const SHARED_REDIS: &str = "redis://127.0.0.1:6379/0";

/// How to start `pinboard`: the memory store, a 2 s lease, no quarantine,
/// unless the caller says otherwise.
///
/// ```no_run
/// # let bin = "pinboard";
/// let pb = test_support::Pinboard::new(bin)
///     .token("test-token")
///     .args(&["--operator-token", "op"])
///     .start();
/// println!("{}", pb.url);
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct Pinboard {
    bin: PathBuf,
    token: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    nofile: Option<u64>,
    name: String,
}

impl Pinboard {
    /// The lease TTL pinboard grants unless `--lease-ttl-ms` is given (ms).
    pub const LEASE_TTL_MS: u64 = 2000;

    /// `pinboard` at `bin` (the caller's `env!("CARGO_BIN_EXE_…")`: that
    /// variable exists only in the binary's own package's tests).
    pub fn new(bin: impl Into<PathBuf>) -> Self {
        Self {
            bin: bin.into(),
            token: crate::TOKEN.to_owned(),
            args: Vec::new(),
            env: vec![("RUST_LOG".into(), "info".into())],
            nofile: None,
            name: "pinboard".into(),
        }
    }

    /// The deployment token (default [`TOKEN`](crate::TOKEN)).
    pub fn token(mut self, token: &str) -> Self {
        self.token = token.to_owned();
        self
    }

    /// Appends flags. A flag given here replaces the default of the same
    /// name (`--listen`, `--token`, `--lease-ttl-ms`, `--quarantine-ms`).
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// The Redis placement store at `url` with the default key prefix (a
    /// private server, see [`RedisServer`](crate::RedisServer)).
    pub fn redis(self, url: &str) -> Self {
        self.args(&["--redis-url", url])
    }

    /// The shared Redis ([`SHARED_REDIS`]) under key `prefix` (see
    /// [`unique`](crate::unique)).
    pub fn shared_redis(self, prefix: &str) -> Self {
        self.args(&["--redis-url", SHARED_REDIS, "--redis-prefix", prefix])
    }

    /// Sets an environment variable (`RUST_LOG` is `info` unless set).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Serves HTTPS with `certs` (`--tls-cert`, `--tls-key`).
    ///
    /// # Panics
    ///
    /// When a path is not UTF-8.
    pub fn tls(self, certs: &crate::SelfSigned) -> Self {
        let (cert, key) = (certs.cert.to_str(), certs.key.to_str());
        self.args(&[
            "--tls-cert",
            cert.expect("utf-8 path"),
            "--tls-key",
            key.expect("utf-8 path"),
        ])
    }

    /// Runs it under `ulimit -n <nofile>`.
    pub fn nofile(mut self, nofile: u64) -> Self {
        self.nofile = Some(nofile);
        self
    }

    /// Names its log file after `name` (default `pinboard`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    /// Starts it and waits for its `pinboard listening on <url>` line.
    ///
    /// # Panics
    ///
    /// When it cannot start or exits first (the panic carries its log).
    pub fn start(self) -> Proc {
        let ttl = Self::LEASE_TTL_MS.to_string();
        let mut args: Vec<&str> = Vec::new();
        for (flag, value) in [
            ("--listen", "127.0.0.1:0"),
            ("--token", self.token.as_str()),
            ("--lease-ttl-ms", ttl.as_str()),
            ("--quarantine-ms", "0"),
        ] {
            if !self.args.iter().any(|a| a == flag) {
                args.extend([flag, value]);
            }
        }
        args.extend(self.args.iter().map(String::as_str));
        let mut command = match self.nofile {
            None => Command::new(&self.bin),
            Some(n) => {
                // `exec` keeps the pid: signals reach pinboard, not a shell.
                let mut shell = Command::new("sh");
                shell
                    .arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(&self.bin);
                shell
            }
        };
        command
            .args(&args)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        Proc::spawn(command, &self.name, listening_line)
    }
}
