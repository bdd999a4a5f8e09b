//! A whole fleet in one command: pinboard on its memory store and three
//! workers of the examples (the counter, the chat room, the jobs runner),
//! all in this one process, registered with pinboard under a throwaway
//! token.
//!
//! ```text
//! cargo run --release --example fleet
//! curl -X POST localhost:7070/counter/a/increment     # through pinboard
//! ```
//!
//! It prints the URLs to try and a throwaway operator token for
//! `pinboard workers` and the dashboard. Ctrl-C (or SIGTERM) drains the
//! workers first (each hands its instances back and deregisters), then
//! stops pinboard; everything is gone within a few seconds.
//!
//! `PINBOARD_LISTEN` moves pinboard (default `127.0.0.1:7070`; port 0
//! picks a free one); `RUST_LOG` and `PINNED_LOG_FORMAT` (or `--log-format
//! json`) shape the logs on stderr. Nothing else is read from the environment: the fleet
//! uses no Redis, no Postgres, and keeps the jobs' SQLite file in a
//! temporary directory removed at exit.

#[allow(dead_code)]
#[path = "chat.rs"]
mod chat;
#[allow(dead_code)]
#[path = "counter.rs"]
mod counter;
#[allow(dead_code)]
#[path = "jobs.rs"]
mod jobs;

use std::time::Duration;

use clap::Parser as _;
use pinned::pinned_store::StoreConfig;
use pinned::Options;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Where pinboard listens unless `PINBOARD_LISTEN` says otherwise.
const DEFAULT_LISTEN: &str = "127.0.0.1:7070";
/// How long a worker's drain lets instances finish on Ctrl-C.
const WORKER_DRAIN: Duration = Duration::from_secs(5);
/// How long the fleet waits for each stage of its shutdown.
const STOP_PATIENCE: Duration = Duration::from_secs(15);
/// How long the workers have to register at start.
const REGISTER_PATIENCE: Duration = Duration::from_secs(20);

type Error = Box<dyn std::error::Error + Send + Sync>;

fn throwaway_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// One worker of the fleet: what it hosts, where it listens.
struct Member {
    name: &'static str,
    url: String,
    task: JoinHandle<Result<(), pinned::ServeError>>,
}

async fn start_member(
    name: &'static str,
    options: impl FnOnce(Options) -> Options,
    pinboard: &str,
    token: &str,
    stop: &watch::Receiver<bool>,
) -> Result<Member, Error> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let env = [
        ("PINBOARD_URL", pinboard.to_owned()),
        ("PINBOARD_TOKEN", token.to_owned()),
        ("ADVERTISE_URL", url.clone()),
    ];
    let mut stop = stop.clone();
    let serve = pinned::serve(options(Options::new().env_vars(env)))
        .listener(listener)
        .drain_deadline(WORKER_DRAIN)
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        });
    Ok(Member {
        name,
        url,
        task: tokio::spawn(async move { serve.await }),
    })
}

/// Polls pinboard's worker list until `n` workers are live.
async fn wait_registered(pinboard: &str, operator: &str, n: usize) -> Result<(), Error> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let deadline = tokio::time::Instant::now() + REGISTER_PATIENCE;
    loop {
        let live = async {
            let v: serde_json::Value = client
                .get(format!("{pinboard}/registry/workers"))
                .bearer_auth(operator)
                .send()
                .await?
                .json()
                .await?;
            Ok::<_, reqwest::Error>(v["workers"].as_array().map_or(0, Vec::len))
        }
        .await
        .unwrap_or(0);
        if live >= n {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("only {live} of {n} workers registered in time").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    // Text or JSON (`PINNED_LOG_FORMAT`, `--log-format`) on stderr; only
    // warnings unless `RUST_LOG` asks for more (the fleet prints its URLs).
    pinned::logging::LogSettings {
        default_filter: "warn".into(),
        ..pinned::logging::LogSettings::from_env_and_args(std::env::args().skip(1))?
    }
    .init();
    let token = throwaway_token();
    let operator = throwaway_token();
    let listen = std::env::var("PINBOARD_LISTEN").unwrap_or_else(|_| DEFAULT_LISTEN.into());
    let listener = TcpListener::bind(&listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e} (set PINBOARD_LISTEN)"))?;
    let addr = listener.local_addr()?;
    let pinboard_url = format!("http://{addr}");
    // The memory store, whatever the environment says, and no quarantine:
    // nothing ran before this fleet.
    let mut config = pinboard::Config::try_parse_from([
        "pinboard",
        "--token",
        &token,
        "--operator-token",
        &operator,
        "--quarantine-ms",
        "0",
        "--listen",
        &addr.to_string(),
    ])?;
    config.redis_url = None;
    config.database_url = None;
    let (stop_pinboard, pinboard_stopped) = watch::channel(false);
    let mut pinboard_stop = pinboard_stopped.clone();
    let pinboard = tokio::spawn(pinboard::run(config, listener, async move {
        let _ = pinboard_stop.wait_for(|s| *s).await;
    }));
    println!("pinboard listening on {pinboard_url}");

    let dir = tempfile::tempdir()?;
    let jobs_store = StoreConfig::from_location(None, dir.path().join("jobs.db"))?
        .open()
        .await?;
    let (stop_workers, workers_stopped) = watch::channel(false);
    let members = vec![
        start_member(
            "counter",
            |o| o.host::<counter::Counter>("/counter"),
            &pinboard_url,
            &token,
            &workers_stopped,
        )
        .await?,
        start_member(
            "chat",
            |o| o.host_with::<chat::Room>("/chat", chat::hosting()),
            &pinboard_url,
            &token,
            &workers_stopped,
        )
        .await?,
        start_member(
            "jobs",
            |o| o.host::<jobs::Runner>("/runners").store(jobs_store),
            &pinboard_url,
            &token,
            &workers_stopped,
        )
        .await?,
    ];
    let ready = tokio::select! {
        ready = wait_registered(&pinboard_url, &operator, members.len()) => ready,
        () = pinned::shutdown_signal() => Err("interrupted before the fleet was up".into()),
    };
    if let Err(e) = ready {
        eprintln!("fleet: {e}");
    } else {
        print_welcome(&pinboard_url, &operator, &members);
        pinned::shutdown_signal().await;
        println!("fleet: draining the workers, then stopping pinboard");
    }

    let _ = stop_workers.send(true);
    for member in members {
        match tokio::time::timeout(STOP_PATIENCE, member.task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => eprintln!("fleet: the {} worker failed: {e}", member.name),
            Ok(Err(e)) => eprintln!("fleet: the {} worker panicked: {e}", member.name),
            Err(_) => eprintln!("fleet: the {} worker did not stop in time", member.name),
        }
    }
    let _ = stop_pinboard.send(true);
    match tokio::time::timeout(STOP_PATIENCE, pinboard).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => eprintln!("fleet: pinboard failed: {e}"),
        Ok(Err(e)) => eprintln!("fleet: pinboard panicked: {e}"),
        Err(_) => eprintln!("fleet: pinboard did not stop in time"),
    }
    println!("fleet stopped");
    Ok(())
}

fn print_welcome(pinboard: &str, operator: &str, members: &[Member]) {
    println!("fleet ready: {} workers registered", members.len());
    for m in members {
        println!("  {:<8} worker at {}", m.name, m.url);
    }
    println!(
        "\ntry (through pinboard):\n  \
         curl -X POST {pinboard}/counter/a/increment\n  \
         curl {pinboard}/counter/a/value\n  \
         websocat {ws}/chat/lobby/ws\n  \
         curl -X POST {pinboard}/runners/r1/enqueue -H 'content-type: application/json' -d '{{\"name\":\"build\"}}'\n  \
         curl {pinboard}/runners/r1/done",
        ws = pinboard.replacen("http://", "ws://", 1),
    );
    println!(
        "\noperate (throwaway operator token, valid until Ctrl-C):\n  \
         dashboard  {pinboard}/dashboard  (log in with the token below)\n  \
         token      {operator}\n  \
         PINBOARD_URL={pinboard} PINBOARD_OPERATOR_TOKEN={operator} cargo run -p pinned-pinboard -- workers\n\n\
         Ctrl-C drains the workers and stops everything."
    );
}
