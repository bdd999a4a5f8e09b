//! The hibernatable socket benchmark (issue 28): memory per idle
//! hibernated socket on the worker.
//!
//! The worker runs in a child process (this binary, `worker`), the clients
//! here, so the figure is the worker's alone: its resident set (`statm`),
//! which is user-space memory only (kernel socket buffers are not in it).
//! The run opens `--sockets` sockets on one instance, waits until the
//! instance hibernated (evicted, sockets open), and reports the resident
//! growth per socket; then it wakes the instance with one message whose
//! broadcast reaches every socket, waits for the next hibernation and
//! reports again (a socket that has sent and received keeps what it grew).
//!
//! With `--pinboard` it measures pinboard instead: memory per socket
//! pinboard holds for an opted-in namespace (`SocketOptions::survive_moves`).
//! The `pinboard` binary (built beside this one, so with its allocator,
//! mimalloc) runs in a child process, a worker in another (this binary,
//! `held-worker`), the clients here; the run opens `--sockets` sockets on
//! one id through pinboard, waits until pinboard holds them all and reports
//! pinboard's resident growth per socket; then one message's broadcast
//! reaches every socket and it reports again.
//!
//! ```text
//! cargo run --release -p pinned-bench --bin socket-bench                 # 10 000 sockets
//! cargo run --release -p pinned-bench --bin socket-bench -- --sockets 5000
//! cargo build --release -p pinned-pinboard --bin pinboard
//! cargo run --release -p pinned-bench --bin socket-bench -- --pinboard   # pinboard's memory
//! ```

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::routing::get;
use clap::{Parser, Subcommand};
use futures_util::{SinkExt, StreamExt};
use pinned::ws::{Accept, Socket, SocketMessage, SocketOptions, WebSocketUpgrade};
use pinned::{BoxError, Context, HostOptions, Object, Options};

#[derive(Parser)]
#[command(about = "pinned hibernatable socket benchmark")]
struct Cli {
    #[command(subcommand)]
    command: Option<Role>,
    /// Sockets opened on one instance.
    #[arg(long, default_value_t = 10_000)]
    sockets: usize,
    /// Measure pinboard's memory per held socket instead of the worker's.
    #[arg(long)]
    pinboard: bool,
    /// The `pinboard` binary (default: `pinboard` beside this binary).
    #[arg(long)]
    pinboard_bin: Option<std::path::PathBuf>,
}

#[derive(Subcommand)]
enum Role {
    /// The worker under measure (started by the benchmark itself).
    Worker,
    /// The worker of `--pinboard`: its room's sockets are held by pinboard.
    HeldWorker {
        /// pinboard's URL.
        #[arg(long)]
        pinboard_url: String,
        /// pinboard's token.
        #[arg(long)]
        token: String,
    },
}

/// A room: every message is broadcast to every socket.
struct Room;

impl Object for Room {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Room)
    }

    fn routes() -> pinned::Routes<Self> {
        axum::Router::new().route(
            "/ws",
            get(|ws: WebSocketUpgrade| async move {
                ws.accept(Accept::new().tag("member").attachment(&("member", 1u32)))
            }),
        )
    }

    async fn on_socket_message(
        &self,
        ctx: &Context,
        _socket: &Socket,
        message: SocketMessage,
    ) -> Result<(), BoxError> {
        ctx.broadcast(None, message.message);
        Ok(())
    }
}

/// The child: a worker whose idle instances hibernate within a second,
/// with its metrics on `/bench/metrics`; prints its address and serves.
async fn worker() -> anyhow::Result<()> {
    let worker = Options::new()
        .env_vars(Vec::<(String, String)>::new())
        .max_sockets(1_000_000)
        .host_with::<Room>(
            "/room",
            HostOptions::default()
                .idle_timeout(Duration::from_millis(500))
                .sweep_interval(Duration::from_millis(100)),
        )
        .build()?;
    let metrics = worker.clone();
    let app = worker.router().route(
        "/bench/metrics",
        get(move || {
            let metrics = metrics.clone();
            async move { metrics.metrics() }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", listener.local_addr()?);
    worker.start();
    axum::serve(listener, app).await?;
    Ok(())
}

/// The child of `--pinboard`: the room with its sockets held by pinboard,
/// registered with `pinboard_url`.
async fn held_worker(pinboard_url: String, token: String) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let worker = Options::new()
        .env_vars(Vec::<(String, String)>::new())
        .max_sockets(1_000_000)
        .host_with::<Room>(
            "/room",
            HostOptions::default().sockets(SocketOptions::default().survive_moves()),
        )
        .pinboard(pinboard_url, token, format!("http://{addr}"))
        .build()?;
    pinned::serve(worker).listener(listener).await?;
    Ok(())
}

fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm"))?;
    let pages: u64 = statm.split_whitespace().nth(1).context("statm")?.parse()?;
    Ok(pages * 4096)
}

/// The worker's `name`, from the bench's `/bench/metrics`.
async fn metric(client: &reqwest::Client, base: &str, name: &str) -> anyhow::Result<f64> {
    scraped(client, &format!("{base}/bench/metrics"), name).await
}

/// One sample's value in the Prometheus text at `url` (0 when absent).
async fn scraped(client: &reqwest::Client, url: &str, name: &str) -> anyhow::Result<f64> {
    let text = client.get(url).send().await?.text().await?;
    Ok(text
        .lines()
        .find_map(|line| {
            let (key, value) = line.split_once(' ')?;
            (key == name).then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0.0))
}

/// Waits (at most a minute) until `name` reaches `value`.
async fn wait_metric(
    client: &reqwest::Client,
    base: &str,
    name: &str,
    value: f64,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(client, base, name).await? < value {
        anyhow::ensure!(Instant::now() < deadline, "{name} never reached {value}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn measure(sockets: usize) -> anyhow::Result<()> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg("worker")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().context("child stdout")?;
    let child = Killed(child);
    let pid = child.0.id();
    let mut addr = String::new();
    BufReader::new(stdout).read_line(&mut addr)?;
    let addr = addr.trim().to_owned();
    let base = format!("http://{addr}");
    let url = format!("ws://{addr}/room/bench/ws");
    let client = reqwest::Client::new();

    // Warm the worker (allocator arenas, routes, the instance table) with
    // one socket on another id through a hibernation, then measure.
    {
        let (warm, _) =
            tokio_tungstenite::connect_async(format!("ws://{addr}/room/warm/ws")).await?;
        wait_metric(&client, &base, "pinned_instance_hibernations_total", 1.0).await?;
        drop(warm);
        wait_metric(&client, &base, "pinned_sockets_open", 0.0).await?;
    }
    let before = rss_bytes(pid)?;
    let opened = Instant::now();
    let mut clients = open_sockets(&url, sockets).await?;
    let opened = opened.elapsed();
    wait_metric(&client, &base, "pinned_instance_hibernations_total", 2.0).await?;
    anyhow::ensure!(
        metric(&client, &base, "pinned_sockets_open").await? == sockets as f64,
        "sockets closed during the run"
    );
    let hibernated = rss_bytes(pid)?;
    let per_socket = hibernated.saturating_sub(before) as f64 / sockets as f64;
    println!(
        "sockets: {sockets} opened in {:.1} s on one instance, which hibernated (evicted, sockets open): \
         worker RSS +{:.1} MiB, {per_socket:.0} B per idle hibernated socket (goal <= 4096)",
        opened.as_secs_f64(),
        hibernated.saturating_sub(before) as f64 / 1_048_576.0,
    );

    // One message wakes the instance; its broadcast reaches every socket.
    let woke = Instant::now();
    clients[0]
        .send(tokio_tungstenite::tungstenite::Message::text("hello"))
        .await?;
    every_socket_hears(&mut clients).await?;
    let broadcast = woke.elapsed();
    wait_metric(&client, &base, "pinned_instance_hibernations_total", 3.0).await?;
    let again = rss_bytes(pid)?;
    println!(
        "wake: one message woke the instance and its broadcast reached all {sockets} sockets in {:.0} ms; \
         hibernated again: {:.0} B per socket",
        broadcast.as_secs_f64() * 1_000.0,
        again.saturating_sub(before) as f64 / sockets as f64,
    );
    drop(clients);
    Ok(())
}

/// The token of `--pinboard`'s pinboard.
const TOKEN: &str = "socket-bench";

/// Reads `child`'s stdout until a `… listening on <url>` line.
fn listening(child: &mut Child) -> anyhow::Result<String> {
    let stdout = child.stdout.take().context("child stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        if let Some((_, url)) = line?.split_once("listening on ") {
            let url = url.trim().to_owned();
            // Keep draining its stdout so it never blocks on a full pipe.
            std::thread::spawn(move || lines.for_each(drop));
            return Ok(url);
        }
    }
    anyhow::bail!("the child exited before listening")
}

/// pinboard's own `name`, from its `/metrics` (the worker's is under
/// `/bench/metrics`, [`metric`]).
async fn pinboard_metric(client: &reqwest::Client, base: &str, name: &str) -> anyhow::Result<f64> {
    scraped(client, &format!("{base}/metrics"), name).await
}

/// Waits (at most a minute) until pinboard's `name` is `value`.
async fn wait_pinboard_metric(
    client: &reqwest::Client,
    base: &str,
    name: &str,
    value: f64,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = pinboard_metric(client, base, name).await?;
        if now == value {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{name} is {now}, never {value}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `--pinboard`: pinboard's memory per socket it holds.
async fn measure_pinboard(sockets: usize, bin: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    let bin = match bin {
        Some(bin) => bin,
        None => std::env::current_exe()?.with_file_name("pinboard"),
    };
    anyhow::ensure!(
        bin.exists(),
        "{} is missing: cargo build --release -p pinned-pinboard --bin pinboard",
        bin.display()
    );
    // Every held socket is a connection, and pinboard takes at most half
    // its open-file limit for connections: the hard limit (raising it needs
    // privileges) caps the sockets, with room for the worker's and this
    // run's own connections.
    let hard: usize = String::from_utf8(
        Command::new("sh")
            .args(["-c", "ulimit -Hn"])
            .output()?
            .stdout,
    )?
    .trim()
    .parse()
    .unwrap_or(usize::MAX);
    let nofile = (sockets * 3).max(4_096).min(hard);
    // pinboard's cap is half the limit less 32 (`pinned_edge`'s); 16 more
    // for the worker's, and this run's, own connections.
    let carried = (nofile / 2).saturating_sub(48);
    if carried < sockets {
        println!(
            "pinboard: the open-file hard limit ({hard}) carries {carried} held sockets, not {sockets}: measuring {carried}"
        );
    }
    let sockets = sockets.min(carried);
    let mut pinboard = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
        .arg(&bin)
        .args(["--listen", "127.0.0.1:0", "--token", TOKEN])
        .args(["--max-connections", &(sockets * 2).to_string()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let base = listening(&mut pinboard)?;
    let pinboard = Killed(pinboard);
    let pid = pinboard.0.id();
    let mut worker = Command::new(std::env::current_exe()?)
        .args(["held-worker", "--pinboard-url", &base, "--token", TOKEN])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let _ = &mut worker;
    let _worker = Killed(worker);
    let client = reqwest::Client::new();
    wait_pinboard_metric(&client, &base, "pinboard_live_workers", 1.0).await?;
    let ws = base.replacen("http", "ws", 1);
    let url = format!("{ws}/room/bench/ws");

    // Warm pinboard (routes, the held table, allocator) with one held
    // socket on another id, which said something and was answered.
    {
        // The first connects may come before pinboard reads the worker:
        // tried again (at most 30 s).
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut warm = loop {
            match tokio_tungstenite::connect_async(format!("{ws}/room/warm/ws")).await {
                Ok((warm, _)) => break warm,
                Err(error) if Instant::now() >= deadline => {
                    anyhow::bail!("the warm socket never connected: {error}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        warm.send(tokio_tungstenite::tungstenite::Message::text("warm"))
            .await?;
        tokio::time::timeout(Duration::from_secs(30), warm.next())
            .await?
            .context("the warm socket's broadcast")??;
        drop(warm);
        wait_pinboard_metric(&client, &base, "pinboard_held_sockets", 0.0).await?;
    }
    let before = rss_bytes(pid)?;
    let opened = Instant::now();
    let mut clients = open_sockets(&url, sockets).await?;
    let opened = opened.elapsed();
    wait_pinboard_metric(&client, &base, "pinboard_held_sockets", sockets as f64).await?;
    let held = rss_bytes(pid)?;
    let per_socket = held.saturating_sub(before) as f64 / sockets as f64;
    println!(
        "pinboard: {sockets} sockets held for an opted-in namespace (opened in {:.1} s): \
         pinboard RSS +{:.1} MiB, {per_socket:.0} B per held socket (goal <= 4096)",
        opened.as_secs_f64(),
        held.saturating_sub(before) as f64 / 1_048_576.0,
    );

    // One message: its event reaches the owner, whose broadcast comes back
    // through pinboard to every socket.
    let woke = Instant::now();
    clients[0]
        .send(tokio_tungstenite::tungstenite::Message::text("hello"))
        .await?;
    every_socket_hears(&mut clients).await?;
    let broadcast = woke.elapsed();
    let again = rss_bytes(pid)?;
    println!(
        "pinboard: one message's broadcast reached all {sockets} held sockets in {:.0} ms; \
         then {:.0} B per held socket",
        broadcast.as_secs_f64() * 1_000.0,
        again.saturating_sub(before) as f64 / sockets as f64,
    );
    drop(clients);
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Role::Worker) => worker().await,
        Some(Role::HeldWorker {
            pinboard_url,
            token,
        }) => held_worker(pinboard_url, token).await,
        None if cli.pinboard => measure_pinboard(cli.sockets, cli.pinboard_bin).await,
        None => measure(cli.sockets).await,
    }
}

/// Waits (at most 30 s each) until every socket in `clients` has heard a
/// text message: a broadcast reached them all.
async fn every_socket_hears<S>(clients: &mut [S]) -> anyhow::Result<()>
where
    S: futures_util::Stream<
            Item = Result<
                tokio_tungstenite::tungstenite::Message,
                tokio_tungstenite::tungstenite::Error,
            >,
        > + Unpin,
{
    for socket in clients {
        loop {
            match tokio::time::timeout(Duration::from_secs(30), socket.next()).await? {
                Some(Ok(tokio_tungstenite::tungstenite::Message::Text(_))) => break,
                Some(Ok(_)) => continue,
                other => anyhow::bail!("a socket did not hear the broadcast: {other:?}"),
            }
        }
    }
    Ok(())
}

/// `count` WebSockets to `url`, opened 64 at a time.
async fn open_sockets(
    url: &str,
    count: usize,
) -> anyhow::Result<
    Vec<
        tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
    >,
> {
    let mut clients = Vec::with_capacity(count);
    let mut connecting = futures_util::stream::iter(0..count)
        .map(|_| tokio_tungstenite::connect_async(url))
        .buffered(64);
    while let Some(connected) = connecting.next().await {
        clients.push(connected?.0);
    }
    Ok(clients)
}
