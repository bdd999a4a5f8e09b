//! The metric-coverage guard: every `pinboard_*` and `pinned_*` family a
//! freshly started pinboard and Rust worker export (every family is
//! registered at start, the labelled ones without samples yet) is asserted
//! to *move* by some test of the workspace: named, as the string literal
//! that opens the selector, in a `moved(…)` or `wait_moved(…)` call of
//! `test_support::metrics`, which fails unless the value changed between
//! the two scrapes around the behaviour that counts it. A family only
//! mentioned, or read once, does not count.
//!
//! A new family fails this test until a test asserts that it moves.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use support::{client, pinboard, rust_worker, wait_workers};
use test_support::metrics;

/// The helpers whose calls count: each fails when its family did not move.
const ASSERTIONS: [&str; 2] = ["moved", "wait_moved"];

/// The test sources of the workspace: every `.rs` file under a `tests`
/// directory of a crate or of `examples`.
fn test_sources(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, inside_tests: bool, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() {
                if name == "target" || name == ".git" || name == "node_modules" {
                    continue;
                }
                walk(&path, inside_tests || name == "tests", out);
            } else if inside_tests && path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root.join("crates"), false, &mut out);
    walk(&root.join("examples"), false, &mut out);
    out
}

/// The text of `source` without its line comments (a doc example or a
/// commented-out assertion is no assertion).
fn code_of(source: &str) -> String {
    source
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first string literal in `call` (`"…"` or `r#"…"#`), the selector.
fn first_literal(call: &str) -> Option<&str> {
    let start = call.find('"')?;
    let raw = call[..start].ends_with("r#");
    let body = &call[start + 1..];
    let end = if raw {
        body.find("\"#")?
    } else {
        body.find('"')?
    };
    Some(&body[..end])
}

/// The families named by assertion calls in `code`.
fn asserted_families(code: &str) -> Vec<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut found = Vec::new();
    for (at, _) in code.match_indices("moved(") {
        let open = at + "moved".len();
        let start = code[..open]
            .char_indices()
            .rev()
            .take_while(|(_, c)| ident(*c))
            .last()
            .map_or(open, |(i, _)| i);
        let definition = code[..start].trim_end().ends_with("fn");
        if !ASSERTIONS.contains(&&code[start..open]) || definition {
            continue;
        }
        // The call's arguments: up to the statement's end is enough to
        // reach the selector (a format string counts by its opening text).
        let rest = &code[open + 1..];
        let call = &rest[..rest.find(';').unwrap_or(rest.len())];
        let Some(selector) = first_literal(call) else {
            continue;
        };
        found.push(selector.chars().take_while(|c| ident(*c)).collect());
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_family_is_asserted_to_move_by_some_test() {
    let pb = pinboard().start();
    let worker = rust_worker(&pb.url).start();
    let c = client();
    wait_workers(&c, &pb.url, 1).await;
    let mut exported = BTreeSet::new();
    for (base, prefix) in [(&pb.url, "pinboard_"), (&worker.url, "pinned_")] {
        let scrape = metrics::scrape(&c, base).await;
        let families: Vec<&str> = scrape.families().collect();
        assert!(
            families.iter().all(|f| f.starts_with(prefix)),
            "{base} exports a family without the {prefix} prefix: {families:?}"
        );
        assert!(families.len() >= 10, "{base}: {scrape}");
        exported.extend(families.into_iter().map(str::to_owned));
    }

    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut asserted: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for path in test_sources(&root) {
        // This file's own examples are not assertions.
        if path.ends_with(file!()) {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("read test source");
        for family in asserted_families(&code_of(&source)) {
            let relative = path.strip_prefix(&root).unwrap_or(&path).to_path_buf();
            asserted.entry(family).or_default().push(relative);
        }
    }
    let unasserted: Vec<&String> = exported
        .iter()
        .filter(|family| !asserted.contains_key(*family))
        .collect();
    for family in &exported {
        if let Some(files) = asserted.get(family) {
            eprintln!("{family}: {files:?}");
        }
    }
    assert!(
        unasserted.is_empty(),
        "no test asserts that these families move: {unasserted:?}\n\
         scrape before and after the behaviour that counts one and call \
         `test_support::metrics::moved(&before, &after, \"<family>\")`"
    );
}

#[test]
fn the_guard_reads_assertions_not_mentions() {
    let code = code_of(
        r##"
        let a = metrics::moved(&b, &c, "pinned_instance_activations");
        metrics::wait_moved(&c, &url, &b, r#"pinned_request_failures{phase="auth"}"#, p).await;
        let d = moved(
            &b,
            &c,
            &format!(r#"pinned_control_plane_failures{{reason="{r}"}}"#),
        );
        // metrics::moved(&b, &c, "pinned_commented_out");
        assert_eq!(after.value("pinned_only_read"), 1.0);
        not_moved(&b, &c, "pinned_other_helper");
        pub fn moved(before: &Scrape, after: &Scrape, selector: &str) -> f64 { "pinned_definition" }
        "##,
    );
    assert_eq!(
        asserted_families(&code),
        [
            "pinned_instance_activations",
            "pinned_request_failures",
            "pinned_control_plane_failures"
        ]
    );
}
