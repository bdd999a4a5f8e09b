//! The process probe of `/_pinned/stats`: resident set and CPU use, read
//! from `/proc` (Linux). Elsewhere the fields are simply absent, as in the
//! reference without `psutil`.

use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

/// Kernel clock ticks per second; 100 on every Linux we run on.
const TICKS_PER_SECOND: f64 = 100.0;
const PAGE_SIZE: u64 = 4096;

/// CPU time at the previous probe, for a since-last-call percentage.
#[derive(Default)]
pub(crate) struct CpuProbe {
    last: Mutex<Option<(SystemTime, f64)>>,
}

impl CpuProbe {
    /// Resident set size in bytes.
    pub(crate) fn rss_bytes(&self) -> Option<u64> {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        Some(pages * PAGE_SIZE)
    }

    /// CPU use since the previous call, in percent of one core.
    pub(crate) fn cpu_percent(&self) -> Option<f64> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the parenthesised command name; utime and stime are
        // the 14th and 15th fields of the whole line.
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let utime: f64 = fields.get(11)?.parse().ok()?;
        let stime: f64 = fields.get(12)?.parse().ok()?;
        let cpu = (utime + stime) / TICKS_PER_SECOND;
        let now = SystemTime::now();
        let previous = self.last.lock().replace((now, cpu));
        let Some((then, cpu_then)) = previous else {
            return Some(0.0);
        };
        let wall = now
            .duration_since(then)
            .unwrap_or(Duration::ZERO)
            .as_secs_f64();
        if wall <= 0.0 {
            return Some(0.0);
        }
        Some(((cpu - cpu_then) / wall * 1000.0).round() / 10.0)
    }
}
