//! Per-instance turn-taking inside one process.
//!
//! Owns a map from `(ns, id)` to an async mutex so that operations on one instance run
//! one at a time, in arrival order (tokio's mutex is fair), while different instances
//! proceed in parallel. An entry lives only while someone holds or waits for it, so the
//! map never grows with the number of instances ever seen. It must never be held across
//! anything but the one operation it orders.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

type Key = (String, String);

/// Async locks keyed by instance.
#[derive(Debug, Default)]
pub(crate) struct InstanceLocks {
    map: Arc<Mutex<HashMap<Key, Arc<AsyncMutex<()>>>>>,
}

/// The turn of one instance; dropping it passes the turn on.
#[derive(Debug)]
pub(crate) struct Turn {
    guard: Option<OwnedMutexGuard<()>>,
    key: Key,
    map: Arc<Mutex<HashMap<Key, Arc<AsyncMutex<()>>>>>,
}

// === impl InstanceLocks ===

impl InstanceLocks {
    /// Waits for the turn of `(ns, id)`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future gives up the place in line.
    pub(crate) async fn lock(&self, ns: &str, id: &str) -> Turn {
        let key = (ns.to_owned(), id.to_owned());
        let mutex = self.map.lock().entry(key.clone()).or_default().clone();
        // If this future is dropped here, the map keeps an entry until the next turn on
        // this key is dropped; harmless.
        let guard = mutex.lock_owned().await;
        Turn {
            guard: Some(guard),
            key,
            map: self.map.clone(),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().len()
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        // Release first, then forget the entry if nobody else holds a handle to it. The
        // count is stable while the map lock is held: handles are cloned under it.
        drop(self.guard.take());
        let mut map = self.map.lock();
        if map
            .get(&self.key)
            .is_some_and(|mutex| Arc::strong_count(mutex) == 1)
        {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn entries_are_dropped_with_the_last_turn() {
        let locks = InstanceLocks::default();
        let a = locks.lock("/n", "a").await;
        let b = locks.lock("/n", "b").await;
        assert_eq!(locks.len(), 2);
        drop(a);
        assert_eq!(locks.len(), 1);
        drop(b);
        assert_eq!(locks.len(), 0);
    }

    #[tokio::test]
    async fn one_instance_takes_turns() {
        let locks = Arc::new(InstanceLocks::default());
        let first = locks.lock("/n", "a").await;
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let _turn = locks.lock("/n", "a").await;
            })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(first);
        waiter.await.expect("waiter finishes");
        assert_eq!(locks.len(), 0);
    }
}
