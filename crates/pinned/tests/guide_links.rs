//! The guide's links hold on both sites that render it.
//!
//! A chapter (`crates/pinned/guide/*.md`) is read on GitHub with its own
//! link definitions (relative `.md` paths, docs.rs URLs) and on docs.rs
//! with `rustdoc_links!`'s (`src/guide_links.rs`: intra-doc paths,
//! repository URLs), which come first and so win. rustdoc checks its
//! intra-doc paths; this test checks the rest, reading the files only:
//!
//! - every reference label a chapter uses is defined in the chapter (for
//!   GitHub) and in `rustdoc_links!` (for docs.rs);
//! - both definitions of a label name the same thing: the same chapter,
//!   the same repository file and anchor, the same API item;
//! - every relative target exists in the repository;
//! - every chapter is included by `src/guide.rs` (so its Rust blocks run as
//!   doctests) and ends with what to read next.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const REPOSITORY: &str = "https://github.com/pinned-rs/pinned/";
const RAW: &str = "https://raw.githubusercontent.com/pinned-rs/pinned/main/";
const DOCS_RS: &str = "https://docs.rs/";

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn guide_dir() -> PathBuf {
    crate_dir().join("guide")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The chapter files, by file name.
fn chapters() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(guide_dir()).expect("guide dir") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) == Some("md") {
            let name = path.file_name().and_then(|n| n.to_str()).expect("name");
            out.insert(name.to_owned(), read(&path));
        }
    }
    assert!(
        out.len() > 10,
        "the guide has its chapters: {:?}",
        out.keys()
    );
    out
}

/// `[label]: target` lines, label lowercased as Markdown matches them.
fn definitions(markdown: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in markdown.lines() {
        let Some(rest) = line.strip_prefix('[') else {
            continue;
        };
        // The first `]` closes the label: `[text][label]: prose` is a link.
        let Some((label, target)) = rest
            .split_once(']')
            .and_then(|(label, after)| Some((label, after.strip_prefix(": ")?)))
        else {
            continue;
        };
        out.entry(label.to_lowercase())
            .or_insert_with(|| target.trim().to_owned());
    }
    out
}

/// The text outside fenced blocks and code spans, where links are links.
fn prose(markdown: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The labels of `[text][label]`, `[label][]` and `` [`item`] `` links.
fn used_labels(markdown: &str) -> Vec<String> {
    let text = prose(markdown);
    let mut labels = Vec::new();
    let bytes = text.as_bytes();
    let mut at = 0;
    while let Some(open) = text[at..].find('[').map(|i| at + i) {
        let Some(close) = text[open..].find(']').map(|i| open + i) else {
            break;
        };
        let inner = &text[open + 1..close];
        at = close + 1;
        if bytes.get(close + 1) == Some(&b':') {
            continue; // a definition
        }
        if bytes.get(close + 1) == Some(&b'[') {
            if let Some(end) = text[close + 1..].find(']').map(|i| close + 1 + i) {
                let label = &text[close + 2..end];
                labels.push(if label.is_empty() { inner } else { label }.to_lowercase());
                at = end + 1;
            }
            continue;
        }
        if bytes.get(close + 1) != Some(&b'(')
            && inner.starts_with('`')
            && inner.ends_with('`')
            && !inner.contains(' ')
        {
            labels.push(inner.to_lowercase());
        }
    }
    labels
}

/// `rustdoc_links!`'s definitions, from its string literals.
fn rustdoc_definitions() -> BTreeMap<String, String> {
    let source = read(&crate_dir().join("src/guide_links.rs"));
    let mut markdown = String::new();
    for line in source.lines() {
        let line = line.trim();
        if let Some(body) = line.strip_prefix("\"[") {
            if let Some(body) = body.strip_suffix("\\n\",") {
                markdown.push('[');
                markdown.push_str(body);
                markdown.push('\n');
            }
        }
    }
    let out = definitions(&markdown);
    assert!(out.len() > 20, "rustdoc_links! parsed: {out:?}");
    out
}

/// `a/b/../c` → `a/c`, for a path inside the repository.
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                assert!(parts.pop().is_some(), "{path} leaves the repository");
            }
            part => parts.push(part),
        }
    }
    parts.join("/")
}

/// A chapter's relative target as a repository path (with its anchor).
fn repository_path(target: &str) -> String {
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let path = normalize(&format!("crates/pinned/guide/{path}"));
    match anchor {
        Some(anchor) => format!("{path}#{anchor}"),
        None => path,
    }
}

/// Whether the GitHub-side `github` and the docs.rs-side `rustdoc`
/// definitions of one label name the same thing.
fn same_target(github: &str, rustdoc: &str) -> Result<(), String> {
    if let Some(chapter) = rustdoc.strip_prefix("crate::guide") {
        let (module, anchor) = match chapter.split_once('#') {
            Some((module, anchor)) => (module, Some(anchor)),
            None => (chapter, None),
        };
        let file = match module.strip_prefix("::") {
            None if module.is_empty() => "README.md".to_owned(),
            Some(name) => format!("{}.md", name.replace('_', "-")),
            None => return Err(format!("not a chapter: {rustdoc}")),
        };
        let expected = match anchor {
            Some(anchor) => format!("{file}#{anchor}"),
            None => file,
        };
        return if github == expected {
            Ok(())
        } else {
            Err(format!("{github} is not the chapter {expected}"))
        };
    }
    if let Some(item) = rustdoc.strip_prefix("crate::") {
        let name = item.rsplit("::").next().unwrap_or(item);
        let page_name = github
            .strip_prefix(DOCS_RS)
            .and_then(|url| {
                url.rsplit('/')
                    .find(|s| !s.is_empty() && *s != "index.html")
            })
            .ok_or_else(|| format!("{github} is not a docs.rs page"))?;
        let item_name = page_name
            .strip_suffix(".html")
            .map_or(page_name, |page| page.rsplit('.').next().unwrap_or(page));
        return if item_name == name {
            Ok(())
        } else {
            Err(format!("{github} is not the page of {rustdoc}"))
        };
    }
    let in_repository = rustdoc
        .strip_prefix(REPOSITORY)
        .and_then(|rest| {
            rest.strip_prefix("blob/main/")
                .or_else(|| rest.strip_prefix("tree/main/"))
        })
        .or_else(|| rustdoc.strip_prefix(RAW))
        .ok_or_else(|| format!("{rustdoc} is neither an item, a chapter nor a repository URL"))?;
    let github = repository_path(github);
    if github == in_repository {
        Ok(())
    } else {
        Err(format!("{github} on GitHub, {in_repository} on docs.rs"))
    }
}

#[test]
fn every_label_is_defined_for_github_and_for_docs_rs_alike() {
    let rustdoc = rustdoc_definitions();
    let mut problems = Vec::new();
    for (file, markdown) in chapters() {
        let github = definitions(&markdown);
        for label in used_labels(&markdown) {
            match (github.get(&label), rustdoc.get(&label)) {
                (None, _) => {
                    problems.push(format!("{file}: [{label}] has no definition for GitHub"))
                }
                (_, None) => problems.push(format!(
                    "{file}: [{label}] is not in rustdoc_links! (src/guide_links.rs)"
                )),
                (Some(github), Some(rustdoc)) => {
                    if let Err(why) = same_target(github, rustdoc) {
                        problems.push(format!("{file}: [{label}]: {why}"));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_relative_target_exists() {
    let root = crate_dir().join("../..");
    let mut problems = Vec::new();
    for (file, markdown) in chapters() {
        for target in definitions(&markdown).values() {
            if target.starts_with("https://") {
                continue;
            }
            let path = repository_path(target);
            let path = path.split('#').next().unwrap_or(&path);
            if !root.join(path).exists() {
                problems.push(format!("{file}: {target} ({path}) does not exist"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_chapter_is_rendered_and_says_what_to_read_next() {
    let module = read(&crate_dir().join("src/guide.rs"));
    let mut problems = Vec::new();
    for (file, markdown) in chapters() {
        if file == "README.md" {
            assert!(module.contains("include_str!(\"../guide/README.md\")"));
            continue;
        }
        if !module.contains(&format!("\"{file}\")")) {
            problems.push(format!("{file} is not included by src/guide.rs"));
        }
        if !markdown.contains("\n## Read next\n") {
            problems.push(format!("{file} does not end with what to read next"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
