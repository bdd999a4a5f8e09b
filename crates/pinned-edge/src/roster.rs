//! The open client connections of one accept loop (or of one I/O thread),
//! which of them are idle, and in which order they went idle: what the
//! accept loop asks at the connection cap, so it can close the connection
//! that has idled longest and admit a new one in its place, as nginx closes
//! its idle keep-alive connections when it runs short of them.
//!
//! Owns the roster and each connection's [`Seat`] in it; never closes
//! anything itself. A connection asked to close ([`Roster::ask_oldest`])
//! is closed by its own task ([`drive`](crate::drive)), between two polls
//! of the connection, and only if it is still idle then: a connection
//! that reads a byte of a head in the meantime takes its seat back
//! ([`Seat::active`]) and stays open.
//!
//! A connection is *idle* while it waits for a request head and no byte of
//! one has arrived: from the end of a response (keep-alive), and from
//! accept (from the handshake's end with TLS) until its first byte. It is
//! *active* from a head's first byte until its response ends, and for good
//! once upgraded.
//!
//! # Cost
//!
//! The idle seats form a list threaded through a slab of entries (oldest
//! first) under one lock: going idle appends, leaving idle unlinks, the
//! accept loop takes the oldest, each O(1). A seat's entry is reused after
//! it leaves, so nothing is allocated per request. A request costs two
//! short lock holds (idle at its response's end, active at the next head's
//! first byte); an I/O thread with a roster of its own shares the lock
//! with the accept loop only, and only at the cap.
//!
//! # Invariants
//!
//! - A seat is in the idle list exactly while its state is idle.
//! - Only the connection's own task moves its seat out of active, so a
//!   task that reads active knows it without the lock; the accept loop only
//!   moves a seat from idle to asked.
//! - [`Roster::asked`] counts the seats asked to close that have neither
//!   left nor taken their seat back: connections about to close, which the
//!   cap counts as gone.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use parking_lot::Mutex;
use tokio::time::Instant;

/// No entry (the end of the idle list).
const NIL: u32 = u32::MAX;

/// A seat's state (see the module doc); `LEFT` is final: the seat's
/// entry may serve another connection already.
const ACTIVE: u8 = 0;
const IDLE: u8 = 1;
const ASKED: u8 = 2;
const LEFT: u8 = 3;

/// The open connections of one accept loop or I/O thread (see the module
/// doc).
#[derive(Debug, Default)]
pub struct Roster {
    list: Mutex<List>,
    open: AtomicUsize,
    asked: AtomicUsize,
}

/// The slab of entries and the idle list through it.
#[derive(Debug)]
struct List {
    entries: Vec<Entry>,
    /// Entries no seat holds.
    free: Vec<u32>,
    /// The idle seat that went idle first.
    oldest: u32,
    /// The idle seat that went idle last.
    newest: u32,
}

impl Default for List {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            free: Vec::new(),
            oldest: NIL,
            newest: NIL,
        }
    }
}

/// One seat's place in the slab.
#[derive(Debug)]
struct Entry {
    prev: u32,
    next: u32,
    /// When it went idle (meaningful while idle).
    since: Instant,
    /// The seat's signal, to ask it to close.
    signal: Option<Arc<Signal>>,
}

/// What a seat and the roster share: the seat's state, and the waker of
/// the task that closes the connection when asked.
#[derive(Debug, Default)]
struct Signal {
    state: AtomicU8,
    waker: AtomicWaker,
}

/// One open connection's place in a [`Roster`]; leaving it (drop, or
/// [`leave`](Seat::leave)) counts the connection closed. Starts active.
#[derive(Debug)]
pub struct Seat {
    roster: Arc<Roster>,
    index: u32,
    signal: Arc<Signal>,
}

impl List {
    fn unlink(&mut self, index: u32) {
        let (prev, next) = {
            let e = &self.entries[index as usize];
            (e.prev, e.next)
        };
        match prev {
            NIL => self.oldest = next,
            p => self.entries[p as usize].next = next,
        }
        match next {
            NIL => self.newest = prev,
            n => self.entries[n as usize].prev = prev,
        }
    }

    fn push_newest(&mut self, index: u32, since: Instant) {
        let newest = self.newest;
        let e = &mut self.entries[index as usize];
        e.prev = newest;
        e.next = NIL;
        e.since = since;
        match newest {
            NIL => self.oldest = index,
            n => self.entries[n as usize].next = index,
        }
        self.newest = index;
    }
}

impl Roster {
    /// An empty roster.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A seat for a connection just accepted (active until it waits for a
    /// head, see [`Seat::idle`]).
    pub fn seat(self: &Arc<Self>) -> Seat {
        let signal = Arc::new(Signal::default());
        let mut list = self.list.lock();
        let entry = Entry {
            prev: NIL,
            next: NIL,
            since: Instant::now(),
            signal: Some(signal.clone()),
        };
        let index = match list.free.pop() {
            Some(index) => {
                list.entries[index as usize] = entry;
                index
            }
            None => {
                // Connections are bounded by descriptors, far below `NIL`.
                let index = list.entries.len() as u32;
                list.entries.push(entry);
                index
            }
        };
        self.open.fetch_add(1, Ordering::Relaxed);
        drop(list);
        Seat {
            roster: self.clone(),
            index,
            signal,
        }
    }

    /// Connections holding a seat.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections asked to close that have not closed yet (and did not
    /// take their seat back).
    pub fn asked(&self) -> usize {
        self.asked.load(Ordering::Relaxed)
    }

    /// Since when the longest idle connection has been idle; `None` when
    /// none is.
    pub fn oldest_idle(&self) -> Option<Instant> {
        let list = self.list.lock();
        (list.oldest != NIL).then(|| list.entries[list.oldest as usize].since)
    }

    /// Asks the longest idle connection to close (its task closes it, if it
    /// is still idle by then); false when none is idle.
    pub fn ask_oldest(&self) -> bool {
        let mut list = self.list.lock();
        let index = list.oldest;
        if index == NIL {
            return false;
        }
        list.unlink(index);
        let Some(signal) = list.entries[index as usize].signal.clone() else {
            return false;
        };
        signal.state.store(ASKED, Ordering::Release);
        self.asked.fetch_add(1, Ordering::Relaxed);
        drop(list);
        signal.waker.wake();
        true
    }
}

impl Seat {
    /// The connection waits for a request head, none of it read, since
    /// `since`: it joins the idle list as its newest. Nothing when it is
    /// idle already or asked to close.
    pub fn idle(&self, since: Instant) {
        let mut list = self.roster.list.lock();
        if self.signal.state.load(Ordering::Acquire) != ACTIVE {
            return;
        }
        list.push_newest(self.index, since);
        self.signal.state.store(IDLE, Ordering::Release);
    }

    /// The connection is busy (a head's first byte came, or it was
    /// upgraded): it leaves the idle list, or takes back its seat if it
    /// was asked to close. One atomic load when active already.
    pub fn active(&self) {
        if matches!(self.signal.state.load(Ordering::Acquire), ACTIVE | LEFT) {
            return;
        }
        let mut list = self.roster.list.lock();
        self.leave_idle(&mut list);
        self.signal.state.store(ACTIVE, Ordering::Release);
    }

    /// Leaves the roster now, the connection still open: it no longer
    /// counts under the cap and is never asked to close (a worker's
    /// upgraded connection, which its instance holds from then on). Every
    /// later transition is a no-op.
    pub fn leave(&self) {
        let mut list = self.roster.list.lock();
        if self.signal.state.load(Ordering::Acquire) == LEFT {
            return;
        }
        self.leave_idle(&mut list);
        self.signal.state.store(LEFT, Ordering::Release);
        list.entries[self.index as usize].signal = None;
        list.free.push(self.index);
        self.roster.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Out of the idle list, or out of the asked count.
    fn leave_idle(&self, list: &mut List) {
        match self.signal.state.load(Ordering::Acquire) {
            IDLE => list.unlink(self.index),
            ASKED => {
                self.roster.asked.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// Ready once the connection was asked to close while idle, and has
    /// not been active since. The task that polls this is the connection's
    /// own: while the seat is active only that task's connection can make
    /// it idle, so no waker is registered until it is.
    pub fn poll_asked(&self, cx: &mut Context<'_>) -> Poll<()> {
        match self.signal.state.load(Ordering::Acquire) {
            ACTIVE | LEFT => Poll::Pending,
            ASKED => Poll::Ready(()),
            _ => {
                self.signal.waker.register(cx.waker());
                if self.signal.state.load(Ordering::Acquire) == ASKED {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use std::time::Duration;

    fn asked(seat: &Seat) -> bool {
        let waker = futures_util::task::noop_waker();
        seat.poll_asked(&mut Context::from_waker(&waker)).is_ready()
    }

    #[tokio::test(start_paused = true)]
    async fn the_longest_idle_is_asked_first_and_active_ones_never() {
        let roster = Roster::new();
        let seats: Vec<Seat> = (0..4).map(|_| roster.seat()).collect();
        assert_eq!(roster.open(), 4);
        assert_eq!(roster.oldest_idle(), None);
        assert!(!roster.ask_oldest(), "nobody idle");
        // Idle in the order 2, 0, 3; 1 stays busy.
        for i in [2, 0, 3] {
            seats[i].idle(Instant::now());
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        // 2 reads a byte of its next head: 0 is now the longest idle.
        seats[2].active();
        let since = roster.oldest_idle().expect("someone idle");
        assert!(roster.ask_oldest());
        assert!(asked(&seats[0]));
        assert_eq!(roster.asked(), 1);
        assert!(roster.oldest_idle().is_some_and(|t| t > since));
        assert!(roster.ask_oldest());
        assert!(asked(&seats[3]));
        assert!(!roster.ask_oldest(), "1 and 2 are busy");
        assert!(!asked(&seats[1]) && !asked(&seats[2]));

        // An asked seat that reads a byte before its task closes it takes
        // its seat back; one that closes leaves the count.
        seats[3].active();
        assert!(!asked(&seats[3]));
        assert_eq!(roster.asked(), 1);
        let mut seats = seats;
        drop(seats.remove(0));
        assert_eq!((roster.open(), roster.asked()), (3, 0));

        // A freed entry is reused, idle again at the newest end.
        let again = roster.seat();
        again.idle(Instant::now());
        seats[0].idle(Instant::now());
        assert!(roster.ask_oldest());
        assert!(asked(&again));
    }

    #[test]
    fn a_seat_that_left_early_is_never_counted_or_asked_again() {
        let roster = Roster::new();
        let seat = roster.seat();
        seat.idle(Instant::now());
        seat.leave();
        assert_eq!(roster.open(), 0);
        // Its entry serves the next connection; the old seat's transitions
        // (and its drop) touch nothing.
        let next = roster.seat();
        seat.idle(Instant::now());
        seat.active();
        assert!(!asked(&seat));
        assert!(!roster.ask_oldest());
        drop(seat);
        assert_eq!(roster.open(), 1);
        next.idle(Instant::now());
        assert!(roster.ask_oldest());
        assert!(asked(&next));
    }

    #[tokio::test]
    async fn an_asked_seat_wakes_its_task() {
        let roster = Roster::new();
        let seat = Arc::new(roster.seat());
        seat.idle(Instant::now());
        let waiting = {
            let seat = seat.clone();
            tokio::spawn(async move { poll_fn(|cx| seat.poll_asked(cx)).await })
        };
        tokio::task::yield_now().await;
        assert!(roster.ask_oldest());
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .expect("task");
    }
}
