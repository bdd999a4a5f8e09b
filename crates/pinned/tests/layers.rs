//! The worker's layer order, checked from its sources: no file imports from
//! a layer above its own. The order (bottom to top) is the one the crate
//! docs give; a module that is not listed fails the test, so a new one is
//! placed deliberately.
//!
//! A reference is any `crate::<module>` path outside comments and test
//! modules (as `use` or inline), which is how every file of the crate
//! names another.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each top-level module of `crates/pinned/src` and its layer, bottom first.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "base",
        &[
            "auth",
            "config_error",
            "guide",
            "guide_links",
            "metrics",
            "process",
            "response",
            "task",
            "time",
        ],
    ),
    ("instance", &["instance"]),
    ("plane", &["plane"]),
    ("namespace", &["namespace"]),
    ("durable", &["durable"]),
    ("object", &["object"]),
    ("serve", &["serve"]),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The text of a file without its `#[cfg(test)]` module and comments.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules `code` names as `crate::<module>`.
fn references(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a::X, b}`: every first segment at the group's top level.
            let mut depth = 0usize;
            let mut at_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => at_start = true,
                    c if at_start && (c.is_alphanumeric() || c == '_') => {
                        at_start = false;
                        found.push(first_segment(&group[i..]));
                    }
                    _ => {}
                }
            }
            continue;
        }
        found.push(first_segment(rest));
    }
    found.retain(|name| name.chars().next().is_some_and(char::is_lowercase));
    found
}

fn first_segment(path: &str) -> String {
    path.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

#[test]
fn references_are_found_in_paths_and_groups() {
    let found = references(
        "use crate::namespace::Record;\nlet x = crate::serve::stack::routes::<T>();\nuse crate::{durable::tray, BoxError, time};",
    );
    assert_eq!(found, ["namespace", "serve", "durable", "time"]);
}

#[test]
fn no_file_imports_from_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let mut upward: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut unplaced = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src");
        let top = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .unwrap_or_default()
            .trim_end_matches(".rs")
            .to_owned();
        if top == "lib" {
            continue;
        }
        let Some(own) = layer_of(&top) else {
            unplaced.push(top);
            continue;
        };
        let text = std::fs::read_to_string(file).expect("a readable source");
        for module in references(&code(&text)) {
            match layer_of(&module) {
                Some(theirs) if theirs > own => upward
                    .entry(relative.display().to_string())
                    .or_default()
                    .push(format!("{module} ({})", LAYERS[theirs].0)),
                Some(_) => {}
                // Crate-root items (`crate::BoxError`, `crate::Context`…)
                // are re-exports: their own module is what counts.
                None => {}
            }
        }
    }
    assert!(
        unplaced.is_empty(),
        "modules in no layer: {unplaced:?} (add them to LAYERS)"
    );
    assert!(
        upward.is_empty(),
        "files that import from a layer above their own: {upward:#?}"
    );
}

#[test]
fn crate_root_reexports_are_not_used_to_reach_up() {
    // `crate::Context` and the like resolve through lib.rs, hiding which
    // layer they come from: none may reach a layer above the file's own.
    const ITEMS: &[(&str, &str)] = &[
        ("crate::Context", "namespace"),
        ("crate::Call", "object"),
        ("crate::Object", "object"),
        ("crate::This", "object"),
        ("crate::Options", "serve"),
        ("crate::Worker", "serve"),
    ];
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut found = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src");
        let top = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .unwrap_or_default()
            .trim_end_matches(".rs");
        let Some(own) = layer_of(top) else { continue };
        let code = code(&std::fs::read_to_string(file).expect("a readable source"));
        for (item, module) in ITEMS {
            let above = layer_of(module).is_some_and(|theirs| theirs > own);
            let named = [":", ";", ",", "}", ">", ")", " "]
                .iter()
                .any(|after| code.contains(&format!("{item}{after}")));
            if above && named {
                found.push(format!("{}: {item}", relative.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "reaching up through crate-root re-exports: {found:?}"
    );
}
