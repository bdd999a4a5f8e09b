//! Client connections an edge test holds in one phase of their life, and
//! what the kernel says of the server's end: a connection idle after one
//! answer (keep-alive), one in the middle of a head the server has read,
//! whether the server closed one, and a `/metrics` scrape that leaves no
//! connection behind (for tests at a connection cap, where a pooled
//! client's idle connection would count).
//!
//! Raw sockets only: the bytes a test sends are exactly its own. Linux
//! only where the kernel's socket table is read.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::metrics::{self, Scrape};
use crate::poll::{eventually, PATIENCE};

/// The server's end `(local, remote)` of a loopback connection as the
/// kernel has it: its TCP state (`01` established, `08` close-wait: the
/// peer's FIN was taken) and the bytes waiting to be read; `None` when
/// there is no such socket. Read from `/proc/net/tcp` (Linux only).
///
/// # Panics
///
/// When `/proc/net/tcp` cannot be read.
pub fn kernel_socket((local, remote): (SocketAddr, SocketAddr)) -> Option<(String, u64)> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let (local, remote) = (
        format!(":{:04X}", local.port()),
        format!(":{:04X}", remote.port()),
    );
    table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if !cols.get(1)?.ends_with(&local) || !cols.get(2)?.ends_with(&remote) {
            return None;
        }
        let rx = cols.get(4)?.split(':').nth(1)?;
        Some((
            (*cols.get(3)?).to_owned(),
            u64::from_str_radix(rx, 16).ok()?,
        ))
    })
}

/// A connection to `addr`, `TCP_NODELAY` set.
///
/// # Panics
///
/// When it cannot connect.
pub async fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).await.expect("connect");
    s.set_nodelay(true).expect("nodelay");
    s
}

/// Sends `head` (a whole request without a body) on `s` and reads its
/// [`answer`].
pub async fn request(s: &mut TcpStream, head: &[u8], patience: Duration) -> Option<(u16, Vec<u8>)> {
    s.write_all(head).await.ok()?;
    answer(s, patience).await
}

/// Reads one answer on `s` framed by `Content-Length` (or none): its
/// status and body. `None` when the connection closed (or failed) first,
/// or `patience` passed.
pub async fn answer(s: &mut TcpStream, patience: Duration) -> Option<(u16, Vec<u8>)> {
    let deadline = Instant::now() + patience;
    let mut got = Vec::new();
    let end = loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        read_more(s, &mut got, deadline).await?;
    };
    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(Some(0), |v| v.trim().parse().ok())?;
    while got.len() < end + len {
        read_more(s, &mut got, deadline).await?;
    }
    Some((status, got[end..end + len].to_vec()))
}

/// One read onto `got` before `deadline`; `None` at the end of the stream,
/// on an error or at the deadline.
async fn read_more(s: &mut TcpStream, got: &mut Vec<u8>, deadline: Instant) -> Option<()> {
    let mut chunk = [0u8; 8192];
    let n = tokio::time::timeout_at(deadline, s.read(&mut chunk))
        .await
        .ok()?
        .ok()?;
    (n > 0).then(|| got.extend_from_slice(&chunk[..n]))
}

/// A connection that sent `head` and got a 200 for it, left open and idle
/// (keep-alive).
///
/// # Panics
///
/// When the answer is not a 200 within [`PATIENCE`].
pub async fn idle_after(addr: SocketAddr, head: &[u8]) -> TcpStream {
    let mut s = connect(addr).await;
    let answer = request(&mut s, head, PATIENCE).await;
    assert_eq!(
        answer.as_ref().map(|(status, _)| *status),
        Some(200),
        "{head:?}"
    );
    s
}

/// A new connection whose `head` was answered 200, retried while the
/// server closes new connections unanswered (at its cap, until one of its
/// connections has idled long enough to make room).
///
/// # Panics
///
/// When none is answered within [`PATIENCE`].
pub async fn admitted(addr: SocketAddr, head: &[u8]) -> TcpStream {
    eventually("a new connection to be served", PATIENCE, || async {
        let mut s = connect(addr).await;
        let answer = request(&mut s, head, PATIENCE).await?;
        assert_eq!(answer.0, 200, "{head:?}");
        Some(s)
    })
    .await
}

/// A connection that sent `partial` (part of a head) and whose server end
/// has read it (the kernel holds none of it any more): the server is in
/// the middle of reading a head.
///
/// # Panics
///
/// When the server does not read it within [`PATIENCE`].
pub async fn mid_head(addr: SocketAddr, partial: &[u8]) -> TcpStream {
    let mut s = connect(addr).await;
    s.write_all(partial).await.expect("write");
    let ends = (addr, s.local_addr().expect("local address"));
    eventually("the server to read the partial head", PATIENCE, || async {
        kernel_socket(ends)
            .is_some_and(|(_, unread)| unread == 0)
            .then_some(())
    })
    .await;
    s
}

/// Reads (and discards) until the server closes `s` (EOF or reset): true,
/// or false when `patience` passed with it open.
pub async fn closed_within(s: &mut TcpStream, patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// `GET /metrics` on a connection of its own, closed by the server after
/// the answer (`Connection: close`), parsed; `None` when the server closed
/// the connection without answering (at a connection cap, say).
pub async fn scrape_once(addr: SocketAddr) -> Option<Scrape> {
    let mut s = connect(addr).await;
    let head = b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n";
    let (status, body) = request(&mut s, head, PATIENCE).await?;
    (status == 200).then(|| metrics::parse(&String::from_utf8_lossy(&body)))
}
