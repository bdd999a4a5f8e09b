//! The certificate recipe the docs give works: the `openssl` commands
//! of pinboard's README (the guide's "Running behind pinboard" chapter
//! holds the same block) run
//! in a temporary directory, pinboard serves HTTPS with the leaf they make,
//! and a Rust worker trusting their CA registers. (Run as written, with
//! `openssl` from the `PATH`.)

mod support;

use std::path::Path;
use std::process::Command;

use support::{pinboard, rust_worker, wait_workers};

/// The fenced `sh` block of the Markdown file `readme` that makes the CA,
/// without the indentation of a list item.
fn recipe(readme: &str) -> String {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(readme),
    )
    .expect("README");
    let mut block: Option<Vec<String>> = None;
    for line in text.lines() {
        let bare = line.trim_start();
        match &mut block {
            None if bare == "```sh" => block = Some(Vec::new()),
            None => {}
            Some(lines) if bare == "```" => {
                let body = lines.join("\n");
                if body.contains("openssl req -x509 -newkey") {
                    return body;
                }
                block = None;
            }
            Some(lines) => {
                let indent = line.len() - bare.len();
                lines.push(line[indent.min(line.len())..].to_owned());
            }
        }
    }
    panic!("no openssl recipe in {readme}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_certificate_recipe_serves_a_worker_over_tls() {
    let ours = recipe("crates/pinboard/README.md");
    assert_eq!(
        ours,
        recipe("crates/pinned/guide/behind-pinboard.md"),
        "pinboard's README and the guide give different recipes"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let made = Command::new("sh")
        .arg("-ec")
        .arg(&ours)
        .current_dir(dir.path())
        .output()
        .expect("run sh (and openssl)");
    assert!(
        made.status.success(),
        "the recipe failed:\n{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let file = |name: &str| dir.path().join(name).to_str().expect("utf-8").to_owned();
    let pb = pinboard()
        .args(&[
            "--tls-cert",
            &file("cert.pem"),
            "--tls-key",
            &file("key.pem"),
        ])
        .start();
    assert!(pb.url.starts_with("https://"), "{}", pb.url);
    let _worker = rust_worker(&pb.url)
        .env("PINNED_PINBOARD_CA", &file("ca.pem"))
        .start();
    let c = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(file("ca.pem")).expect("ca.pem"))
                .expect("pem"),
        )
        .build()
        .expect("client");
    wait_workers(&c, &pb.url, 1).await;
}
