//! The failed-login limiter of the dashboard: at most
//! [`MAX_LOGIN_FAILURES`] wrong tokens per client address in one window,
//! then every login from that address (a right token too) is refused until
//! the window ends.
//!
//! Owns the table of failures by address and its bounds: an entry lives
//! one window from its first failure (then it is gone, whatever followed),
//! and the table holds at most [`MAX_TRACKED_ADDRESSES`]; a failure from a
//! new address into a full table first drops the expired entries, then the
//! entry closest to its end. Never decides whether a token is right, never
//! counts a refused (limited) attempt as a failure (so a client polling
//! through its refusal does not push its window further) and never keys on
//! a forwarding header: the address is the connection's peer.
//!
//! An IPv6 client is keyed by its /64, the block one host or one site is
//! handed: keyed by the full address, a single host could try 2^64 times as
//! often. IPv4-mapped IPv6 addresses count as their IPv4 address.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Wrong tokens one address may present in one window.
pub const MAX_LOGIN_FAILURES: u32 = 10;
/// Most addresses the table tracks at once (about 64 bytes each).
pub const MAX_TRACKED_ADDRESSES: usize = 4096;

/// Failures of one address within its window.
#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    /// The window's end (its first failure plus the window).
    until: Instant,
}

/// The limiter (one per pinboard node).
#[derive(Debug)]
pub struct LoginLimiter {
    entries: Mutex<HashMap<IpAddr, Failures>>,
    window: Duration,
    capacity: usize,
}

/// The key of a client address: IPv4 as is, IPv6 by its /64.
fn key(addr: IpAddr) -> IpAddr {
    match addr.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            let mask = !0u128 << 64;
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
    }
}

impl LoginLimiter {
    /// A limiter counting failures over `window`.
    pub fn new(window: Duration) -> Self {
        Self::with_capacity(window, MAX_TRACKED_ADDRESSES)
    }

    /// A limiter tracking at most `capacity` addresses (tests).
    pub fn with_capacity(window: Duration, capacity: usize) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            window,
            capacity: capacity.max(1),
        }
    }

    /// `Err(wait)` when `addr` used up its failures and its window ends
    /// in `wait`; `Ok` when it may try a token.
    pub fn check(&self, addr: IpAddr, now: Instant) -> Result<(), Duration> {
        let key = key(addr);
        let mut entries = self.entries.lock();
        match entries.get(&key) {
            Some(f) if f.until <= now => {
                entries.remove(&key);
                Ok(())
            }
            Some(f) if f.count >= MAX_LOGIN_FAILURES => Err(f.until - now),
            _ => Ok(()),
        }
    }

    /// Counts a wrong token from `addr`.
    pub fn failed(&self, addr: IpAddr, now: Instant) {
        let key = key(addr);
        let mut entries = self.entries.lock();
        if let Some(f) = entries.get_mut(&key) {
            if f.until > now {
                f.count = f.count.saturating_add(1);
                return;
            }
        } else if entries.len() >= self.capacity {
            entries.retain(|_, f| f.until > now);
            if entries.len() >= self.capacity {
                let closest = entries.iter().min_by_key(|(_, f)| f.until).map(|(k, _)| *k);
                if let Some(closest) = closest {
                    entries.remove(&closest);
                }
            }
        }
        entries.insert(
            key,
            Failures {
                count: 1,
                until: now + self.window,
            },
        );
    }

    /// A right token from `addr`: its failures are forgotten.
    pub fn succeeded(&self, addr: IpAddr) {
        self.entries.lock().remove(&key(addr));
    }

    /// Addresses in the table (expired ones not yet dropped included).
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn ten_failures_close_an_address_for_the_rest_of_its_window() {
        let limiter = LoginLimiter::new(Duration::from_secs(60));
        let t0 = Instant::now();
        for i in 0..MAX_LOGIN_FAILURES {
            assert_eq!(limiter.check(v4(1), t0), Ok(()), "attempt {i}");
            limiter.failed(v4(1), t0 + Duration::from_secs(u64::from(i)));
        }
        let at = t0 + Duration::from_secs(20);
        assert_eq!(limiter.check(v4(1), at), Err(Duration::from_secs(40)));
        assert_eq!(limiter.check(v4(2), at), Ok(()), "another address");
        assert_eq!(limiter.check(v4(1), t0 + Duration::from_secs(60)), Ok(()));
        assert!(limiter.is_empty(), "the expired entry is dropped");
    }

    #[test]
    fn a_success_forgets_and_ipv6_counts_by_its_64() {
        let limiter = LoginLimiter::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let a: IpAddr = "2001:db8::1".parse().expect("v6");
        let b: IpAddr = "2001:db8::ffff:2".parse().expect("v6");
        let other: IpAddr = "2001:db8:0:1::1".parse().expect("v6");
        for _ in 0..MAX_LOGIN_FAILURES / 2 {
            limiter.failed(a, t0);
            limiter.failed(b, t0);
        }
        assert!(limiter.check(a, t0).is_err(), "one /64, one budget");
        assert_eq!(limiter.check(other, t0), Ok(()));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().expect("mapped");
        for _ in 0..MAX_LOGIN_FAILURES {
            limiter.failed(mapped, t0);
        }
        assert!(limiter.check(v4(1), t0).is_err(), "mapped is its IPv4");
        limiter.succeeded(v4(1));
        assert_eq!(limiter.check(mapped, t0), Ok(()));
    }

    #[test]
    fn the_table_is_bounded_and_evicts_the_entry_closest_to_its_end() {
        let limiter = LoginLimiter::with_capacity(Duration::from_secs(60), 4);
        let t0 = Instant::now();
        for i in 0..4u8 {
            limiter.failed(v4(i), t0 + Duration::from_secs(u64::from(i)));
        }
        limiter.failed(v4(9), t0 + Duration::from_secs(5));
        assert_eq!(limiter.len(), 4);
        for _ in 1..MAX_LOGIN_FAILURES {
            limiter.failed(v4(1), t0 + Duration::from_secs(5));
        }
        assert!(limiter.check(v4(1), t0 + Duration::from_secs(5)).is_err());
        // v4(0) (the oldest) went; 1 000 more addresses keep the bound.
        for i in 0..1000u32 {
            limiter.failed(IpAddr::from(i.to_be_bytes()), t0 + Duration::from_secs(70));
        }
        assert_eq!(limiter.len(), 4);
    }
}
