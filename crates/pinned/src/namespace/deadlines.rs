//! The namespace's index of live instance records by when the idle sweep
//! must next look at each: buckets keyed by a tick of the sweep interval,
//! so a pass takes out only the buckets that are due and costs what is
//! due, not what is resident.
//!
//! The request path never writes here. A request stamps its record's
//! activity (one store, as before the index), and the index keeps each
//! record where its deadline was when it was queued; a record touched since
//! comes out of its bucket early, and the sweep, looking again, queues it
//! at its new deadline (one visit per record touched and due, at most one
//! per idle timeout).
//!
//! Each record notes the tick of its bucket (31 bits of it, beside its
//! sequence number, so the note costs the record no room). A record that
//! closes while queued (an abort, a wind-down, a drain) is counted dead in
//! its bucket by that note, and a bucket sheds its dead records once they
//! are an eighth of it: what closed is freed without a walk of the index.
//!
//! This module orders records and nothing more: it never decides when one
//! is due (the namespace computes deadlines and judges what it takes out),
//! reads a clock, or closes a record.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

/// The note of a record in no bucket.
pub(super) const NOT_QUEUED: u32 = 0;
/// Set in the note of a queued record, beside the low bits of its tick.
const QUEUED: u32 = 1 << 31;
/// The bits of a tick a note keeps.
const TICK_BITS: u64 = (1 << 31) - 1;
/// How far past the last tick taken out a record may be queued: keys stay
/// inside a window its note's 31 bits tell apart (a later deadline is
/// looked at then and queued again).
const HORIZON: u64 = 1 << 30;
/// A bucket this small sheds its dead records at each close.
const SMALL_BUCKET: usize = 64;
/// Records queued or re-queued under one hold of the lock.
const BATCH: usize = 1024;

/// What the index needs of a record: a note to keep its bucket's tick in,
/// and its stage as far as the index acts on it.
pub(super) trait Queued {
    /// The note ([`NOT_QUEUED`] when in no bucket); written under the
    /// index's lock.
    fn note(&self) -> &AtomicU32;
    /// Whether it is live (only live records are queued).
    fn is_live(&self) -> bool;
    /// Whether it closed for good (a closed record is dropped when found).
    fn is_closed(&self) -> bool;
}

/// What [`Deadlines::oldest`] makes of one record it looks at.
pub(super) enum Judged {
    /// A candidate, ranked (the lowest rank wins), whose deadline is
    /// `deadline_ms`: one queued before that is stale (touched since) and
    /// moves there, a candidate only when nothing fresher is found.
    Candidate { rank: u64, deadline_ms: u64 },
    /// Not a candidate, and due no sooner than this (ms): it moves there
    /// if that is a later tick.
    Later(u64),
    /// Not a candidate; left where it is.
    Skip,
}

/// The records of one tick.
struct Bucket<R> {
    records: Vec<Arc<R>>,
    /// Records in `records` that closed since they were queued, counted by
    /// [`Deadlines::forget`].
    dead: usize,
}

impl<R> Default for Bucket<R> {
    fn default() -> Self {
        Self {
            records: Vec::new(),
            dead: 0,
        }
    }
}

impl<R: Queued> Bucket<R> {
    /// Drops the closed records (`dead` counted some of them; the note of
    /// every other one is cleared so its own forget counts nothing).
    fn shed(&mut self) {
        self.records.retain(|record| {
            let closed = record.is_closed();
            if closed {
                record.note().store(NOT_QUEUED, Ordering::SeqCst);
            }
            !closed
        });
        self.dead = 0;
    }
}

/// The buckets, keyed by tick, and the last tick taken out.
struct Buckets<R> {
    by_tick: BTreeMap<u64, Bucket<R>>,
    /// The last tick [`Deadlines::take_due`] took out: every key is at
    /// least this and at most [`HORIZON`] past it.
    floor: u64,
}

impl<R: Queued> Buckets<R> {
    /// The key a note names, when its bucket is still there.
    fn key_of(&self, note: u32) -> Option<u64> {
        if note & QUEUED == 0 {
            return None;
        }
        let low = u64::from(note & !QUEUED);
        let key = self.floor + (low.wrapping_sub(self.floor) & TICK_BITS);
        self.by_tick.contains_key(&key).then_some(key)
    }

    /// Queues `record` at `tick` (clamped into the window) unless it is
    /// no longer live.
    fn push(&mut self, record: Arc<R>, tick: u64) {
        // Checked under the lock against `forget`, which runs after the
        // record closed: a record closed before this point is left out, one
        // closed after it is found by its note.
        if !record.is_live() {
            return;
        }
        let key = tick.clamp(self.floor, self.floor + HORIZON);
        #[allow(clippy::cast_possible_truncation)] // masked to 31 bits
        let note = QUEUED | (key & TICK_BITS) as u32;
        record.note().store(note, Ordering::SeqCst);
        self.by_tick.entry(key).or_default().records.push(record);
    }
}

/// Live records by the tick at which the sweep must look at each again.
pub(super) struct Deadlines<R> {
    /// The length of a tick: the sweep interval, in ms (at least 1).
    tick_ms: u64,
    buckets: Mutex<Buckets<R>>,
}

impl<R: Queued> Deadlines<R> {
    /// An empty index whose ticks are `interval` long.
    pub(super) fn new(interval: Duration) -> Self {
        Self {
            tick_ms: u64::try_from(interval.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
            buckets: Mutex::new(Buckets {
                by_tick: BTreeMap::new(),
                floor: 0,
            }),
        }
    }

    /// The first tick at or after `deadline_ms`: a record queued there is
    /// due when the sweep takes its bucket out.
    fn tick_of(&self, deadline_ms: u64) -> u64 {
        deadline_ms.div_ceil(self.tick_ms)
    }

    /// Queues `record` to be looked at in the tick holding `deadline_ms`
    /// (the namespace's milliseconds); a record that is no longer live is
    /// left out.
    pub(super) fn queue(&self, record: Arc<R>, deadline_ms: u64) {
        let tick = self.tick_of(deadline_ms);
        self.buckets.lock().push(record, tick);
    }

    /// [`queue`](Self::queue) for many records, the lock taken once per
    /// batch so activations are never held up behind a long pass.
    pub(super) fn queue_all(&self, records: Vec<(Arc<R>, u64)>) {
        let mut records = records.into_iter().peekable();
        while records.peek().is_some() {
            let mut buckets = self.buckets.lock();
            for (record, deadline_ms) in records.by_ref().take(BATCH) {
                buckets.push(record, self.tick_of(deadline_ms));
            }
        }
    }

    /// Takes out every record queued in a tick up to the one holding
    /// `now_ms`: what a pass looks at. Each comes out with its note
    /// cleared (it is in no bucket now); closed ones come out too, for the
    /// caller to drop.
    pub(super) fn take_due(&self, now_ms: u64) -> Vec<Arc<R>> {
        let now = now_ms / self.tick_ms;
        let mut due = Vec::new();
        {
            let mut buckets = self.buckets.lock();
            buckets.floor = buckets.floor.max(now);
            while let Some(entry) = buckets.by_tick.first_entry() {
                if *entry.key() > now {
                    break;
                }
                due.push(entry.remove().records);
            }
        }
        // Flattened and cleared outside the lock: a mass of records due at
        // once never holds up an activation.
        let due: Vec<Arc<R>> = if due.len() == 1 {
            due.pop().unwrap_or_default()
        } else {
            due.into_iter().flatten().collect()
        };
        for record in &due {
            record.note().store(NOT_QUEUED, Ordering::SeqCst);
        }
        due
    }

    /// `record` closed (its stage is `Closed`): if it is queued, it is
    /// counted dead in its bucket, which sheds its dead records once they
    /// are an eighth of it.
    pub(super) fn forget(&self, record: &R) {
        // Records that were never queued (a failed activation, a denied
        // one) take no lock. The note is written under the lock only for a
        // live record, and this record closed before this load.
        if record.note().load(Ordering::SeqCst) == NOT_QUEUED {
            return;
        }
        let mut buckets = self.buckets.lock();
        let note = record.note().swap(NOT_QUEUED, Ordering::SeqCst);
        let Some(key) = buckets.key_of(note) else {
            return;
        };
        let Some(bucket) = buckets.by_tick.get_mut(&key) else {
            return;
        };
        bucket.dead += 1;
        if bucket.dead * 8 > bucket.records.len() || bucket.records.len() <= SMALL_BUCKET {
            bucket.shed();
            if bucket.records.is_empty() {
                buckets.by_tick.remove(&key);
            }
        }
    }

    /// Takes out the best candidate of the earliest buckets, looking at up
    /// to `budget` records, earliest tick first, and stopping at the end of
    /// the first bucket that holds one: `judge` ranks each record or says
    /// when it is due. Records found queued too early (touched since they
    /// were queued, or busy) move to their tick; closed ones are dropped.
    /// When no candidate is where its deadline says, the best of those that
    /// moved wins. The winner leaves the index (the caller queues it again
    /// if it does not close).
    pub(super) fn oldest(
        &self,
        budget: usize,
        mut judge: impl FnMut(&R) -> Judged,
    ) -> Option<Arc<R>> {
        let mut buckets = self.buckets.lock();
        let mut looked = 0;
        // Records to queue again at their deadline, with their rank when
        // they were candidates.
        let mut moved: Vec<(Arc<R>, u64, Option<u64>)> = Vec::new();
        let mut best: Option<(u64, u64, usize)> = None;
        let mut next = buckets.by_tick.keys().next().copied();
        while let Some(key) = next {
            if best.is_some() || looked >= budget {
                break;
            }
            next = buckets.by_tick.range(key + 1..).next().map(|(key, _)| *key);
            let Some(bucket) = buckets.by_tick.get_mut(&key) else {
                continue;
            };
            // `swap_remove` brings an unjudged record to `at`; every index
            // below `at` (the best one's among them) stays put.
            let mut at = 0;
            while at < bucket.records.len() && looked < budget {
                looked += 1;
                let record = &bucket.records[at];
                if record.is_closed() {
                    // Counted dead already, or not yet: once its note is
                    // cleared its own forget counts nothing.
                    if record.note().swap(NOT_QUEUED, Ordering::SeqCst) == NOT_QUEUED {
                        bucket.dead = bucket.dead.saturating_sub(1);
                    }
                    bucket.records.swap_remove(at);
                    continue;
                }
                let (rank, deadline_ms) = match judge(record) {
                    Judged::Candidate { rank, deadline_ms } => (Some(rank), deadline_ms),
                    Judged::Later(deadline_ms) => (None, deadline_ms),
                    Judged::Skip => {
                        at += 1;
                        continue;
                    }
                };
                if self.tick_of(deadline_ms) > key {
                    moved.push((bucket.records.swap_remove(at), deadline_ms, rank));
                    continue;
                }
                if let Some(rank) = rank {
                    if best.is_none_or(|(top, ..)| rank < top) {
                        best = Some((rank, key, at));
                    }
                }
                at += 1;
            }
            if bucket.records.is_empty() {
                buckets.by_tick.remove(&key);
            }
        }
        let winner = match best {
            Some((_, key, at)) => {
                let (record, emptied) = match buckets.by_tick.get_mut(&key) {
                    Some(bucket) => (
                        Some(bucket.records.swap_remove(at)),
                        bucket.records.is_empty(),
                    ),
                    None => (None, false),
                };
                if emptied {
                    buckets.by_tick.remove(&key);
                }
                record
            }
            None => moved
                .iter()
                .enumerate()
                .filter_map(|(at, (_, _, rank))| rank.map(|rank| (rank, at)))
                .min()
                .map(|(_, at)| moved.swap_remove(at).0),
        };
        if let Some(winner) = &winner {
            winner.note().store(NOT_QUEUED, Ordering::SeqCst);
        }
        for (record, deadline_ms, _) in moved {
            let tick = self.tick_of(deadline_ms);
            buckets.push(record, tick);
        }
        winner
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU8;

    use super::*;

    const LIVE: u8 = 0;
    const CLOSING: u8 = 1;
    const CLOSED: u8 = 2;

    /// A record as the index sees it.
    struct Fake {
        note: AtomicU32,
        stage: AtomicU8,
        name: u64,
    }

    impl Queued for Fake {
        fn note(&self) -> &AtomicU32 {
            &self.note
        }

        fn is_live(&self) -> bool {
            self.stage.load(Ordering::SeqCst) == LIVE
        }

        fn is_closed(&self) -> bool {
            self.stage.load(Ordering::SeqCst) == CLOSED
        }
    }

    fn fake(name: u64) -> Arc<Fake> {
        Arc::new(Fake {
            note: AtomicU32::new(NOT_QUEUED),
            stage: AtomicU8::new(LIVE),
            name,
        })
    }

    /// Closes `record` as a teardown does: closed first, then forgotten.
    fn close(index: &Deadlines<Fake>, record: &Fake) {
        record.stage.store(CLOSED, Ordering::SeqCst);
        index.forget(record);
    }

    /// The records the index holds, closed ones included.
    fn held(index: &Deadlines<Fake>) -> usize {
        let buckets = index.buckets.lock();
        buckets
            .by_tick
            .values()
            .map(|bucket| bucket.records.len())
            .sum()
    }

    fn names(records: &[Arc<Fake>]) -> Vec<u64> {
        let mut names: Vec<u64> = records.iter().map(|record| record.name).collect();
        names.sort_unstable();
        names
    }

    #[test]
    fn a_pass_takes_out_only_what_is_due() {
        let index = Deadlines::new(Duration::from_millis(100));
        let records: Vec<Arc<Fake>> = (0..1_000).map(fake).collect();
        for record in &records {
            index.queue(record.clone(), 1_000 + record.name * 10);
        }
        assert!(index.take_due(999).is_empty(), "nothing is due yet");
        // Ticks up to 15 hold the deadlines up to 1 500 ms: 0 … 50.
        let due = index.take_due(1_599);
        assert_eq!(names(&due), (0..=50).collect::<Vec<_>>());
        assert!(due
            .iter()
            .all(|record| record.note.load(Ordering::SeqCst) == NOT_QUEUED));
        assert_eq!(held(&index), 949);
        assert!(index.take_due(1_599).is_empty(), "taken out once");
        // A deadline before the last pass is looked at by the next one.
        index.queue(records[0].clone(), 0);
        assert_eq!(names(&index.take_due(1_599)), [0]);
        assert_eq!(names(&index.take_due(1_600)), (51..=60).collect::<Vec<_>>());
    }

    #[test]
    fn a_record_that_is_not_live_is_not_queued() {
        let index = Deadlines::new(Duration::from_millis(100));
        let closing = fake(1);
        closing.stage.store(CLOSING, Ordering::SeqCst);
        index.queue(closing.clone(), 500);
        assert_eq!(held(&index), 0);
        assert_eq!(closing.note.load(Ordering::SeqCst), NOT_QUEUED);
    }

    #[test]
    fn closed_records_leave_without_a_pass() {
        let index = Deadlines::new(Duration::from_millis(100));
        // One bucket of 10 000 that all close (a churn of short-lived
        // instances): nothing of them stays.
        let churned: Vec<Arc<Fake>> = (0..10_000).map(fake).collect();
        for record in &churned {
            index.queue(record.clone(), 60_000);
        }
        for record in &churned {
            close(&index, record);
        }
        assert_eq!(held(&index), 0);
        // Beside 8 000 that stay, closed ones never make up more than an
        // eighth of their bucket.
        let staying: Vec<Arc<Fake>> = (0..8_000).map(fake).collect();
        let leaving: Vec<Arc<Fake>> = (8_000..16_000).map(fake).collect();
        for (stay, leave) in staying.iter().zip(&leaving) {
            index.queue(stay.clone(), 60_000);
            index.queue(leave.clone(), 60_000);
        }
        for (closed, record) in leaving.iter().enumerate() {
            close(&index, record);
            let live = 16_000 - (closed + 1);
            let dead = held(&index) - live;
            assert!(
                dead * 8 <= held(&index),
                "{dead} closed of {}",
                held(&index)
            );
        }
        assert!(held(&index) <= 8_000 + 8_000 / 7);
        let due = index.take_due(60_000);
        assert_eq!(due.iter().filter(|record| record.is_live()).count(), 8_000);
    }

    #[test]
    fn eviction_takes_the_oldest_and_moves_the_stale() {
        let index = Deadlines::new(Duration::from_millis(1_000));
        let records: Vec<Arc<Fake>> = (0..4).map(fake).collect();
        // Queued in order: 0 at 10 s, 1 at 11 s, 2 at 12 s, 3 at 13 s.
        for record in &records {
            index.queue(record.clone(), 10_000 + record.name * 1_000);
        }
        // 0 was used since (its deadline is 20 s now): it moves, and 1, the
        // oldest where its deadline says, wins.
        let deadline = |name: u64| {
            if name == 0 {
                20_000
            } else {
                10_000 + name * 1_000
            }
        };
        let candidate = |record: &Fake| Judged::Candidate {
            rank: deadline(record.name),
            deadline_ms: deadline(record.name),
        };
        let winner = index.oldest(64, candidate).expect("a candidate");
        assert_eq!(winner.name, 1);
        assert_eq!(winner.note.load(Ordering::SeqCst), NOT_QUEUED);
        assert_eq!(held(&index), 3);
        // Busy records move out of the way; closed ones are dropped.
        close(&index, &records[2]);
        let busy_or_not = |record: &Fake| match record.name {
            3 => Judged::Later(40_000),
            _ => candidate(record),
        };
        assert_eq!(index.oldest(64, busy_or_not).map(|r| r.name), Some(0));
        assert_eq!(held(&index), 1);
        // Nothing idle: none.
        assert!(index.oldest(64, |_| Judged::Skip).is_none());
        // When every candidate looked at was stale, the best of them wins
        // and the others stay moved.
        let index = Deadlines::new(Duration::from_millis(1_000));
        let touched: Vec<Arc<Fake>> = (10..13).map(fake).collect();
        for record in &touched {
            index.queue(record.clone(), 50_000);
        }
        let stale = |record: &Fake| Judged::Candidate {
            rank: 100 - record.name,
            deadline_ms: 90_000,
        };
        assert_eq!(index.oldest(3, stale).map(|r| r.name), Some(12));
        assert_eq!(held(&index), 2);
        assert!(index.take_due(50_000).is_empty());
        assert_eq!(names(&index.take_due(90_000)), [10, 11]);
    }

    #[test]
    fn notes_find_their_bucket_across_the_wrap_of_31_bits() {
        // The last pass was 10 ticks before the low 31 bits wrap; the
        // records are queued 10 ticks after it.
        let index = Deadlines::new(Duration::from_millis(1));
        let floor = (3_u64 << 31) - 10;
        assert!(index.take_due(floor).is_empty());
        let records: Vec<Arc<Fake>> = (0..3).map(fake).collect();
        for record in &records {
            index.queue(record.clone(), floor + 20 + record.name);
        }
        // Found by its note, counted dead, shed.
        close(&index, &records[1]);
        assert_eq!(held(&index), 2);
        // A deadline past the horizon waits at the horizon.
        index.queue(fake(9), u64::MAX);
        assert_eq!(names(&index.take_due(floor + 100)), [0, 2]);
        assert_eq!(names(&index.take_due(floor + HORIZON)), [9]);
    }
}
