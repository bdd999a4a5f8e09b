//! A TCP relay standing between a worker and pinboard's registry, which
//! the test can cut: the network partition of the suite (no iptables on
//! the machine, and no root needed).
//!
//! It owns one listener and the connections through it. Cut, it becomes a
//! black hole, as a dropped route is: open connections stop carrying bytes
//! and new ones are accepted and then never answered, so the worker's calls
//! run into their own deadlines instead of failing fast. Healed, it relays
//! again (new connections only; the black-holed ones stay dead).

use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running relay to one target address.
pub(crate) struct Relay {
    /// `http://127.0.0.1:<port>`: give this to the worker as its pinboard.
    pub(crate) url: String,
    cut: Arc<watch::Sender<bool>>,
    accept: JoinHandle<()>,
}

impl Relay {
    /// Relays `127.0.0.1:<new port>` to `target` (`http://host:port`).
    pub(crate) async fn start(target: &str) -> Self {
        let target = target
            .strip_prefix("http://")
            .expect("http target")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let url = format!("http://{}", listener.local_addr().expect("relay addr"));
        let (cut, _) = watch::channel(false);
        let cut = Arc::new(cut);
        let accept = tokio::spawn(accept_loop(listener, target, cut.clone()));
        Self { url, cut, accept }
    }

    /// Black-holes every connection, open or new.
    pub(crate) fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Relays new connections again.
    pub(crate) fn heal(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, target: String, cut: Arc<watch::Sender<bool>>) {
    // Black-holed sockets are parked here until the relay goes, so the
    // worker sees no reset and no close.
    let mut parked = Vec::new();
    while let Ok((inbound, _)) = listener.accept().await {
        let is_cut = *cut.borrow();
        if is_cut {
            parked.push(inbound);
            continue;
        }
        tokio::spawn(relay_one(inbound, target.clone(), cut.subscribe()));
    }
}

/// Copies both ways until either side closes or the relay is cut; once
/// cut, holds both sockets open and silent.
async fn relay_one(mut inbound: TcpStream, target: String, mut cut: watch::Receiver<bool>) {
    let Ok(mut outbound) = TcpStream::connect(&target).await else {
        let _ = inbound.shutdown().await;
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = async { cut.wait_for(|cut| *cut).await.map(|_| ()) } => {
            // Silent until the relay itself is dropped (the test ends).
            std::future::pending::<()>().await;
        }
    }
}
