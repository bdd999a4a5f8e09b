//! The connection cap: how many client connections one process keeps open.
//!
//! Owns the effective cap (`--max-connections`, lowered to what the
//! process's open-file limit can carry); never accepts or closes anything
//! (the accept loop does, turning away a connection over the cap by
//! closing it at once).
//!
//! Every client connection may need a second descriptor for the worker
//! connection its request goes out on (a WebSocket holds both for its
//! whole life), and a process needs a few more for its listener, Redis,
//! Postgres and the challenge probes. A cap above half the soft
//! `RLIMIT_NOFILE` would let clients exhaust descriptors, and then accept
//! fails for everyone (`/healthz` included), so the cap is lowered to half
//! of it, less [`RESERVED_FDS`].

/// Descriptors kept aside for the listener, stores and probes.
pub const RESERVED_FDS: u64 = 64;

/// The soft open-file limit of this process, when the platform says
/// (Linux: `/proc/self/limits`). `None` when unknown or unlimited.
pub fn open_file_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_file_limit(&text)
}

fn parse_open_file_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The cap in effect: `configured`, or what `fd_limit` can carry if less.
/// Never below one.
pub fn effective(configured: usize, fd_limit: Option<u64>) -> usize {
    let Some(limit) = fd_limit else {
        return configured.max(1);
    };
    let carried = usize::try_from(limit.saturating_sub(RESERVED_FDS) / 2).unwrap_or(usize::MAX);
    configured.min(carried).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_file_limit_lowers_the_cap() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max cpu time              unlimited            unlimited            seconds   \n\
                    Max open files            1024                 1048576              files     \n";
        assert_eq!(parse_open_file_limit(text), Some(1024));
        assert_eq!(
            parse_open_file_limit("Max open files   unlimited  unlimited  files"),
            None
        );
        assert_eq!(effective(10_000, Some(1024)), 480);
        assert_eq!(effective(100, Some(1024)), 100);
        assert_eq!(effective(10_000, None), 10_000);
        assert_eq!(effective(10_000, Some(10)), 1);
    }

    #[test]
    fn this_process_has_a_readable_limit_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(open_file_limit().is_some_and(|n| n > 0));
        }
    }
}
