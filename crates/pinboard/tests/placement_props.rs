//! Property tests of the placement state machine on the memory store:
//! random sequences of register, heartbeat, claim (plain and over a stale
//! owner), resolve, settle (the owner answered), release, reclaim (a
//! re-registration), removal, time passing (leases lapsing) and expiry
//! passes, checked step by step against a small model.
//!
//! Invariants held after every step:
//!
//! - **one owner per id**: the store names at most one owner, the one the
//!   model expects, and answers `Owned` only for a live one;
//! - **epochs monotonic per id**: a new owner always gets an epoch above
//!   every epoch that id ever had (also after its row expired: the floor
//!   keeps to the wall clock as pinboard's does); a re-registration taking
//!   over from its own previous session keeps the epoch; also after a
//!   release dropped a row that was never settled;
//! - **released and orphaned rows go**: a release of a row never settled
//!   drops it at once; an expiry pass keeps exactly the rows the model
//!   keeps (owned by a live session, or vacated less than one grace ago),
//!   and once a grace passed with no owner, no row is left.

use std::collections::HashMap;

use pinboard::clock::Now;
use pinboard::placement::{
    ClaimOutcome, Generation, InstanceKey, MemoryStore, Placement, PlacementStore, ReclaimOutcome,
    WorkerRecord,
};
use proptest::prelude::*;

const NS: &str = "/counter";
const IDS: usize = 4;
const TTL_MS: u64 = 1_000;
const GRACE_MS: u64 = 3_000;
/// Wall time at the model's monotonic zero.
const WALL_ORIGIN_MS: u64 = 1_800_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    /// A new session registers.
    Register,
    /// Session `n` (modulo the sessions so far) heartbeats.
    Heartbeat(usize),
    /// A request for id `i` offers session `n` as the candidate.
    Claim(usize, usize),
    /// As `Claim`, the current owner having refused the id (stale).
    ClaimStale(usize, usize),
    /// A request for id `i` with no candidate.
    Resolve(usize),
    /// The owner of id `i` answered for it (settled at its epoch).
    Settle(usize),
    /// Session `n` releases id `i`.
    Release(usize, usize),
    /// Session `n` re-submits id `i`, naming session `p` as its previous one.
    Reclaim(usize, usize, Option<usize>),
    /// Session `n` deregisters.
    Remove(usize),
    /// Time passes.
    Advance(u64),
    /// An expiry pass.
    Expire,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Register),
        3 => any::<usize>().prop_map(Op::Heartbeat),
        4 => (0..IDS, any::<usize>()).prop_map(|(i, n)| Op::Claim(i, n)),
        1 => (0..IDS, any::<usize>()).prop_map(|(i, n)| Op::ClaimStale(i, n)),
        2 => (0..IDS).prop_map(Op::Resolve),
        2 => (0..IDS).prop_map(Op::Settle),
        2 => (0..IDS, any::<usize>()).prop_map(|(i, n)| Op::Release(i, n)),
        1 => (0..IDS, any::<usize>(), prop::option::of(any::<usize>()))
            .prop_map(|(i, n, p)| Op::Reclaim(i, n, p)),
        1 => any::<usize>().prop_map(Op::Remove),
        3 => (0u64..1_500).prop_map(Op::Advance),
        2 => Just(Op::Expire),
    ]
}

/// A row as the model expects the store to hold it.
#[derive(Debug, Clone)]
struct Row {
    /// Empty when released.
    owner: String,
    epoch: u64,
    vacant_since: Option<u64>,
    /// The owner answered at this epoch.
    settled: bool,
}

#[derive(Debug, Default)]
struct Model {
    mono_ms: u64,
    /// Session name → (expires at, removed).
    sessions: Vec<(String, u64, bool)>,
    rows: HashMap<String, Row>,
    /// The highest epoch each id ever had.
    highest: HashMap<String, u64>,
}

impl Model {
    fn now(&self) -> Now {
        Now {
            wall_ms: WALL_ORIGIN_MS + self.mono_ms,
            mono_ms: self.mono_ms,
        }
    }

    /// The floor pinboard passes: wall milliseconds times a thousand.
    fn floor(&self) -> u64 {
        self.now().wall_ms * 1000
    }

    fn session(&self, n: usize) -> Option<String> {
        (!self.sessions.is_empty()).then(|| self.sessions[n % self.sessions.len()].0.clone())
    }

    fn live(&self, name: &str) -> bool {
        self.sessions
            .iter()
            .any(|(s, until, removed)| s == name && !removed && *until > self.mono_ms)
    }

    /// The live owner of `id`, if any.
    fn owner(&self, id: &str) -> Option<Placement> {
        self.rows
            .get(id)
            .filter(|r| !r.owner.is_empty() && self.live(&r.owner))
            .map(|r| Placement {
                session_id: r.owner.clone(),
                epoch: r.epoch,
            })
    }

    /// Records a new owner: the epoch must be above every earlier one
    /// (`keep`: equal is allowed, a session handing over to its successor).
    fn placed(&mut self, id: &str, p: &Placement, keep: bool) -> Result<(), TestCaseError> {
        let highest = self.highest.get(id).copied().unwrap_or(0);
        if keep {
            prop_assert!(
                p.epoch >= highest,
                "{id}: epoch {} below {highest}",
                p.epoch
            );
        } else {
            prop_assert!(
                p.epoch > highest,
                "{id}: epoch {} not above {highest}",
                p.epoch
            );
        }
        self.highest.insert(id.to_owned(), p.epoch.max(highest));
        self.rows.insert(
            id.to_owned(),
            Row {
                owner: p.session_id.clone(),
                epoch: p.epoch,
                vacant_since: None,
                settled: false,
            },
        );
        Ok(())
    }
}

fn record(session_id: &str) -> WorkerRecord {
    WorkerRecord {
        session_id: session_id.to_owned(),
        client_id: "c".into(),
        secret: "s".into(),
        advertise_url: "http://127.0.0.1:1".into(),
        namespaces: vec![NS.to_owned()],
        headroom: 100,
        ..Default::default()
    }
}

async fn step(
    store: &MemoryStore,
    model: &mut Model,
    generation: &Generation,
    op: &Op,
) -> Result<(), TestCaseError> {
    let now = model.now();
    let id_name = |i: usize| format!("id{i}");
    match *op {
        Op::Register => {
            let name = format!("s{}", model.sessions.len());
            store
                .put_worker(&record(&name), TTL_MS, now)
                .await
                .expect("put");
            model.sessions.push((name, now.mono_ms + TTL_MS, false));
        }
        Op::Heartbeat(n) => {
            let Some(s) = model.session(n) else {
                return Ok(());
            };
            let renewed = store
                .renew_worker(&s, 1, false, TTL_MS, now)
                .await
                .expect("renew");
            prop_assert_eq!(renewed.is_some(), model.live(&s), "heartbeat of {}", s);
            if renewed.is_some() {
                if let Some(entry) = model.sessions.iter_mut().find(|e| e.0 == s) {
                    entry.1 = now.mono_ms + TTL_MS;
                }
            }
        }
        Op::Claim(i, n) | Op::ClaimStale(i, n) => {
            let Some(s) = model.session(n) else {
                return Ok(());
            };
            let id = id_name(i);
            let stale = match op {
                Op::ClaimStale(..) => model.rows.get(&id).map(|r| (r.owner.clone(), r.epoch)),
                _ => None,
            };
            let stale_ref = stale.as_ref().map(|(s, e)| (s.as_str(), *e));
            let outcome = store
                .resolve_or_claim(
                    InstanceKey::new(NS, &id),
                    Some(&s),
                    stale_ref,
                    model.floor(),
                    generation,
                    now,
                )
                .await
                .expect("claim");
            let expected_owner = model
                .owner(&id)
                .filter(|p| stale_ref.is_none_or(|(s, e)| !(p.session_id == s && p.epoch == e)));
            match (outcome, expected_owner) {
                (ClaimOutcome::Owned(got), Some(owner)) => prop_assert_eq!(got, owner),
                (ClaimOutcome::Claimed(p, _), None) => {
                    prop_assert!(model.live(&s), "claimed for the lapsed {}", s);
                    prop_assert_eq!(&p.session_id, &s);
                    prop_assert!(p.epoch >= model.floor());
                    model.placed(&id, &p, false)?;
                }
                (ClaimOutcome::CandidateGone, None) => prop_assert!(!model.live(&s)),
                (outcome, expected) => {
                    prop_assert!(
                        false,
                        "{id}: {outcome:?}, the model expects owner {expected:?}"
                    )
                }
            }
        }
        Op::Resolve(i) => {
            let id = id_name(i);
            let outcome = store
                .resolve_or_claim(
                    InstanceKey::new(NS, &id),
                    None,
                    None,
                    model.floor(),
                    generation,
                    now,
                )
                .await
                .expect("resolve");
            match (outcome, model.owner(&id)) {
                (ClaimOutcome::Owned(got), Some(owner)) => prop_assert_eq!(got, owner),
                (ClaimOutcome::Vacant, None) => {}
                (outcome, expected) => {
                    prop_assert!(
                        false,
                        "{id}: {outcome:?}, the model expects owner {expected:?}"
                    )
                }
            }
        }
        Op::Settle(i) => {
            let id = id_name(i);
            let Some(row) = model.rows.get_mut(&id).filter(|r| !r.owner.is_empty()) else {
                return Ok(());
            };
            let settled = store
                .settle(InstanceKey::new(NS, &id), &row.owner, row.epoch)
                .await
                .expect("settle");
            prop_assert!(settled, "{} settling {}", row.owner, id);
            row.settled = true;
        }
        Op::Release(i, n) => {
            let Some(s) = model.session(n) else {
                return Ok(());
            };
            let id = id_name(i);
            let released = store
                .release(InstanceKey::new(NS, &id), &s, None)
                .await
                .expect("release");
            let owns = model.rows.get(&id).is_some_and(|r| r.owner == s);
            prop_assert_eq!(released, owns, "{} releasing {}", s, id);
            match model.rows.get_mut(&id).filter(|_| owns) {
                Some(row) if row.settled => row.owner.clear(),
                Some(_) => drop(model.rows.remove(&id)),
                None => {}
            }
        }
        Op::Reclaim(i, n, prev) => {
            let Some(s) = model.session(n) else {
                return Ok(());
            };
            let prev = prev.and_then(|p| model.session(p));
            let id = id_name(i);
            let outcome = store
                .reclaim(
                    InstanceKey::new(NS, &id),
                    &s,
                    prev.as_deref().as_slice(),
                    model.floor(),
                    now,
                )
                .await
                .expect("reclaim");
            let row = model.rows.get(&id).cloned();
            let current = row.as_ref().map(|r| r.owner.clone()).unwrap_or_default();
            let from_prev = prev.as_deref().is_some_and(|p| p == current);
            match outcome {
                ReclaimOutcome::Duplicate => {
                    prop_assert!(current != s && !from_prev && model.live(&current));
                }
                ReclaimOutcome::Reclaimed(p) => {
                    prop_assert_eq!(&p.session_id, &s);
                    if current == s {
                        prop_assert_eq!(Some(p.epoch), row.map(|r| r.epoch));
                    } else {
                        prop_assert!(from_prev || !model.live(&current) || current.is_empty());
                        model.placed(&id, &p, from_prev)?;
                    }
                }
            }
        }
        Op::Remove(n) => {
            let Some(s) = model.session(n) else {
                return Ok(());
            };
            let _ = store.remove_worker(&s).await.expect("remove");
            if let Some(entry) = model.sessions.iter_mut().find(|e| e.0 == s) {
                entry.2 = true;
            }
        }
        Op::Advance(ms) => model.mono_ms += ms,
        Op::Expire => {
            store
                .expire_placements(usize::MAX, now)
                .await
                .expect("expire");
            let live: Vec<String> = model
                .sessions
                .iter()
                .filter(|(s, ..)| model.live(s))
                .map(|(s, ..)| s.clone())
                .collect();
            model.rows.retain(|_, row| {
                if !row.owner.is_empty() && live.contains(&row.owner) {
                    row.vacant_since = None;
                    return true;
                }
                let since = *row.vacant_since.get_or_insert(now.mono_ms);
                now.mono_ms - since < GRACE_MS
            });
            prop_assert_eq!(store.rows(), model.rows.len(), "rows after an expiry pass");
        }
    }
    // One owner per id, the one the model expects, live as the model says.
    let now = model.now();
    for i in 0..IDS {
        let id = id_name(i);
        let entry = store
            .placement(InstanceKey::new(NS, &id), now)
            .await
            .expect("placement");
        let expected = model.rows.get(&id).filter(|r| !r.owner.is_empty());
        match (entry, expected) {
            (None, None) => {}
            (Some(entry), Some(row)) => {
                prop_assert_eq!(&entry.placement.session_id, &row.owner);
                prop_assert_eq!(entry.placement.epoch, row.epoch);
                prop_assert_eq!(entry.live, model.live(&row.owner));
            }
            (entry, row) => prop_assert!(false, "{id}: store {entry:?}, model {row:?}"),
        }
    }
    Ok(())
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let store = MemoryStore::new().with_row_grace(GRACE_MS);
        let generation = store
            .open_generation(&Generation::new("g", 0))
            .await
            .expect("generation");
        let mut model = Model::default();
        for op in ops {
            step(&store, &mut model, &generation, op).await?;
        }
        // Every owner gone, two graces and passes later: no row is left.
        for n in 0..model.sessions.len() {
            step(&store, &mut model, &generation, &Op::Remove(n)).await?;
        }
        for _ in 0..2 {
            step(&store, &mut model, &generation, &Op::Advance(GRACE_MS)).await?;
            step(&store, &mut model, &generation, &Op::Expire).await?;
        }
        prop_assert_eq!(store.rows(), 0, "rows outlived their owners");
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn placement_keeps_its_invariants(ops in prop::collection::vec(op(), 1..80)) {
        run(&ops)?;
    }
}
