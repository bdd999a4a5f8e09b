//! TLS end to end: a pinboard serving HTTPS with a self-signed certificate
//! (made in the test), a Rust worker that registers with it over
//! `https://` trusting that certificate through `PINNED_PINBOARD_CA`, and
//! whose advertise URL is `https://` too (a TLS front in the test relays to
//! its plain port), so pinboard's challenge probe and every proxied request
//! reach it over TLS, trusting it through `--upstream-ca`. A client asks
//! pinboard over HTTPS and gets the worker's answers.

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pinned_edge::tls::{self, tokio_rustls::TlsAcceptor};
use support::{pinboard, rust_worker, wait_workers};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A self-signed certificate for `localhost` and `127.0.0.1`, in PEM files.
struct Certs {
    _dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
    pem: String,
}

fn certs() -> Certs {
    let made =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("rcgen");
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    let pem = made.cert.pem();
    std::fs::write(&cert, &pem).expect("cert");
    std::fs::write(&key, made.key_pair.serialize_pem()).expect("key");
    Certs {
        _dir: dir,
        cert,
        key,
        pem,
    }
}

/// A TLS front: terminates TLS on its own port and relays each connection
/// to the plain address set on the returned sender (awaited, with a
/// deadline, by connections that arrive first). Counts completed
/// handshakes.
async fn tls_front(
    certs: &Certs,
) -> (
    SocketAddr,
    watch::Sender<Option<SocketAddr>>,
    Arc<AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    let acceptor = TlsAcceptor::from(tls::server_config(&certs.cert, &certs.key).expect("config"));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (target, target_rx) = watch::channel(None::<SocketAddr>);
    let handshakes = Arc::new(AtomicUsize::new(0));
    let counted = handshakes.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, mut target, counted) =
                (acceptor.clone(), target_rx.clone(), counted.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = tls::accept(&acceptor, tcp, Duration::from_secs(5)).await else {
                    return;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                let to = match tokio::time::timeout(
                    Duration::from_secs(10),
                    target.wait_for(Option::is_some),
                )
                .await
                {
                    Ok(Ok(to)) => *to,
                    _ => return,
                };
                let Some(to) = to else { return };
                let Ok(mut plain) = TcpStream::connect(to).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (addr, target, handshakes, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_registers_with_an_https_pinboard_and_is_reached_over_https() {
    let certs = certs();
    let cert = certs.cert.to_str().expect("utf-8 path");
    let key = certs.key.to_str().expect("utf-8 path");
    let pb = pinboard(&["--tls-cert", cert, "--tls-key", key, "--upstream-ca", cert]);
    assert!(pb.url.starts_with("https://"), "{}", pb.url);
    let (front, target, handshakes, front_task) = tls_front(&certs).await;
    let advertise = format!("https://127.0.0.1:{}", front.port());
    let worker = rust_worker(
        &pb.url,
        &[
            ("PINNED_PINBOARD_CA", cert),
            ("FLEET_ADVERTISE_URL", advertise.as_str()),
        ],
    );
    let plain: SocketAddr = worker
        .url
        .strip_prefix("http://")
        .expect("worker url")
        .parse()
        .expect("worker address");
    target.send_replace(Some(plain));

    let c = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(certs.pem.as_bytes()).expect("pem"))
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    // Registered over https: the challenge came through the TLS front.
    let rows = wait_workers(&c, &pb.url, 1).await;
    assert_eq!(rows[0]["advertiseUrl"], advertise.as_str(), "{rows:?}");
    let challenged = handshakes.load(Ordering::SeqCst);
    assert!(challenged >= 1, "the challenge did not use TLS");

    // Proxied end to end: client → https pinboard → https worker.
    for expected in 1..=3 {
        let res = c
            .get(format!("{}/counter/tls-a/hit", pb.url))
            .send()
            .await
            .expect("hit");
        assert_eq!(res.status(), 200);
        let body: serde_json::Value = res.json().await.expect("json");
        assert_eq!(body["count"], expected, "{body}");
    }
    assert!(
        handshakes.load(Ordering::SeqCst) > challenged,
        "proxied requests did not reach the worker over TLS"
    );
    front_task.abort();
}
