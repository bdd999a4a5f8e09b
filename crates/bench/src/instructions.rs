//! Instructions per request, the figure that does not depend on what else
//! the machine is doing: the server runs under `valgrind --tool=callgrind`
//! twice, once for a short and once for a long sequence of requests, and
//! the per-request cost is Δinstructions / Δrequests (start-up, shutdown
//! and warm-up cancel out).
//!
//! The load comes from this process, one request at a time on one
//! keep-alive connection, so the generator never competes with the server
//! for a core it is measured on. Counts are user-space instructions of the
//! whole server process (all its threads), as callgrind totals them.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;

use crate::child::Spawn;

/// The two run lengths.
#[derive(Clone, Copy, Debug)]
pub struct Lengths {
    /// Requests in the short run.
    pub short: usize,
    /// Requests in the long run.
    pub long: usize,
}

impl Default for Lengths {
    fn default() -> Self {
        Self {
            short: 1_000,
            long: 4_000,
        }
    }
}

/// Whether `valgrind` can be run here.
pub fn available() -> bool {
    std::process::Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success())
}

/// Instructions per request of the server that `exe args` starts, for the
/// request `POST <path(i)>` (i = 0, 1, …).
///
/// # Errors
///
/// valgrind or the server fails, a request fails, or callgrind writes no
/// total.
pub async fn per_request(
    exe: &str,
    args: &[&str],
    path: impl Fn(usize) -> String,
    lengths: Lengths,
    scratch: &Path,
) -> anyhow::Result<f64> {
    let short = total(exe, args, &path, lengths.short, &scratch.join("short.out")).await?;
    let long = total(exe, args, &path, lengths.long, &scratch.join("long.out")).await?;
    anyhow::ensure!(lengths.long > lengths.short, "the long run must be longer");
    Ok((long as f64 - short as f64) / (lengths.long - lengths.short) as f64)
}

/// Total instructions of one server run serving `requests` requests.
async fn total(
    exe: &str,
    args: &[&str],
    path: &impl Fn(usize) -> String,
    requests: usize,
    out: &Path,
) -> anyhow::Result<u64> {
    let _ = std::fs::remove_file(out);
    let mut server = Spawn::new("valgrind")
        .args(["--tool=callgrind", "--quiet"])
        .arg_os(format!("--callgrind-out-file={}", out.display()))
        .arg_os(exe)
        .args(args)
        .start()
        .await?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()?;
    let base = server.url();
    for i in 0..requests {
        let answer = client.post(format!("{base}{}", path(i))).send().await?;
        anyhow::ensure!(
            answer.status().is_success(),
            "request {i}: {}",
            answer.status()
        );
        answer.bytes().await?;
    }
    server.terminate(Duration::from_secs(120)).await?;
    let text = std::fs::read_to_string(out)
        .with_context(|| format!("callgrind wrote no {}", out.display()))?;
    text.lines()
        .find_map(|line| {
            line.strip_prefix("summary: ")
                .or_else(|| line.strip_prefix("totals: "))
        })
        .and_then(|value| value.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .context("no instruction total in the callgrind output")
}
