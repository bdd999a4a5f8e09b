//! The chat example as a real process: on SIGTERM every open socket is
//! closed with 1012 "service restart" as soon as the drain starts, and the
//! process exits without waiting out the 30 s drain deadline.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::{timeout, Instant};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

/// Generous: the point is that the exit does not wait for the 30 s drain
/// deadline; the measured time is printed.
const PATIENCE: Duration = Duration::from_secs(15);

/// `target/<profile>/examples/chat`, built by `cargo test` beside this test
/// (built here when missing, as under `cargo test --test`).
async fn chat_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("test binary location")?;
    let binary = profile_dir.join("examples").join("chat");
    if !binary.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "pinned-examples", "--example", "chat"])
            .status()
            .await?;
        anyhow::ensure!(status.success(), "building the chat example failed");
    }
    Ok(binary)
}

async fn start_chat() -> anyhow::Result<(Child, String)> {
    let mut child = Command::new(chat_binary().await?)
        .env("PORT", "0")
        .env("HOST", "127.0.0.1")
        .env("RUST_LOG", "warn")
        .env_remove("PINBOARD_URL")
        .env_remove("NODE_ENV")
        .env_remove("ENVIRONMENT")
        .env_remove("APP_ENV")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let address = timeout(PATIENCE, async {
        while let Some(line) = lines.next_line().await? {
            if let Some(url) = line.strip_prefix("pinned worker listening on http://") {
                return Ok(url.to_owned());
            }
        }
        anyhow::bail!("the chat example exited before listening")
    })
    .await
    .context("the chat example never listened")??;
    Ok((child, address))
}

#[tokio::test]
async fn sigterm_closes_sockets_with_1012_and_exits_promptly() -> anyhow::Result<()> {
    let (mut child, address) = start_chat().await?;
    let mut sockets = Vec::new();
    for room in ["lobby", "lobby", "games"] {
        let (socket, _) =
            tokio_tungstenite::connect_async(format!("ws://{address}/chat/{room}/ws")).await?;
        sockets.push(socket);
    }
    // Each socket is live in its room: a message comes back to its sender.
    for socket in &mut sockets {
        socket.send(Message::text("hello")).await?;
        let echo = timeout(PATIENCE, socket.next())
            .await?
            .context("closed")??;
        assert_eq!(echo, Message::text("hello"));
    }

    let pid = child.id().context("pid")?;
    let signalled = Instant::now();
    let kill = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await?;
    assert!(kill.success());

    for socket in &mut sockets {
        let close = timeout(PATIENCE, async {
            while let Some(message) = socket.next().await {
                if let Message::Close(frame) = message? {
                    return Ok(frame);
                }
            }
            anyhow::bail!("the socket ended without a close frame")
        })
        .await
        .context("no close frame")??;
        let frame = close.context("a close frame without a code")?;
        assert_eq!(frame.code, CloseCode::Restart, "close code 1012");
    }
    let status = timeout(PATIENCE, child.wait())
        .await
        .context("the chat example did not exit")??;
    let exited = signalled.elapsed();
    eprintln!("chat example exited {exited:?} after SIGTERM with 3 sockets open");
    assert!(status.success(), "exit status {status}");
    Ok(())
}
