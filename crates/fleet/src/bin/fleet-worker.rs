//! A Rust worker for fleet tests, in control-plane mode: `/counter` with
//! the same routes as the Python test app (`hit`, `peek`, `whoami`,
//! `call/{target}`, `slow`, `stream`), so Rust and Python workers are
//! interchangeable behind one pinboard.
//!
//! Environment: `PINBOARD_URL`, `PINBOARD_TOKEN` (required);
//! `PINNED_HOSTNAME`, `FLEET_ENV` (the worker's placement env),
//! `FLEET_NS_ENV` (the namespace's own env, sent in `envs`),
//! `FLEET_CLUSTER_HOST` (`pinboard`: cluster calls keep pinboard's `Host`
//! and send `Pinboard-Hostname`), `FLEET_EPOCH`, `FLEET_TAKEOVER` (`wind_down`|`deny`),
//! `FLEET_PORT` (the port to listen on, default any free one: a restart
//! on the same port keeps the advertise URL),
//! `FLEET_HEARTBEAT_MS`, `FLEET_LEASE_BUFFER_MS`, `FLEET_DRAIN_MS` (the
//! SIGTERM drain deadline), `FLEET_IDLE_MS`, `FLEET_SWEEP_MS`, and
//! `FLEET_NS` (the namespace, default `/counter`), `FLEET_GUARDED_NS` (also
//! host the `authorize`-guarded object there), `FLEET_JOBS_NS` (also host
//! the job queue of `pinned_fleet::jobs` there), `FLEET_MAX_INSTANCES`,
//! `FLEET_PG_IDLE_TXN_MS` (the store's idle-in-transaction timeout),
//! `PINNED_LOG_FORMAT` / `PINNED_LOG_REPEAT_MS` (the logs: `text` or
//! `json`, and how often a repeated failure is logged again),
//! `PINNED_TLS_CERT` / `PINNED_TLS_KEY` and `PINNED_PINBOARD_CA` (read by
//! `Options::from_env`: serve HTTPS, advertised as `https://`, and trust
//! an `https://` pinboard's CA), and
//! `FLEET_DATABASE_URL` (a Postgres state store, its rows stamped with
//! `PINNED_HOSTNAME` and `FLEET_ENV`: enables `alarm`, `fired`,
//! `write`, `state`, `bump` and the process log `GET /fleet/writes`);
//! `GET /fleet/lease-events` lists the lease hooks heard, `GET
//! /fleet/process` answers the process token every counter answer carries. Prints
//! `secret <hex>` and then `pinned worker listening on http(s)://<addr>`.

use std::time::Duration;

use axum::routing::get;
use axum::{Json, Router};
use pinned::pinned_store::PostgresOptions;
use pinned::{ClusterHost, HostOptions, Options, Takeover};
use pinned_fleet::counter::{lease_events, process_token, writes, Counter};
use pinned_fleet::guarded::Guarded;

fn ms(name: &str) -> Option<Duration> {
    std::env::var(name)
        .ok()?
        .parse()
        .ok()
        .map(Duration::from_millis)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Text or JSON (`PINNED_LOG_FORMAT`) on stderr, warnings unless
    // `RUST_LOG` asks for more.
    pinned::logging::LogSettings {
        default_filter: "warn".into(),
        ..pinned::logging::LogSettings::from_env_and_args(std::env::args().skip(1))?
    }
    .init();
    let port: u16 = match std::env::var("FLEET_PORT") {
        Ok(port) => port.parse()?,
        Err(_) => 0,
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    let scheme = if std::env::var_os("PINNED_TLS_CERT").is_some() {
        "https"
    } else {
        "http"
    };
    let mut host = HostOptions::default();
    if let Some(idle) = ms("FLEET_IDLE_MS") {
        host = host.idle_timeout(idle);
    }
    if let Some(sweep) = ms("FLEET_SWEEP_MS") {
        host = host.sweep_interval(sweep);
    }
    if let Ok(max) = std::env::var("FLEET_MAX_INSTANCES") {
        host = host.max_instances(max.parse()?);
    }
    if let Ok(env) = std::env::var("FLEET_NS_ENV") {
        host = host.env(env);
    }
    let ns = std::env::var("FLEET_NS").unwrap_or_else(|_| "/counter".to_owned());
    let mut options = Options::from_env().host_with::<Counter>(&ns, host);
    if let Ok(guarded) = std::env::var("FLEET_GUARDED_NS") {
        options = options.host::<Guarded>(&guarded);
    }
    if let Ok(rooms) = std::env::var("FLEET_ROOMS_NS") {
        options =
            options.host_with::<pinned_fleet::rooms::Room>(&rooms, pinned_fleet::rooms::hosting());
    }
    if let Ok(jobs) = std::env::var("FLEET_JOBS_NS") {
        options = options.host::<pinned_fleet::jobs::Jobs>(&jobs);
    }
    let mut options = options.pinboard(
        std::env::var("PINBOARD_URL")?,
        std::env::var("PINBOARD_TOKEN")?,
        format!("{scheme}://{addr}"),
    );
    if let Ok(env) = std::env::var("FLEET_ENV") {
        options = options.placement_env(env);
    }
    if std::env::var("FLEET_CLUSTER_HOST").as_deref() == Ok("pinboard") {
        options = options.cluster_host(ClusterHost::Pinboard);
    }
    if let Ok(epoch) = std::env::var("FLEET_EPOCH") {
        options = options.deployment_epoch(epoch.parse()?);
    }
    match std::env::var("FLEET_TAKEOVER").as_deref() {
        Ok("deny") => options = options.takeover(Takeover::Deny),
        Ok("wind_down") => options = options.takeover(Takeover::WindDown),
        _ => {}
    }
    if let Some(interval) = ms("FLEET_HEARTBEAT_MS") {
        options = options.heartbeat_interval(interval);
    }
    if let Some(buffer) = ms("FLEET_LEASE_BUFFER_MS") {
        options = options.lease_buffer(buffer);
    }
    if let Ok(url) = std::env::var("FLEET_DATABASE_URL") {
        let mut pg = PostgresOptions::default();
        // Rows carry the worker's world, so pinboard's sweeper wakes its ids
        // in that world (wire.md §12.2).
        if let Ok(hostname) = std::env::var("PINNED_HOSTNAME") {
            pg.hostname = hostname;
        }
        if let Ok(env) = std::env::var("FLEET_ENV") {
            pg.env = env;
        }
        if let Some(idle) = ms("FLEET_PG_IDLE_TXN_MS") {
            pg.idle_in_transaction_timeout = idle;
        }
        let store = pinned::pinned_store::PostgresStore::open(&url, pg).await?;
        options = options.store(store);
    }
    let drain = ms("FLEET_DRAIN_MS").unwrap_or(pinned::SHUTDOWN_DRAIN_DEADLINE);
    let worker = options.build()?;
    println!("secret {}", worker.secret());
    println!("pinned worker listening on {scheme}://{addr}");
    pinned::serve(worker)
        .listener(listener)
        .routes(
            Router::new()
                .route("/fleet/writes", get(|| async { Json(writes()) }))
                .route("/fleet/process", get(|| async { process_token() }))
                .route(
                    "/fleet/lease-events",
                    get(|| async { Json(lease_events()) }),
                ),
        )
        .drain_deadline(drain)
        .await?;
    Ok(())
}
