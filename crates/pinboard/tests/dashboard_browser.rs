//! The dashboard in a real browser: Debian's headless chromium driven over
//! WebDriver (`chromedriver`, installed by `scripts/browser`) against a
//! real pinboard process with two real Python reference workers. Logs in
//! with the operator token, sees both workers and their placements, drains
//! one from the page (through the confirmation dialog) and sees its state
//! change, takes a screenshot (into `$PINBOARD_SCREENSHOT_DIR` when set, a
//! temporary directory otherwise: never the checkout; the guide's
//! `docs/dashboard.png` is refreshed by copying it there), and logs out. Also
//! checks, over plain HTTP, what a browser cannot show: a wrong token gets
//! no session, and an action without the CSRF header is refused.

mod support;

use std::time::Duration;

use fantoccini::Locator;
use serde_json::{json, Value};
use support::{client, eventually, get_json, pinboard, python_worker};
use test_support::browser::{self, texts};
use test_support::PATIENCE;

const OPERATOR: &str = "dashboard-operator-token";

/// The session owning `/counter/<id>` (operator placements search).
async fn owner_of(c: &reqwest::Client, pb: &str, id: &str) -> String {
    let v: Value = c
        .get(format!("{pb}/registry/placements?ns=/counter&id={id}"))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .expect("placements")
        .json()
        .await
        .expect("placements json");
    v["placements"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["id"] == id))
        .and_then(|r| r["sessionId"].as_str())
        .unwrap_or_else(|| panic!("no placement of {id}: {v}"))
        .to_owned()
}

/// The registry's worker rows, read with the operator token.
async fn operator_workers(c: &reqwest::Client, pb: &str) -> Vec<Value> {
    test_support::workers(c, pb, OPERATOR).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_in_see_workers_and_placements_drain_one_and_log_out() {
    // A roomy lease: chromium shares the two cores with the Python
    // workers, whose heartbeats must not fall behind a 2 s lease.
    let pb = pinboard()
        .args(&["--operator-token", OPERATOR, "--lease-ttl-ms", "10000"])
        .start();
    // Both hostless: a request without `Pinboard-Hostname` reaches only
    // workers registered without a hostname, so the drained worker's ids
    // can move to the other.
    let _first = python_worker(&pb.url).start();
    let _second = python_worker(&pb.url).start();
    let driver = browser::chromedriver();
    let c = client();
    let workers = eventually("two workers", PATIENCE, || async {
        let rows = operator_workers(&c, &pb.url).await;
        (rows.len() == 2).then_some(rows)
    })
    .await;
    for i in 0..6 {
        get_json(&c, &format!("{}/counter/room{i}/hit", pb.url), PATIENCE).await;
    }
    // The worker to drain owns at least one of them: `room0`'s owner.
    let target_sid = owner_of(&c, &pb.url, "room0").await;
    // Some traffic while the page is open, for its charts.
    let traffic = {
        let (c, url) = (c.clone(), pb.url.clone());
        tokio::spawn(async move {
            // A request every 40 ms: the load's pace, not a wait.
            let mut pace = tokio::time::interval(Duration::from_millis(40));
            for i in 0u64.. {
                pace.tick().await;
                let _ = c
                    .get(format!("{url}/counter/room{}/hit", i % 6))
                    .send()
                    .await;
            }
        })
    };

    // Plain HTTP: a wrong token gets the form again and no cookie; an
    // action with the cookie but without the CSRF header is refused.
    let plain = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let login = format!("{}/dashboard/login", pb.url);
    let res = plain
        .post(&login)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("token=wrong")
        .send()
        .await
        .expect("login");
    assert_eq!(res.status(), 401);
    assert!(res.headers().get("set-cookie").is_none());
    let res = plain
        .post(&login)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={OPERATOR}"))
        .send()
        .await
        .expect("login");
    assert_eq!(res.status(), 303);
    let cookie = res.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let session = cookie.split(';').next().expect("pair").to_owned();
    let push = format!("{}/dashboard/api/push", pb.url);
    let undrain = json!({"type": "undrain", "sessionId": workers[0]["sessionId"]});
    let res = plain
        .post(&push)
        .header("cookie", &session)
        .json(&undrain)
        .send()
        .await
        .expect("push");
    assert_eq!(res.status(), 403, "no CSRF header");
    let res = plain.post(&push).json(&undrain).send().await.expect("push");
    assert_eq!(res.status(), 401, "no session");
    let res = plain
        .get(format!("{}/dashboard/api/state", pb.url))
        .send()
        .await
        .expect("state");
    assert_eq!(res.status(), 401);

    // The browser.
    let b = browser::session(&driver).await;
    b.goto(&format!("{}/dashboard", pb.url))
        .await
        .expect("goto");
    b.find(Locator::Id("token"))
        .await
        .expect("login form")
        .send_keys(OPERATOR)
        .await
        .expect("type the token");
    b.find(Locator::Id("login"))
        .await
        .expect("button")
        .click()
        .await
        .expect("log in");
    let rows = eventually("both workers on the page", PATIENCE, || async {
        let rows = texts(&b, "#workers tbody tr").await;
        (rows.len() == 2).then_some(rows)
    })
    .await;
    for w in &workers {
        let sid = w["sessionId"].as_str().expect("sid");
        assert!(rows.iter().any(|r| r.contains(&sid[..12])), "{rows:?}");
    }
    let url = b.current_url().await.expect("url");
    assert!(
        !url.as_str().contains(OPERATOR),
        "the token is in the URL: {url}"
    );
    let cookie = b
        .get_named_cookie("pinboard_dashboard")
        .await
        .expect("the session cookie");
    assert_eq!(cookie.http_only(), Some(true));
    assert_eq!(format!("{:?}", cookie.same_site()), "Some(Strict)");
    let placements = eventually("six placements on the page", PATIENCE, || async {
        let rows = texts(&b, "#placements tbody tr").await;
        (rows.len() == 6).then_some(rows)
    })
    .await;
    assert!(
        placements.iter().all(|r| r.contains("/counter")),
        "{placements:?}"
    );

    // Drain the owner of `room0` from the page.
    let row = format!("#workers tr[data-session=\"{target_sid}\"]");
    b.find(Locator::Css(&format!("{row} button.drain")))
        .await
        .expect("drain button")
        .click()
        .await
        .expect("click drain");
    let ok = b
        .wait()
        .at_most(PATIENCE)
        .for_element(Locator::Id("confirm-ok"))
        .await
        .expect("dialog");
    let deadline = b
        .find(Locator::Id("confirm-deadline"))
        .await
        .expect("deadline input");
    assert_eq!(
        deadline.prop("value").await.expect("value").as_deref(),
        Some("30")
    );
    // Two seconds: its instances keep serving the page's traffic, so they
    // leave at the deadline rather than when they next go idle.
    deadline.clear().await.expect("clear deadline");
    deadline.send_keys("2").await.expect("type deadline");
    ok.click().await.expect("confirm");
    eventually("the page shows the drain", PATIENCE, || async {
        let state = texts(&b, &format!("{row} td.state")).await;
        (state == ["draining"]).then_some(())
    })
    .await;
    let drained = operator_workers(&c, &pb.url).await;
    assert!(
        drained
            .iter()
            .any(|w| w["sessionId"] == target_sid.as_str() && w["draining"] == true),
        "{drained:?}"
    );

    // The drained worker's ids moved to the other one, and the page says why.
    let moves = eventually("moves shown with their reason", PATIENCE, || async {
        let moves = texts(&b, "#moves tbody tr").await;
        moves.iter().any(|m| m.ends_with("drain")).then_some(moves)
    })
    .await;
    assert!(
        moves.iter().any(|m| m.contains(&target_sid[..12])),
        "{moves:?}"
    );

    // The charts have a few samples of traffic: then the screenshot.
    eventually("traffic charted", PATIENCE, || async {
        let card = b.find(Locator::Css("#traffic .chart-card")).await.ok()?;
        let samples: usize = card.attr("data-samples").await.ok()??.parse().ok()?;
        let rate: f64 = texts(&b, "#traffic .chart-card b")
            .await
            .first()?
            .parse()
            .ok()?;
        (samples >= 5 && rate > 0.0).then_some(())
    })
    .await;
    let png = b.screenshot().await.expect("screenshot");
    // Never into the checkout: a test leaves `git status` clean.
    browser::ScreenshotDir::from_env().save("dashboard.png", &png);

    // Log out: back to the form, and the session is gone.
    b.find(Locator::Id("logout"))
        .await
        .expect("logout")
        .click()
        .await
        .expect("click");
    b.wait()
        .at_most(PATIENCE)
        .for_element(Locator::Id("token"))
        .await
        .expect("login form again");
    assert!(
        b.get_named_cookie("pinboard_dashboard").await.is_err(),
        "cookie cleared"
    );
    traffic.abort();
    b.close().await.expect("close the browser");
}
