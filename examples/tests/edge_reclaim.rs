//! The worker's connection cap as a real process (the chat example, its cap
//! lowered with `PINNED_MAX_CONNECTIONS`): idle keep-alive connections that
//! fill the cap never lock a new client out; the connection idle longest
//! is closed to make room once it has idled a second, while an older WebSocket and a head
//! in progress are left alone (`pinned_connections_reclaimed_total`).

mod support;

use std::net::SocketAddr;

use anyhow::Context as _;
use futures_util::{SinkExt, StreamExt};
use support::{start_example, PATIENCE};
use test_support::metrics::{self, Scrape};
use test_support::sockets::{
    admitted, answer, closed_within, idle_after, mid_head, request, scrape_once,
};
use tokio::io::AsyncWriteExt;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;

const MEMBERS: &[u8] = b"GET /chat/lobby/members HTTP/1.1\r\nHost: w\r\n\r\n";
/// [`MEMBERS`] without its blank line: a head in progress.
const HALF_MEMBERS: &[u8] = b"GET /chat/lobby/members HTTP/1.1\r\nHost: w\r\n";

/// A `/metrics` scrape on a connection of its own (retried while the
/// worker is at its cap with none idle).
async fn scrape(addr: SocketAddr) -> Scrape {
    test_support::eventually("a scrape", PATIENCE, || scrape_once(addr)).await
}

#[tokio::test]
async fn at_the_cap_the_longest_idle_connection_makes_room_and_a_websocket_stays(
) -> anyhow::Result<()> {
    let (_child, address) = start_example("chat", &[("PINNED_MAX_CONNECTIONS", "4")]).await?;
    let addr: SocketAddr = address.parse()?;
    let before = scrape(addr).await;

    // Oldest first: a WebSocket (which leaves the worker's cap once
    // upgraded: its instance holds it), a head in progress, then three idle
    // keep-alive connections fill the cap.
    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws://{address}/chat/lobby/ws")).await?;
    socket.send(Message::text("hello")).await?;
    let echo = timeout(PATIENCE, socket.next())
        .await?
        .context("closed")??;
    assert_eq!(echo, Message::text("hello"));
    let mut half = mid_head(addr, HALF_MEMBERS).await;
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(idle_after(addr, MEMBERS).await);
    }

    // A new client is served (once the idle ones have idled a second), in
    // the place of the longest idle one.
    let fresh = admitted(addr, MEMBERS).await;
    assert!(
        closed_within(&mut idle[0], PATIENCE).await,
        "the longest idle connection is still open"
    );
    for s in &mut idle[1..] {
        let again = request(s, MEMBERS, PATIENCE).await;
        assert_eq!(again.map(|(status, _)| status), Some(200));
    }
    // The WebSocket and the head in progress were never touched.
    socket.send(Message::text("still here")).await?;
    let echo = timeout(PATIENCE, socket.next())
        .await?
        .context("closed")??;
    assert_eq!(echo, Message::text("still here"));
    half.write_all(b"\r\n").await?;
    let finished = answer(&mut half, PATIENCE).await;
    assert_eq!(finished.map(|(status, _)| status), Some(200));

    drop((socket, half, idle, fresh));
    let after = scrape(addr).await;
    assert!(metrics::moved(&before, &after, "pinned_connections_reclaimed") >= 1.0);
    Ok(())
}
