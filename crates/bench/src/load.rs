//! An HTTP/1.1 load generator: `connections` keep-alive connections,
//! latencies recorded in an HDR histogram after a warm-up.
//!
//! Closed loop by default: each connection sends its next request as soon as
//! the previous answer arrived (as `wrk` does), which measures throughput;
//! latency under that load is mostly queueing. With a `rate`, requests go
//! out on a fixed schedule instead (as `wrk2` does) and each latency counts
//! from the request's scheduled time, so a stall shows up in full rather
//! than delaying the next sends (no coordinated omission): the figure for
//! what a proxy adds to a request when it is not saturated.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{Method, Request};
use http_body_util::{BodyExt, Either, Empty, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Which path each request asks for.
#[derive(Clone, Debug)]
pub enum Paths {
    /// The same path every time (a warm instance).
    Fixed(String),
    /// `prefix + n + suffix` with a fresh `n` per request (a new id each).
    Unique {
        /// Before the counter.
        prefix: String,
        /// After the counter.
        suffix: String,
    },
    /// `prefix + c + suffix` for connection `c` (an id of its own per
    /// connection, reused by each of its requests), or, with `per_id`,
    /// `prefix + c + "-" + g + suffix`: the connection moves to a fresh id
    /// (`g` counts up from 0) after every `per_id` requests, so the work
    /// behind one request does not grow with how many the server answered
    /// before it.
    PerConnection {
        /// Before the connection's number.
        prefix: String,
        /// After the connection's number.
        suffix: String,
        /// Requests one id receives before its connection moves on (`None`:
        /// one id for the whole run; `Some(0)` counts as `Some(1)`).
        per_id: Option<u64>,
    },
}

impl Paths {
    /// The path of connection `lane`'s request number `sent` (from 0);
    /// `counter` numbers the fresh ids of [`Paths::Unique`] across
    /// connections.
    fn nth(&self, lane: usize, sent: u64, counter: &AtomicU64) -> String {
        match self {
            Self::Fixed(path) => path.clone(),
            Self::Unique { prefix, suffix } => {
                format!(
                    "{prefix}{}{suffix}",
                    counter.fetch_add(1, Ordering::Relaxed)
                )
            }
            Self::PerConnection {
                prefix,
                suffix,
                per_id: None,
            } => format!("{prefix}{lane}{suffix}"),
            Self::PerConnection {
                prefix,
                suffix,
                per_id: Some(per_id),
            } => format!("{prefix}{lane}-{}{suffix}", sent / (*per_id).max(1)),
        }
    }
}

/// One load run.
#[derive(Clone, Debug)]
pub struct Load {
    /// Server address.
    pub addr: SocketAddr,
    /// Concurrent keep-alive connections.
    pub connections: usize,
    /// Requests before this are not measured.
    pub warmup: Duration,
    /// Measured time.
    pub duration: Duration,
    /// Request method.
    pub method: Method,
    /// Request paths.
    pub paths: Paths,
    /// Extra request headers.
    pub headers: Vec<(String, String)>,
    /// The request body (none when `None`; set its `content-type` in
    /// `headers`).
    pub body: Option<Bytes>,
    /// Requests per second over all connections (open loop), or `None` for
    /// a closed loop.
    pub rate: Option<f64>,
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct Report {
    /// Successful (2xx) measured requests.
    pub ok: u64,
    /// Non-2xx or failed measured requests.
    pub errors: u64,
    /// Successful requests per second.
    pub rps: f64,
    /// Median latency, microseconds.
    pub p50_us: u64,
    /// 99th percentile latency, microseconds.
    pub p99_us: u64,
}

impl Report {
    /// p99 latency above `baseline`'s, in microseconds (negative: below).
    pub fn added_p99_us(&self, baseline: &Report) -> i64 {
        i64::try_from(self.p99_us).unwrap_or(i64::MAX)
            - i64::try_from(baseline.p99_us).unwrap_or(i64::MAX)
    }

    /// The CPU time a process spent between two readings over the measured
    /// part, per request answered, in microseconds (`None` without both
    /// readings).
    pub fn per_request_us(&self, before: Option<Duration>, after: Option<Duration>) -> Option<f64> {
        let spent = after?.checked_sub(before?)?;
        let requests = (self.ok + self.errors).max(1) as f64;
        Some(spent.as_secs_f64() * 1e6 / requests)
    }

    /// `rps / other.rps`.
    pub fn ratio(&self, other: &Report) -> f64 {
        if other.rps == 0.0 {
            0.0
        } else {
            self.rps / other.rps
        }
    }
}

/// The 1, 5 and 15 minute load averages as `/proc/loadavg` states them
/// (`"?"` where it cannot be read), to print beside every figure: the
/// machine is shared.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "?".into())
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>9.0} req/s  p50 {:>6} us  p99 {:>6} us  ({} ok, {} errors)",
            self.rps, self.p50_us, self.p99_us, self.ok, self.errors
        )
    }
}

/// [`run`], with `sample` read once the warm-up is over and once at the
/// end: the readings (the CPU time of the processes under load) bracket
/// exactly the measured part.
///
/// # Errors
///
/// As [`run`].
pub async fn run_sampled<T, F, Fut>(load: Load, sample: F) -> anyhow::Result<(Report, T, T)>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let warmup = load.warmup;
    let (report, before) = tokio::join!(run(load), async {
        tokio::time::sleep(warmup).await;
        sample().await
    });
    let report = report?;
    let after = sample().await;
    Ok((report, before, after))
}

/// Runs `load` and reports.
///
/// # Errors
///
/// A connection that cannot be opened.
pub async fn run(load: Load) -> anyhow::Result<Report> {
    let counter = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let measure_from = start + load.warmup;
    let end = measure_from + load.duration;
    let mut tasks = Vec::with_capacity(load.connections);
    for lane in 0..load.connections {
        let load = load.clone();
        let counter = counter.clone();
        // Lanes start evenly staggered over one interval.
        let schedule = load.rate.map(|rate| {
            let interval = Duration::from_secs_f64(load.connections as f64 / rate.max(1e-3));
            let offset = interval.mul_f64(lane as f64 / load.connections as f64);
            (start + offset, interval)
        });
        tasks.push(tokio::spawn(async move {
            connection(load, lane, counter, measure_from, end, schedule).await
        }));
    }
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let (mut ok, mut errors) = (0, 0);
    for task in tasks {
        let (h, o, e) = task.await.context("load task")??;
        histogram.add(h)?;
        ok += o;
        errors += e;
    }
    Ok(Report {
        ok,
        errors,
        rps: ok as f64 / load.duration.as_secs_f64(),
        p50_us: histogram.value_at_quantile(0.50),
        p99_us: histogram.value_at_quantile(0.99),
    })
}

async fn connection(
    load: Load,
    lane: usize,
    counter: Arc<AtomicU64>,
    measure_from: Instant,
    end: Instant,
    mut schedule: Option<(Instant, Duration)>,
) -> anyhow::Result<(Histogram<u64>, u64, u64)> {
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let (mut ok, mut errors) = (0u64, 0u64);
    let stream = TcpStream::connect(load.addr).await.context("connect")?;
    stream.set_nodelay(true)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let host = load.addr.to_string();
    let mut sent = 0u64;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let path = load.paths.nth(lane, sent, &counter);
        sent += 1;
        let mut request = Request::builder()
            .method(load.method.clone())
            .uri(path)
            .header(http::header::HOST, &host);
        for (name, value) in &load.headers {
            request = request.header(name, value);
        }
        let request = request.body(match &load.body {
            None => Either::Left(Empty::<Bytes>::new()),
            Some(body) => Either::Right(Full::new(body.clone())),
        })?;
        if sender.ready().await.is_err() {
            errors += 1;
            break;
        }
        let started = match &mut schedule {
            None => Instant::now(),
            Some((next, interval)) => {
                let due = *next;
                *next += *interval;
                if Instant::now() >= due {
                    // Behind schedule: the wait for the previous answer
                    // is part of this request's latency.
                    due
                } else {
                    // Ahead: the timer's own lateness (up to a
                    // millisecond) is nobody's latency.
                    tokio::time::sleep_until(due).await;
                    Instant::now()
                }
            }
        };
        let outcome = match sender.send_request(request).await {
            Ok(response) => {
                let success = response.status().is_success();
                let body = response.into_body().collect().await;
                success && body.is_ok()
            }
            Err(_) => false,
        };
        if started >= measure_from {
            let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            histogram.saturating_record(micros.max(1));
            if outcome {
                ok += 1;
            } else {
                errors += 1;
            }
        }
        if !outcome && sender.is_closed() {
            break;
        }
    }
    Ok((histogram, ok, errors))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_connection(per_id: Option<u64>) -> Paths {
        Paths::PerConnection {
            prefix: "/runners/r".to_owned(),
            suffix: "/enqueue".to_owned(),
            per_id,
        }
    }

    #[test]
    fn a_connection_moves_to_a_fresh_id_after_per_id_requests() {
        let counter = AtomicU64::new(0);
        let paths = per_connection(Some(3));
        let ids: Vec<String> = (0..7).map(|sent| paths.nth(2, sent, &counter)).collect();
        assert_eq!(
            ids,
            [
                "/runners/r2-0/enqueue",
                "/runners/r2-0/enqueue",
                "/runners/r2-0/enqueue",
                "/runners/r2-1/enqueue",
                "/runners/r2-1/enqueue",
                "/runners/r2-1/enqueue",
                "/runners/r2-2/enqueue",
            ]
        );
        // Another connection never shares an id with this one.
        assert_eq!(paths.nth(12, 0, &counter), "/runners/r12-0/enqueue");
        assert_ne!(paths.nth(1, 20, &counter), paths.nth(12, 0, &counter));
    }

    #[test]
    fn without_per_id_a_connection_keeps_one_id() {
        let counter = AtomicU64::new(0);
        let paths = per_connection(None);
        assert_eq!(paths.nth(4, 0, &counter), "/runners/r4/enqueue");
        assert_eq!(paths.nth(4, 1_000, &counter), "/runners/r4/enqueue");
        // Zero counts as one request per id, not a division by zero.
        let zero = per_connection(Some(0));
        assert_eq!(zero.nth(4, 5, &counter), "/runners/r4-5/enqueue");
    }
}
