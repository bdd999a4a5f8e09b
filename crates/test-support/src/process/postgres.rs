//! A private Postgres cluster (`initdb` + `pg_ctl`), for suites that stop and
//! start the database itself or need a server set up their own way (TLS with
//! a private CA), without touching the shared cluster on 5432 that other
//! suites use at the same time.
//!
//! The cluster lives in a temporary directory (data, socket, log, certificates)
//! removed on drop, after `pg_ctl stop -m immediate`. As root (CI, the
//! development machine), `initdb` and `pg_ctl` refuse to run, so they run as
//! the `postgres` user through `setpriv`, and the directory is handed to it.
//! Like the private Redis, the port is one the kernel just handed out and took
//! back; a start that fails (the port was taken meanwhile) is retried on a
//! fresh one. Durability settings are off (`fsync`, `full_page_writes`): an
//! immediate stop is a crash of the server, not of the machine, so nothing
//! committed is lost.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Starts tried before giving up (each fails only when its port was taken).
const ATTEMPTS: usize = 5;

/// How long `pg_ctl` waits for the server to start or stop, seconds.
const PG_CTL_WAIT_SECS: &str = "30";

/// The server's log, in the cluster's directory.
const LOG: &str = "server.log";

/// TLS for a cluster: the server's certificate chain and key, as PEM text.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The certificate chain (leaf first).
    pub cert_pem: String,
    /// The private key.
    pub key_pem: String,
}

/// A running private cluster; stopped (`-m immediate`) and removed on drop.
#[derive(Debug)]
pub struct PostgresCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    owner: Option<Owner>,
    port: u16,
    /// `postgresql://postgres@127.0.0.1:<port>/postgres`, trust authentication.
    pub url: String,
}

/// The account the cluster runs under when this process is root.
#[derive(Debug, Clone, Copy)]
struct Owner {
    uid: u32,
    gid: u32,
}

impl PostgresCluster {
    /// A cluster without TLS (`ssl = off`).
    ///
    /// # Panics
    ///
    /// When `initdb`/`pg_ctl` are missing or the server does not start.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// A cluster serving TLS (`ssl = on`) with `tls`; plain connections are
    /// still accepted (`host` lines in `pg_hba.conf`), as on most servers.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_tls(tls: &ServerTls) -> Self {
        Self::start_with(Some(tls))
    }

    fn start_with(tls: Option<&ServerTls>) -> Self {
        let dir = tempfile::tempdir().expect("cluster dir");
        let owner = owner();
        let bin = bin_dir();
        if let Some(owner) = owner {
            chown(dir.path(), owner);
        }
        let data = dir.path().join("data");
        run(
            &bin,
            owner,
            "initdb",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-U".as_ref(),
                "postgres".as_ref(),
                "-A".as_ref(),
                "trust".as_ref(),
                "-E".as_ref(),
                "UTF8".as_ref(),
                "--locale=C".as_ref(),
                "--no-sync".as_ref(),
                "--no-instructions".as_ref(),
            ],
        )
        .unwrap_or_else(|out| panic!("initdb failed: {out}"));
        let mut conf = format!(
            "listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{}'\n\
             fsync = off\nfull_page_writes = off\nmax_connections = 60\n\
             shared_buffers = 16MB\n",
            dir.path().display()
        );
        if let Some(tls) = tls {
            let cert = dir.path().join("server.crt");
            let key = dir.path().join("server.key");
            std::fs::write(&cert, &tls.cert_pem).expect("server.crt");
            std::fs::write(&key, &tls.key_pem).expect("server.key");
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
                .expect("key mode");
            if let Some(owner) = owner {
                chown(&cert, owner);
                chown(&key, owner);
            }
            conf.push_str(&format!(
                "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
                cert.display(),
                key.display()
            ));
        }
        let conf_path = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf_path).expect("postgresql.conf");
        text.push_str(&conf);
        std::fs::write(&conf_path, text).expect("postgresql.conf");

        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            let port = released_port();
            std::fs::write(
                data.join("postgresql.auto.conf"),
                format!("port = {port}\n"),
            )
            .expect("postgresql.auto.conf");
            match pg_ctl_start(&bin, owner, dir.path()) {
                Ok(()) => {
                    return Self {
                        bin,
                        owner,
                        port,
                        url: format!("postgresql://postgres@127.0.0.1:{port}/postgres"),
                        dir,
                    }
                }
                Err(out) => last = out,
            }
        }
        panic!("postgres failed to start {ATTEMPTS} times; the last: {last}");
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    /// `pg_ctl stop -m immediate`: the server quits at once without a
    /// checkpoint and every connection drops, as in a crash; the next start
    /// recovers from the WAL.
    ///
    /// # Panics
    ///
    /// When `pg_ctl` fails (the server was not running).
    pub fn stop_immediate(&self) {
        self.pg_ctl(&["stop", "-m", "immediate"])
            .unwrap_or_else(|out| panic!("pg_ctl stop: {out}"));
    }

    /// Starts the server again on the same port (after
    /// [`stop_immediate`](Self::stop_immediate)), waiting until it accepts
    /// connections.
    ///
    /// # Panics
    ///
    /// When it does not start (the port was taken meanwhile, which the
    /// kernel's turn-by-turn port handout makes very unlikely).
    pub fn start_again(&self) {
        self.pg_ctl_start()
            .unwrap_or_else(|out| panic!("pg_ctl start: {out}"));
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join(LOG)
    }

    fn pg_ctl_start(&self) -> Result<(), String> {
        pg_ctl_start(&self.bin, self.owner, self.dir.path())
    }

    fn pg_ctl(&self, action: &[&str]) -> Result<(), String> {
        pg_ctl(&self.bin, self.owner, self.dir.path(), action)
    }
}

impl Drop for PostgresCluster {
    fn drop(&mut self) {
        // Quietly: a failed start has no server to stop.
        let _ = self.pg_ctl(&["stop", "-m", "immediate"]);
    }
}

/// `pg_ctl start` of the cluster in `dir`, logging to its log file.
fn pg_ctl_start(bin: &Path, owner: Option<Owner>, dir: &Path) -> Result<(), String> {
    let log = dir.join(LOG);
    pg_ctl(
        bin,
        owner,
        dir,
        &["start", "-l", log.to_str().expect("utf-8 path")],
    )
    .map_err(|out| {
        format!(
            "{out}\nserver log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    })
}

/// `pg_ctl -D <dir>/data -w <action>`.
fn pg_ctl(bin: &Path, owner: Option<Owner>, dir: &Path, action: &[&str]) -> Result<(), String> {
    let data = dir.join("data");
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "-D".as_ref(),
        data.as_os_str(),
        "-w".as_ref(),
        "-t".as_ref(),
        PG_CTL_WAIT_SECS.as_ref(),
    ];
    args.extend(action.iter().map(|a| std::ffi::OsStr::new(*a)));
    run(bin, owner, "pg_ctl", &args)
}

/// The `postgres` account when this process is root (initdb refuses root).
fn owner() -> Option<Owner> {
    let id = |args: &[&str]| -> Option<u32> {
        let out = Command::new("id").args(args).output().ok()?;
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    if id(&["-u"])? != 0 {
        return None;
    }
    Some(Owner {
        uid: id(&["-u", "postgres"]).expect("root, and no `postgres` user to run initdb as"),
        gid: id(&["-g", "postgres"]).expect("the postgres user's group"),
    })
}

fn chown(path: &Path, owner: Owner) {
    std::os::unix::fs::chown(path, Some(owner.uid), Some(owner.gid))
        .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
}

/// The server's programs: `pg_config --bindir` (Debian keeps them off the
/// PATH), else whatever the PATH has.
fn bin_dir() -> PathBuf {
    Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|dir| PathBuf::from(dir.trim()))
        .unwrap_or_default()
}

/// Runs `program` of `bin` with `args`, as `owner` when given; its output
/// on failure.
fn run(
    bin: &Path,
    owner: Option<Owner>,
    program: &str,
    args: &[&std::ffi::OsStr],
) -> Result<(), String> {
    let program = bin.join(program);
    let mut command = match owner {
        Some(owner) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={}", owner.uid))
                .arg(format!("--regid={}", owner.gid))
                .arg("--clear-groups")
                .arg(&program);
            c
        }
        None => Command::new(&program),
    };
    let Output {
        status,
        stdout,
        stderr,
    } = command
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    if status.success() {
        return Ok(());
    }
    Err(format!(
        "{} {status}\n{}{}",
        program.display(),
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    ))
}

/// A port the kernel handed out and took back (as the private Redis's).
fn released_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a loopback port")
}
