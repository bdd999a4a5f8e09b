//! The memory headroom a worker reports to pinboard: the cgroup limit minus
//! usage (v2, then v1), floored by the host's available memory, in whole
//! MB; 1024 when nothing is known.

/// Reported when neither cgroup nor host memory can be read.
pub const DEFAULT_HEADROOM_MB: i64 = 1024;
const MB: i64 = 1024 * 1024;

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

fn cgroup_available_mb() -> Option<i64> {
    for (limit, usage) in [
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ] {
        let (Some(limit), Some(usage)) = (read(limit), read(usage)) else {
            continue;
        };
        let Ok(usage) = usage.parse::<i64>() else {
            continue;
        };
        if limit == "max" {
            return None;
        }
        let Ok(limit) = limit.parse::<i128>() else {
            continue;
        };
        if limit >= 1 << 60 {
            return None;
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        return Some((limit - usage).max(0) / MB);
    }
    None
}

fn host_available_mb() -> Option<i64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: i64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

/// The default probe.
pub fn default_headroom() -> i64 {
    match (cgroup_available_mb(), host_available_mb()) {
        (Some(cgroup), Some(host)) => cgroup.min(host),
        (Some(one), None) | (None, Some(one)) => one,
        (None, None) => DEFAULT_HEADROOM_MB,
    }
}
