//! HTTP helpers: a client, JSON answers, pinboard's worker registry.

use std::time::Duration;

use serde_json::Value;

/// A plain HTTP client (no system proxy, a 20 s timeout, a pool big enough
/// for concurrent tests).
///
/// # Panics
///
/// When the client cannot be built.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(128)
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}

/// The status and JSON body of `response` (`null` for a body that is not
/// JSON).
pub async fn json(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

/// `GET url` as JSON, retrying 503s and transport errors for `patience`.
///
/// # Panics
///
/// On any other status, or when `patience` passes.
pub async fn get_json(c: &reqwest::Client, url: &str, patience: Duration) -> Value {
    get_json_with(c, url, &[], patience).await
}

/// [`get_json`] with request headers (a `Pinboard-Hostname`, say).
///
/// # Panics
///
/// On a status other than success or 503, or when `patience` passes.
pub async fn get_json_with(
    c: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
    patience: Duration,
) -> Value {
    let answered = crate::poll::poll(patience, || async {
        let mut request = c.get(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.ok()?;
        let status = response.status();
        if status.is_success() {
            return Some(response.json().await.expect("json"));
        }
        if status == 503 {
            return None;
        }
        panic!(
            "GET {url}: {status} {}",
            response.text().await.unwrap_or_default()
        )
    })
    .await;
    answered.unwrap_or_else(|| panic!("GET {url}: unreachable or 503 for {patience:?}"))
}

/// `GET /registry/workers` rows of the pinboard at `pb`, with deployment
/// token `token`.
///
/// # Panics
///
/// When pinboard does not answer JSON.
pub async fn workers(c: &reqwest::Client, pb: &str, token: &str) -> Vec<Value> {
    let v: Value = c
        .get(format!("{pb}/registry/workers"))
        .bearer_auth(token)
        .send()
        .await
        .expect("workers")
        .json()
        .await
        .expect("workers json");
    v["workers"].as_array().cloned().unwrap_or_default()
}

/// Waits until exactly `n` workers are registered (at most 30 s); answers
/// their rows.
///
/// # Panics
///
/// When 30 s pass first.
pub async fn wait_workers(c: &reqwest::Client, pb: &str, token: &str, n: usize) -> Vec<Value> {
    let last = std::sync::Mutex::new(Vec::new());
    let seen = &last;
    let found = crate::poll::poll(Duration::from_secs(30), move || async move {
        let rows = workers(c, pb, token).await;
        if rows.len() == n {
            return Some(rows);
        }
        *seen.lock().unwrap_or_else(|e| e.into_inner()) = rows;
        None
    })
    .await;
    found.unwrap_or_else(|| {
        let rows = last.into_inner().unwrap_or_else(|e| e.into_inner());
        panic!("expected {n} workers, have {}: {rows:?}", rows.len())
    })
}

/// A counter or gauge of the Prometheus text at `{base}/metrics` (`name`
/// as exposed, `_total` included, labels optional); 0 when absent or
/// unreadable. To assert that a family moved, take two
/// [`metrics::scrape`](crate::metrics::scrape)s and use
/// [`metrics::moved`](crate::metrics::moved).
pub async fn metric(c: &reqwest::Client, base: &str, name: &str) -> u64 {
    let Some(scrape) = crate::metrics::try_scrape(c, base).await else {
        return 0;
    };
    scrape.sample(name).map_or(0, |v| v as u64)
}

/// Waits until metric `name`, summed over the servers at `bases`, grew by
/// `n` (at most `patience`): "N more sweeper laps", "N more heartbeats",
/// the window in which something that must not happen again would have.
///
/// # Panics
///
/// When `patience` passes first.
pub async fn metric_grows(
    c: &reqwest::Client,
    bases: &[&str],
    name: &str,
    n: u64,
    patience: Duration,
) {
    let mut from = 0;
    for base in bases {
        from += metric(c, base, name).await;
    }
    let what = format!("{name} to grow by {n}");
    crate::poll::eventually(&what, patience, || async {
        let mut now = 0;
        for base in bases {
            now += metric(c, base, name).await;
        }
        (now >= from + n).then_some(())
    })
    .await;
}
