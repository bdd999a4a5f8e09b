//! The dashboard's storage inspector in a real browser: Debian's headless
//! chromium over WebDriver (`chromedriver`, installed by
//! `scripts/browser`) against a real pinboard, a real Rust worker and the
//! Postgres store. A job queue's poisoned job parks its tray; the operator
//! lists the namespace's parked ids, shows the id, skips the head item
//! (through the confirmation dialog) and sees it in the dead letters while
//! the next job runs, then pauses and resumes the id. The screenshot of
//! the inspector goes to `$PINBOARD_SCREENSHOT_DIR/inspector.png` (a
//! temporary directory when unset: never the checkout; the README's
//! `docs/inspector.png` is refreshed by copying it there).

mod support;

use fantoccini::{Client, Locator};
use pinned_store::conformance::{database_url, unique_ns, PostgresCleanup};
use serde_json::{json, Value};
use support::{client, eventually, pinboard, rust_worker, wait_workers, TOKEN};
use test_support::browser::{self, click};
use test_support::PATIENCE;

async fn text(b: &Client, css: &str) -> Option<String> {
    b.find(Locator::Css(css)).await.ok()?.text().await.ok()
}

async fn done(c: &reqwest::Client, pb: &str, ns: &str, id: &str) -> Value {
    let res = c
        .get(format!("{pb}{ns}/{id}/done"))
        .send()
        .await
        .expect("done");
    res.json().await.unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_storage_inspector_page_shows_and_skips_a_poisoned_job() {
    let ns = unique_ns("inspect-page");
    let _cleanup = PostgresCleanup::new(&ns);
    let url = database_url();
    let pb = pinboard()
        .args(&["--database-url", &url, "--lease-ttl-ms", "10000"])
        .start();
    let _w = rust_worker(&pb.url)
        .envs(&[("FLEET_JOBS_NS", &ns), ("FLEET_DATABASE_URL", &url)])
        .start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    for job in ["poison-1", "ok-1"] {
        let res = c
            .post(format!("{}{ns}/j/enqueue/{job}", pb.url))
            .send()
            .await
            .expect("enqueue");
        assert_eq!(res.status(), 200);
    }
    eventually("the tray parked", PATIENCE, || async {
        (done(&c, &pb.url, &ns, "j").await["parked"] == json!(true)).then_some(())
    })
    .await;

    let driver = browser::chromedriver();
    let b = browser::session(&driver).await;
    b.goto(&format!("{}/dashboard", pb.url))
        .await
        .expect("goto");
    b.find(Locator::Id("token"))
        .await
        .expect("login form")
        .send_keys(TOKEN)
        .await
        .expect("type the token");
    click(&b, "button[type=submit]").await;
    b.wait()
        .at_most(PATIENCE)
        .for_element(Locator::Id("inspect-ns"))
        .await
        .expect("the dashboard")
        .send_keys(&ns)
        .await
        .expect("type the namespace");
    b.find(Locator::Css("#inspect-filter option[value=parked]"))
        .await
        .expect("the parked filter")
        .click()
        .await
        .expect("choose it");
    click(&b, "#inspect-list").await;
    click(&b, "#inspect-ids tr[data-id=j] .inspect-show").await;
    eventually("the parked tray shown", PATIENCE, || async {
        let attempts = text(&b, "#inspect-trays tr[data-tray='jobs/~'] td:nth-child(5)").await?;
        (attempts == "2").then_some(())
    })
    .await;

    // Skip the poison through the dialog: the next job runs, the poison is
    // a dead letter.
    click(&b, "#inspect-trays .inspect-skip").await;
    click(&b, "#confirm-ok").await;
    eventually("the next job done", PATIENCE, || async {
        (done(&c, &pb.url, &ns, "j").await["done"] == json!(["ok-1"])).then_some(())
    })
    .await;
    eventually("one dead letter shown", PATIENCE, || async {
        (text(&b, "#inspect-trays td.dead").await? == "1").then_some(())
    })
    .await;
    let status = text(&b, "#status").await.unwrap_or_default();
    assert_eq!(status, format!("skip {ns}/j: done"));

    // Pause, then resume, from the page.
    click(&b, "#inspect-detail .inspect-pause").await;
    click(&b, "#confirm-ok").await;
    b.wait()
        .at_most(PATIENCE)
        .for_element(Locator::Css("#inspect-detail .inspect-resume"))
        .await
        .expect("the id shown paused");
    let res = c
        .get(format!("{}{ns}/j/done", pb.url))
        .send()
        .await
        .expect("done");
    assert_eq!(res.status(), 503, "a paused id refuses requests");
    // Every id of the namespace listed, the paused one flagged: then the
    // screenshot of the inspector.
    b.find(Locator::Css("#inspect-filter option[value=all]"))
        .await
        .expect("the all filter")
        .click()
        .await
        .expect("choose it");
    click(&b, "#inspect-list").await;
    eventually("the paused id listed", PATIENCE, || async {
        (text(&b, "#inspect-ids tr[data-id=j] td:nth-child(6)").await? == "yes").then_some(())
    })
    .await;
    let shot = b
        .find(Locator::Id("inspector"))
        .await
        .expect("the inspector")
        .screenshot()
        .await
        .expect("screenshot");
    click(&b, "#inspect-detail .inspect-resume").await;
    click(&b, "#confirm-ok").await;
    b.wait()
        .at_most(PATIENCE)
        .for_element(Locator::Css("#inspect-detail .inspect-pause"))
        .await
        .expect("the id shown resumed");
    assert_eq!(done(&c, &pb.url, &ns, "j").await["done"], json!(["ok-1"]));

    // The audit list names the dashboard session for each control.
    let audit: Value = c
        .get(format!("{}/registry/state/audit", pb.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("audit")
        .json()
        .await
        .expect("audit json");
    let by: Vec<&str> = audit["actions"]
        .as_array()
        .expect("actions")
        .iter()
        .filter_map(|a| a["by"].as_str())
        .collect();
    assert_eq!(by.len(), 3, "{audit}");
    assert!(by.iter().all(|by| by.starts_with("dashboard:")), "{audit}");

    // Never into the checkout: a test leaves `git status` clean.
    browser::ScreenshotDir::from_env().save("inspector.png", &shot);
    b.close().await.expect("close the browser");
}
