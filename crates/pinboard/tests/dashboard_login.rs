//! The dashboard's login against a real pinboard process: the session
//! cookie is `Secure` when pinboard serves TLS or `--dashboard-secure-cookie`
//! says a TLS front door does (and only then), and failed logins are
//! limited per client address: 10 wrong tokens, then 429 with
//! `Retry-After` and a `detail` (a right token too) counted in
//! `pinboard_dashboard_logins_limited`, while another address (a second
//! loopback address, 127.0.0.2: pinboard trusts no forwarding header) logs
//! in, and after the window (`--dashboard-login-window-ms`) the first one
//! logs in again. Over plain HTTP and TLS.

mod support;

use std::net::IpAddr;
use std::time::Duration;

use reqwest::header::{RETRY_AFTER, SET_COOKIE};
use reqwest::redirect::Policy;
use support::{eventually, pinboard, Proc, TOKEN};
use test_support::{metrics, SelfSigned};
use tokio::time::Instant;

/// The limit's window in these tests: long enough for ten failures and the
/// eleventh attempt on a loaded machine, short enough to wait out.
const WINDOW_MS: u64 = 4000;

/// A client from `ip` that keeps redirects (the 303 and its cookie are
/// what is checked), trusting `pem` for TLS.
fn from(ip: &str, pem: Option<&str>) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .no_proxy()
        .redirect(Policy::none())
        .local_address(ip.parse::<IpAddr>().expect("ip"))
        .timeout(Duration::from_secs(10));
    if let Some(pem) = pem {
        b = b.add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).expect("pem"));
    }
    b.build().expect("client")
}

/// `POST /dashboard/login` with `token`: status, `Set-Cookie`,
/// `Retry-After`, body.
async fn login(c: &reqwest::Client, pb: &str, token: &str) -> (u16, String, String, String) {
    let res = c
        .post(format!("{pb}/dashboard/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={token}"))
        .send()
        .await
        .expect("login");
    let header = |name| {
        res.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (cookie, retry) = (header(SET_COOKIE), header(RETRY_AFTER));
    let status = res.status().as_u16();
    (status, cookie, retry, res.text().await.unwrap_or_default())
}

/// The attributes of a `Set-Cookie` value, lowercased (`httponly`,
/// `samesite=strict`, …), without its `name=value`.
fn attributes(cookie: &str) -> Vec<String> {
    cookie
        .split(';')
        .skip(1)
        .map(|a| a.trim().to_ascii_lowercase())
        .collect()
}

/// Logs in and out on `pb`, asserting the cookie's attributes both times
/// (`Secure` exactly when `secure`).
async fn cookie_is(pb: &Proc, c: &reqwest::Client, secure: bool) {
    let (status, cookie, _, body) = login(c, &pb.url, TOKEN).await;
    assert_eq!(status, 303, "{body}");
    assert!(cookie.starts_with("pinboard_dashboard="), "{cookie}");
    let attrs = attributes(&cookie);
    for want in ["httponly", "samesite=strict", "path=/dashboard"] {
        assert!(attrs.iter().any(|a| a == want), "{want} missing: {cookie}");
    }
    assert_eq!(attrs.iter().any(|a| a == "secure"), secure, "{cookie}");

    // Logout clears it with the same attributes.
    let session = cookie.split(';').next().expect("name=value");
    let page = c
        .get(format!("{}/dashboard", pb.url))
        .header("cookie", session)
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("page body");
    let csrf = page
        .split("name=\"csrf\" content=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no CSRF token in the page:\n{page}"));
    let res = c
        .post(format!("{}/dashboard/logout", pb.url))
        .header("cookie", session)
        .header("x-pinboard-csrf", csrf)
        .send()
        .await
        .expect("logout");
    assert_eq!(res.status(), 204);
    let cleared = res.headers()[SET_COOKIE]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
    assert_eq!(
        attributes(&cleared).iter().any(|a| a == "secure"),
        secure,
        "{cleared}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cookie_is_secure_over_tls_and_behind_a_declared_front_door_only() {
    let plain = pinboard().start();
    let front_door = pinboard().args(&["--dashboard-secure-cookie"]).start();
    let certs = SelfSigned::new();
    let tls = pinboard().tls(&certs).start();
    cookie_is(&plain, &from("127.0.0.1", None), false).await;
    cookie_is(&front_door, &from("127.0.0.1", None), true).await;
    cookie_is(&tls, &from("127.0.0.1", Some(&certs.pem)), true).await;
}

/// Ten wrong tokens from 127.0.0.1, then the limit; 127.0.0.2 unaffected;
/// 127.0.0.1 logs in again once the window ended.
async fn failures_are_limited_per_address(pb: &Proc, pem: Option<&str>) {
    let (first, second) = (from("127.0.0.1", pem), from("127.0.0.2", pem));
    let before = metrics::scrape(&first, &pb.url).await;
    let started = Instant::now();
    for i in 0..10 {
        let (status, cookie, retry, body) = login(&first, &pb.url, "wrong").await;
        assert_eq!(status, 401, "failure {i}: {body}");
        assert!(cookie.is_empty() && retry.is_empty(), "failure {i}");
    }
    let (status, cookie, retry, body) = login(&first, &pb.url, TOKEN).await;
    assert!(
        started.elapsed() < Duration::from_millis(WINDOW_MS),
        "the window ended before the 11th attempt: the machine is too slow for this test"
    );
    assert_eq!(status, 429, "the 11th attempt, a right token: {body}");
    assert!(cookie.is_empty(), "a limited login got a session: {cookie}");
    let retry: u64 = retry.parse().expect("Retry-After in seconds");
    assert!(
        (1..=WINDOW_MS / 1000).contains(&retry),
        "Retry-After {retry}"
    );
    let detail: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        detail["detail"],
        "too many failed logins from this address; try again later"
    );
    let after = metrics::scrape(&first, &pb.url).await;
    assert_eq!(
        metrics::moved(&before, &after, "pinboard_dashboard_logins_limited"),
        1.0
    );

    let (status, cookie, _, body) = login(&second, &pb.url, TOKEN).await;
    assert_eq!(status, 303, "another address is not limited: {body}");
    assert!(cookie.starts_with("pinboard_dashboard="), "{cookie}");

    // Refused attempts do not extend the window: polling through it ends.
    let patience = Duration::from_millis(WINDOW_MS * 3);
    eventually("a login after the window", patience, || async {
        let (status, _, _, _) = login(&first, &pb.url, TOKEN).await;
        (status == 303).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_are_limited_per_address_over_plain_http() {
    let window = WINDOW_MS.to_string();
    let pb = pinboard()
        .args(&["--dashboard-login-window-ms", &window])
        .start();
    failures_are_limited_per_address(&pb, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_are_limited_per_address_over_tls() {
    let certs = SelfSigned::new();
    let window = WINDOW_MS.to_string();
    let pb = pinboard()
        .args(&["--dashboard-login-window-ms", &window])
        .tls(&certs)
        .start();
    failures_are_limited_per_address(&pb, Some(&certs.pem)).await;
}
