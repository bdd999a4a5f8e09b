//! TLS end to end: a pinboard serving HTTPS with a self-signed certificate
//! (made in the test), and a Rust worker that serves HTTPS itself
//! (`PINNED_TLS_CERT` / `PINNED_TLS_KEY`, advertising `https://`) and
//! registers with that pinboard over `https://`, trusting the certificate
//! through `PINNED_PINBOARD_CA`. pinboard's challenge probe and every
//! proxied request reach the worker over TLS, trusting it through
//! `--upstream-ca`. A client asks pinboard over HTTPS and gets the
//! worker's answers; a plain-HTTP client of the worker gets none.

mod support;

use std::time::Duration;

use support::{pinboard, rust_worker, wait_workers};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A self-signed certificate for `localhost` and `127.0.0.1`, in PEM files.
fn certs() -> test_support::SelfSigned {
    test_support::SelfSigned::new()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_registers_with_an_https_pinboard_and_is_reached_over_https() {
    let certs = certs();
    let cert = certs.cert.to_str().expect("utf-8 path");
    let key = certs.key.to_str().expect("utf-8 path");
    let pb = pinboard()
        .args(&["--tls-cert", cert, "--tls-key", key, "--upstream-ca", cert])
        .start();
    assert!(pb.url.starts_with("https://"), "{}", pb.url);
    let worker = rust_worker(&pb.url)
        .envs(&[
            ("PINNED_PINBOARD_CA", cert),
            ("PINNED_TLS_CERT", cert),
            ("PINNED_TLS_KEY", key),
        ])
        .start();
    assert!(worker.url.starts_with("https://"), "{}", worker.url);

    let c = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(certs.pem.as_bytes()).expect("pem"))
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    // Registered over https, challenged over https.
    let rows = wait_workers(&c, &pb.url, 1).await;
    assert_eq!(rows[0]["advertiseUrl"], worker.url.as_str(), "{rows:?}");

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

    // The worker speaks TLS only: plain HTTP gets no HTTP answer.
    let addr = worker.url.trim_start_matches("https://");
    let mut plain = tokio::net::TcpStream::connect(addr).await.expect("connect");
    plain
        .write_all(b"GET /_pinned/stats HTTP/1.1\r\nHost: w\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), plain.read(&mut buf))
        .await
        .expect("an end in time")
        .unwrap_or(0);
    assert!(!buf[..n].starts_with(b"HTTP/"), "answered in clear text");
}
