//! The chat example as a real process: on SIGTERM every open socket is
//! closed with 1012 "service restart" as soon as the drain starts, and the
//! process exits without waiting out the 30 s drain deadline.

mod support;

use anyhow::Context as _;
use futures_util::{SinkExt, StreamExt};
use support::{start_example, PATIENCE};
use tokio::process::Command;
use tokio::time::{timeout, Instant};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn sigterm_closes_sockets_with_1012_and_exits_promptly() -> anyhow::Result<()> {
    let (mut child, address) = start_example("chat", &[]).await?;
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
