//! A socket with bytes put back in front of it: how a connection a
//! server started reading with this codec is handed to hyper with what
//! was already read.
//!
//! Owns only the put-back bytes; never reads ahead and never writes
//! anything of its own.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `inner`, with `prefix` read first.
#[derive(Debug)]
pub struct Rewind<T> {
    prefix: Bytes,
    inner: T,
}

impl<T> Rewind<T> {
    /// Reads `prefix` before anything from `inner`.
    pub fn new(prefix: Bytes, inner: T) -> Self {
        Self { prefix, inner }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            if self.prefix.is_empty() {
                // An empty slice still keeps the whole read buffer it was
                // cut from (8 KiB and more) for the connection's life: an
                // upgraded connection would carry it while it idles.
                self.prefix = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn the_prefix_comes_first_then_the_socket() {
        let (mut near, far) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut near, b" world")
            .await
            .expect("write");
        drop(near);
        let mut io = Rewind::new(Bytes::from_static(b"hello"), far);
        let mut small = [0u8; 3];
        io.read_exact(&mut small).await.expect("read");
        assert_eq!(&small, b"hel");
        let mut rest = Vec::new();
        io.read_to_end(&mut rest).await.expect("read");
        assert_eq!(rest, b"lo world");
    }

    #[tokio::test]
    async fn a_read_prefix_lets_its_buffer_go() {
        let mut buffer = bytes::BytesMut::with_capacity(8 * 1024);
        buffer.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        let read = buffer.freeze();
        let (_near, far) = tokio::io::duplex(64);
        let mut io = Rewind::new(read.clone(), far);
        let mut head = vec![0u8; read.len()];
        io.read_exact(&mut head).await.expect("read");
        assert!(read.is_unique(), "the rewind still holds the read buffer");
    }
}
