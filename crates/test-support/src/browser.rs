//! A real browser for the dashboard's tests: Debian's headless chromium
//! driven over WebDriver (`chromedriver`, installed by `scripts/browser`),
//! and where its screenshots go (`$PINBOARD_SCREENSHOT_DIR`, else a
//! temporary directory: a test never writes into the checkout).

use std::path::{Path, PathBuf};
use std::process::Command;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

use crate::{client, eventually, Proc, PATIENCE};

/// `chromedriver` on a port of its own choosing (`--port=0`; it reports
/// the port it bound), killed on drop. Panics with the install command
/// when it is missing.
pub fn chromedriver() -> Proc {
    let bin = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
    if Command::new(&bin).arg("--version").output().is_err() {
        panic!(
            "cannot start {bin}: run scripts/browser (apt-get install chromium chromium-driver)"
        );
    }
    let mut command = Command::new(&bin);
    command.arg("--port=0");
    Proc::spawn(command, "chromedriver", |line| {
        let port = line
            .strip_prefix("ChromeDriver was started successfully on port ")?
            .trim_end_matches('.');
        Some(format!("http://127.0.0.1:{port}"))
    })
}

/// A headless chromium session of `driver`, once it says it is ready.
pub async fn session(driver: &Proc) -> Client {
    let c = client();
    eventually("chromedriver ready", PATIENCE, || async {
        let res = c.get(format!("{}/status", driver.url)).send().await.ok()?;
        let v: Value = res.json().await.ok()?;
        (v["value"]["ready"] == true).then_some(())
    })
    .await;
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({ "args": [
            "--headless=new", "--no-sandbox", "--disable-gpu",
            "--disable-dev-shm-usage", "--window-size=1500,1350",
        ]}),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a chromium session")
}

/// Clicks the element `css` names once it is on the page.
pub async fn click(b: &Client, css: &str) {
    b.wait()
        .at_most(PATIENCE)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("click {css}: {e}"));
}

/// The texts of every element `css` names (none: empty).
pub async fn texts(b: &Client, css: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in b.find_all(Locator::Css(css)).await.unwrap_or_default() {
        out.push(e.text().await.unwrap_or_default());
    }
    out
}

/// Where screenshots go: `$PINBOARD_SCREENSHOT_DIR` when set, else a
/// temporary directory kept as long as the value.
pub struct ScreenshotDir {
    dir: PathBuf,
    _kept: Option<tempfile::TempDir>,
}

impl ScreenshotDir {
    /// `$PINBOARD_SCREENSHOT_DIR` (created if need be), or a new
    /// temporary directory.
    pub fn from_env() -> Self {
        let (dir, kept) = match std::env::var_os("PINBOARD_SCREENSHOT_DIR") {
            Some(dir) => (PathBuf::from(dir), None),
            None => {
                let kept = tempfile::tempdir().expect("screenshot dir");
                (kept.path().to_path_buf(), Some(kept))
            }
        };
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        Self { dir, _kept: kept }
    }

    /// Writes `png` as `name` in the directory, and says where.
    pub fn save(&self, name: &str, png: &[u8]) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, png).expect("save the screenshot");
        eprintln!("screenshot: {}", path.display());
        path
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}
