//! nginx as the reference reverse proxy: a temporary configuration with one
//! worker process, `proxy_pass` to one upstream over keep-alive connections,
//! fixed request headers set on the way (the bench injects a worker
//! attestation), run in the foreground on a free loopback port.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context as _;

use crate::child::{self, Server, Spawn};

/// Where Debian's `nginx-light` installs the binary.
pub const DEFAULT_NGINX: &str = "/usr/sbin/nginx";

/// Idle keep-alive connections nginx keeps to the upstream.
const UPSTREAM_KEEPALIVE: usize = 256;

/// The configuration text: one worker, upstream keep-alive, `headers` set
/// on every proxied request, access log off. With `master` false nginx runs
/// as one process (master and worker in one), as callgrind needs.
pub fn config(
    dir: &Path,
    listen: SocketAddr,
    upstream: SocketAddr,
    headers: &[(String, String)],
    master: bool,
) -> String {
    let master = if master { "on" } else { "off" };
    let dir = dir.display();
    let mut set_headers = String::new();
    for (name, value) in headers {
        let _ = writeln!(
            set_headers,
            "            proxy_set_header {name} \"{value}\";"
        );
    }
    format!(
        r#"# Written by pinned-bench: nginx as the reference proxy.
daemon off;
master_process {master};
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 1000000;
    upstream worker {{
        server {upstream};
        keepalive {UPSTREAM_KEEPALIVE};
        keepalive_requests 1000000;
    }}
    server {{
        listen {listen} backlog=4096;
        location / {{
            proxy_pass http://worker;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host {upstream};
{set_headers}        }}
    }}
}}
"#
    )
}

/// Writes the configuration into `dir` and starts `nginx` on a free port,
/// ready once it accepts connections. The whole process group (master and
/// worker) is killed when the handle drops.
///
/// # Errors
///
/// When nginx is missing, refuses the configuration or never listens.
pub async fn start(
    nginx: &Path,
    dir: &Path,
    upstream: SocketAddr,
    headers: &[(String, String)],
) -> anyhow::Result<Server> {
    launch(Spawn::new(nginx), true, dir, upstream, headers).await
}

/// [`start`], but nginx as one process under callgrind, its counts going to
/// `out` (for [`instructions`](crate::instructions)).
///
/// # Errors
///
/// As [`start`].
pub async fn start_measured(
    nginx: &Path,
    dir: &Path,
    upstream: SocketAddr,
    headers: &[(String, String)],
    out: &Path,
) -> anyhow::Result<Server> {
    let spawn = crate::instructions::under_callgrind(out).arg_os(nginx);
    launch(spawn, false, dir, upstream, headers).await
}

async fn launch(
    spawn: Spawn,
    master: bool,
    dir: &Path,
    upstream: SocketAddr,
    headers: &[(String, String)],
) -> anyhow::Result<Server> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let listen = child::free_addr()?;
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, config(dir, listen, upstream, headers, master))
        .with_context(|| format!("write {}", conf.display()))?;
    spawn
        .args([std::ffi::OsStr::new("-p"), dir.as_os_str()])
        .args([std::ffi::OsStr::new("-c"), conf.as_os_str()])
        .args([
            std::ffi::OsStr::new("-e"),
            dir.join("error.log").as_os_str(),
        ])
        .log(dir.join("stderr.log"))
        .listening_on(listen)
        .own_group()
        .start()
        .await
        .with_context(|| format!("nginx (see {}/error.log)", dir.display()))
}
