//! Reading a Prometheus text exposition (pinboard's and the worker's
//! `/metrics`, a Python worker's too): the families a process exports, the
//! value of one, and the assertion the suites make with them: a family
//! *moved* between two scrapes taken around the behaviour that counts it
//! ([`moved`], [`wait_moved`]).
//!
//! The metric-coverage guard (`crates/fleet/tests/metrics_coverage.rs`)
//! counts a family as tested only where a test source names it, as the
//! string literal that opens a selector, in a `moved(…)` or
//! `wait_moved(…)` call: keep the family's name literal there. This module
//! only reads; it never decides what a value should be.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// What a `# TYPE` line says a family is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
    Other,
}

/// One sample line: its name as exposed (`_total`, `_count` included), its
/// labels, its value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// One scrape: every family its `# TYPE` lines declare and every sample.
#[derive(Debug, Clone)]
pub struct Scrape {
    families: BTreeMap<String, Kind>,
    samples: Vec<Sample>,
    text: String,
}

/// A family with an optional label filter: `pinned_request_failures` or
/// `pinned_request_failures{phase="auth"}` (the samples carrying at least
/// those labels).
struct Selector {
    name: String,
    labels: Vec<(String, String)>,
}

impl Selector {
    fn parse(selector: &str) -> Self {
        let (name, labels) = match selector.split_once('{') {
            None => (selector, Vec::new()),
            Some((name, rest)) => (name, labels(rest).map_or_else(Vec::new, |(l, _)| l)),
        };
        Self {
            name: name.trim().to_owned(),
            labels,
        }
    }

    fn admits(&self, sample: &Sample) -> bool {
        self.labels.iter().all(|want| sample.labels.contains(want))
    }
}

/// The labels of `text` (just after a `{`) up to its closing `}`, and what
/// follows it; `None` when malformed.
fn labels(text: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut out = Vec::new();
    let mut rest = text.trim_start();
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(after) = rest.strip_prefix('}') {
            return Some((out, after));
        }
        let (key, after) = rest.split_once('=')?;
        let mut chars = after.strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        out.push((key.trim().to_owned(), value));
        rest = &after[end + 2..];
    }
}

fn sample(line: &str) -> Option<Sample> {
    let split = line.find(['{', ' '])?;
    let (name, rest) = line.split_at(split);
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inner) => labels(inner)?,
        None => (Vec::new(), rest),
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Parses Prometheus or OpenMetrics text. Lines it cannot read are skipped
/// (a selector naming them then fails loudly in [`Scrape::value`]).
pub fn parse(text: &str) -> Scrape {
    let mut families = BTreeMap::new();
    let mut samples = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let mut words = declared.split_whitespace();
            let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            let kind = match kind {
                "counter" => Kind::Counter,
                "gauge" => Kind::Gauge,
                "histogram" => Kind::Histogram,
                _ => Kind::Other,
            };
            // The classic text format (Python's client) declares a counter
            // under its `_total` name; OpenMetrics without it.
            let name = match kind {
                Kind::Counter => name.strip_suffix("_total").unwrap_or(name),
                _ => name,
            };
            families.insert(name.to_owned(), kind);
        } else if !line.is_empty() && !line.starts_with('#') {
            samples.extend(sample(line));
        }
    }
    Scrape {
        families,
        samples,
        text: text.to_owned(),
    }
}

/// `GET {base}/metrics`, parsed; `None` when unreachable or not a success.
pub async fn try_scrape(c: &reqwest::Client, base: &str) -> Option<Scrape> {
    let response = c.get(format!("{base}/metrics")).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    Some(parse(&response.text().await.ok()?))
}

/// `GET {base}/metrics`, parsed.
///
/// # Panics
///
/// When `base` does not answer it with a success.
pub async fn scrape(c: &reqwest::Client, base: &str) -> Scrape {
    try_scrape(c, base)
        .await
        .unwrap_or_else(|| panic!("GET {base}/metrics: unreachable or not a success"))
}

impl Scrape {
    /// Every family the scrape declares (a counter without its `_total`).
    pub fn families(&self) -> impl Iterator<Item = &str> {
        self.families.keys().map(String::as_str)
    }

    /// The text as scraped.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The value of `selector`, a family with an optional label filter
    /// (`pinned_control_plane_failures{operation="register"}`): the sum of
    /// its matching samples — a counter's `_total`, a gauge's value, a
    /// histogram's `_count` — 0 when a declared family has none yet.
    ///
    /// # Panics
    ///
    /// When the scrape declares no such family (a typo must not read as 0).
    #[track_caller]
    pub fn value(&self, selector: &str) -> f64 {
        let selector = Selector::parse(selector);
        let Some(kind) = self.families.get(&selector.name) else {
            panic!("no metric family {} in\n{}", selector.name, self.text)
        };
        let sample = match kind {
            Kind::Counter => format!("{}_total", selector.name),
            Kind::Histogram => format!("{}_count", selector.name),
            Kind::Gauge | Kind::Other => selector.name.clone(),
        };
        self.samples
            .iter()
            .filter(|s| s.name == sample && selector.admits(s))
            .map(|s| s.value)
            .sum()
    }

    /// The sum of the samples named exactly `name` (as exposed: `_total`
    /// included) carrying at least its labels (`name{k="v"}`); `None` when
    /// there is none.
    pub fn sample(&self, name: &str) -> Option<f64> {
        let selector = Selector::parse(name);
        let mut matching = self
            .samples
            .iter()
            .filter(|s| s.name == selector.name && selector.admits(s))
            .peekable();
        matching.peek()?;
        Some(matching.map(|s| s.value).sum())
    }

    /// The lines of the family `selector` names, for a failure message.
    fn lines_of(&self, selector: &str) -> String {
        let name = Selector::parse(selector).name;
        let lines: Vec<&str> = self
            .text
            .lines()
            .filter(|l| {
                let l = l
                    .trim_start_matches("# TYPE ")
                    .trim_start_matches("# HELP ");
                l.starts_with(&name)
            })
            .collect();
        lines.join("\n")
    }
}

impl fmt::Display for Scrape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Asserts that `selector` (see [`Scrape::value`]) changed from `before`
/// to `after`, and answers by how much (`after - before`, negative for a
/// gauge that fell), for the caller to pin exactly.
///
/// # Panics
///
/// When the value did not change, or the family is not declared.
#[track_caller]
pub fn moved(before: &Scrape, after: &Scrape, selector: &str) -> f64 {
    let (from, to) = (before.value(selector), after.value(selector));
    assert!(
        to != from,
        "{selector} did not move: {from} before and after; now\n{}",
        after.lines_of(selector)
    );
    to - from
}

/// Scrapes `{base}/metrics` until `selector` differs from its value in
/// `before` (at most `patience`), asserting it moves; answers that scrape.
///
/// # Panics
///
/// When `patience` passes first, or the family is not declared.
#[track_caller]
pub fn wait_moved<'a>(
    c: &'a reqwest::Client,
    base: &'a str,
    before: &'a Scrape,
    selector: &'a str,
    patience: Duration,
) -> impl std::future::Future<Output = Scrape> + 'a {
    // `#[track_caller]` does not reach into an `async fn`'s body: read the
    // caller's line here, before the future runs.
    let caller = std::panic::Location::caller();
    async move {
        let from = before.value(selector);
        let last = std::sync::Mutex::new(None);
        let seen = &last;
        let found = crate::poll::poll(patience, || async move {
            let now = try_scrape(c, base).await?;
            let moved = now.value(selector) != from;
            let answer = moved.then(|| now.clone());
            *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
            answer
        })
        .await;
        found.unwrap_or_else(|| {
            let now = last.into_inner().unwrap_or_else(|e| e.into_inner());
            let lines = now.map_or_else(|| "(no scrape)".to_owned(), |s| s.lines_of(selector));
            panic!(
                "{caller}: {selector} did not move from {from} within {patience:?}; now\n{lines}"
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN_METRICS: &str = r#"# HELP pinned_instance_activations Pinned instance activations.
# TYPE pinned_instance_activations counter
pinned_instance_activations_total 3
# TYPE pinned_active_instances gauge
pinned_active_instances 2
# TYPE pinned_control_plane_failures counter
pinned_control_plane_failures_total{operation="register",reason="deferred"} 2
pinned_control_plane_failures_total{operation="heartbeat",reason="a \"quoted\", comma"} 1
# TYPE pinned_request_failures counter
# TYPE pinned_request_duration_seconds histogram
pinned_request_duration_seconds_sum{namespace="/a"} 0.5
pinned_request_duration_seconds_count{namespace="/a"} 4
pinned_request_duration_seconds_bucket{le="+Inf",namespace="/a"} 4
pinned_request_duration_seconds_count{namespace="/b"} 1
# EOF
"#;

    #[test]
    fn values_by_family_kind_and_labels() {
        let s = parse(OPEN_METRICS);
        assert_eq!(s.value("pinned_instance_activations"), 3.0);
        assert_eq!(s.value("pinned_active_instances"), 2.0);
        assert_eq!(s.value("pinned_control_plane_failures"), 3.0);
        assert_eq!(
            s.value(r#"pinned_control_plane_failures{reason="deferred"}"#),
            2.0
        );
        assert_eq!(
            s.value(r#"pinned_control_plane_failures{reason="a \"quoted\", comma"}"#),
            1.0
        );
        assert_eq!(s.value("pinned_request_failures"), 0.0);
        assert_eq!(s.value("pinned_request_duration_seconds"), 5.0);
        assert_eq!(
            s.value(r#"pinned_request_duration_seconds{namespace="/a"}"#),
            4.0
        );
        assert_eq!(s.sample("pinned_instance_activations_total"), Some(3.0));
        assert_eq!(s.sample("pinned_request_failures_total"), None);
        assert_eq!(s.families().count(), 5);
    }

    #[test]
    fn the_classic_format_declares_counters_with_total() {
        let s = parse("# TYPE pinned_x_total counter\npinned_x_total 1.0\n");
        assert_eq!(s.value("pinned_x"), 1.0);
    }

    #[test]
    fn moved_answers_the_change_and_panics_on_none() {
        let before = parse(OPEN_METRICS);
        let after = parse(&OPEN_METRICS.replace("activations_total 3", "activations_total 5"));
        assert_eq!(moved(&before, &after, "pinned_instance_activations"), 2.0);
        let still = std::panic::catch_unwind(|| moved(&before, &after, "pinned_active_instances"));
        assert!(still.is_err());
    }

    #[test]
    #[should_panic(expected = "no metric family pinned_typo")]
    fn an_undeclared_family_is_an_error_not_zero() {
        parse(OPEN_METRICS).value("pinned_typo");
    }
}
