//! The store's generation as this node knows it, and the quarantine that
//! holds new placements back: one state machine, [`Standing`], moved only
//! by [`Standing::next`].
//!
//! Owns when this node may place new ids and `/readyz`'s answer; never
//! changes the route cache (cached routes outlive a store loss, see
//! `Routes::store_lost`; the move log notes their owners).
//!
//! # States
//!
//! | state | new placements | left by |
//! | --- | --- | --- |
//! | [`Standing::Unopened`] | none: the store's generation is unknown | [`Event::Adopted`] |
//! | [`Standing::Quarantined`] | none until its end (ids with a live owner resolve as usual) | [`Event::Elapsed`] past its end, or [`Event::Adopted`] (another loss) |
//! | [`Standing::Placing`] | made | [`Event::Adopted`] of another generation (a store loss) |
//!
//! Every event is legal in every state: time elapsing changes only a
//! quarantine, and adopting the generation already held changes nothing
//! (two requests finding one loss adopt it once).
//!
//! # Quarantine: cold start and store loss (inferred)
//!
//! During a quarantine no *new* placement is made: ids that already have a
//! live owner resolve normally, and workers re-registering with their
//! `instances` reclaim what they hold; everything else answers 503 +
//! `Retry-After`. A quarantine lasts from the moment the store's generation
//! (see `placement`) was written (the generation carries when it ends, so
//! every node that adopts it keeps to the same window), which happens in
//! two cases:
//!
//! - *Cold start on an empty store*, for `--quarantine-ms` (default one
//!   lease TTL): the memory store always (a restarted pinboard has
//!   forgotten every placement), Redis when it holds no generation. A node
//!   joining a Redis that already holds one (a rolling restart of pinboard
//!   nodes) inherits only what is left of that generation's quarantine,
//!   usually nothing.
//! - *Store loss*: Redis lost its data (`FLUSHALL`, a restart without
//!   persistence) while pinboard ran, for at least one lease TTL
//!   (`--quarantine-ms` when longer). Every claim names the generation its
//!   node knows and the store refuses it when the generation is gone or
//!   another, so the first claim after a loss finds out, before placing
//!   anything; so does the maintenance check every `--worker-refresh-ms`
//!   and `/readyz`. The node then writes a new generation (or adopts the
//!   one another node wrote) and waits out the quarantine while every live
//!   worker, answered `reregister` on its next heartbeat, re-registers and
//!   reclaims its instances. The loss happened at most one lease TTL after
//!   every live worker's last renewal, so by the end of the quarantine each
//!   one has either re-registered (its heartbeat interval is at most a third
//!   of the TTL) or seen its own lease run out (it serves nothing any more):
//!   an id of a live owner is never placed elsewhere before its owner had
//!   the time to reclaim it. A shorter window (as `--quarantine-ms` may ask
//!   for at cold start) handed the ids of the workers that came back last
//!   to the first one back, and the latecomers' reclaims found them owned
//!   there and aborted their live instances as duplicates.
//!
//! A directory whose generation was never opened places nothing.

use std::sync::Arc;
use std::time::Duration;

use super::Routes;
use crate::clock::Now;
use crate::placement::{Generation, PlacementStore, StoreError};

/// Where a node stands with the placement store's generation (see the
/// module doc's table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// Before [`Routes::open_generation`]: nothing is placed.
    Unopened,
    /// `generation` adopted; no new placement before `until_mono_ms`.
    Quarantined {
        /// The store's generation.
        generation: Arc<Generation>,
        /// When the quarantine ends (monotonic ms).
        until_mono_ms: u64,
    },
    /// `generation` adopted and its quarantine over: new ids are placed.
    Placing {
        /// The store's generation.
        generation: Arc<Generation>,
    },
}

/// What moves a [`Standing`].
#[derive(Debug, Clone)]
pub enum Event {
    /// The store holds `generation` (opened at start, or found after a
    /// loss); its quarantine has `left_ms` to run from `now_mono_ms`.
    Adopted {
        /// The store's generation.
        generation: Arc<Generation>,
        /// Now (monotonic ms).
        now_mono_ms: u64,
        /// What is left of the generation's quarantine.
        left_ms: u64,
    },
    /// Monotonic time reached `now_mono_ms`.
    Elapsed {
        /// Now (monotonic ms).
        now_mono_ms: u64,
    },
}

impl Standing {
    /// The one transition function (see the module doc's table).
    pub fn next(&self, event: Event) -> Standing {
        match (self, event) {
            (Self::Unopened, Event::Elapsed { .. }) => Self::Unopened,
            (
                Self::Quarantined {
                    generation,
                    until_mono_ms,
                },
                Event::Elapsed { now_mono_ms },
            ) => {
                if now_mono_ms >= *until_mono_ms {
                    Self::Placing {
                        generation: generation.clone(),
                    }
                } else {
                    self.clone()
                }
            }
            (Self::Placing { .. }, Event::Elapsed { .. }) => self.clone(),
            (
                Self::Quarantined {
                    generation: held, ..
                }
                | Self::Placing { generation: held },
                Event::Adopted { generation, .. },
            ) if *held == generation => self.clone(),
            (
                _,
                Event::Adopted {
                    generation,
                    now_mono_ms,
                    left_ms,
                },
            ) => match left_ms {
                0 => Self::Placing { generation },
                left => Self::Quarantined {
                    generation,
                    until_mono_ms: now_mono_ms.saturating_add(left),
                },
            },
        }
    }

    /// The generation held, if one was adopted.
    pub fn generation(&self) -> Option<&Arc<Generation>> {
        match self {
            Self::Unopened => None,
            Self::Quarantined { generation, .. } | Self::Placing { generation } => Some(generation),
        }
    }
}

/// Whether a node should get traffic (`/readyz`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// The store answers and new ids are placed.
    Ready,
    /// The store did not answer (in time).
    StoreUnreachable(String),
    /// New placements wait this many more milliseconds.
    Quarantined {
        /// Milliseconds left.
        left_ms: u64,
    },
}

impl<S: PlacementStore> Routes<S> {
    /// This node's standing at `now_mono_ms`: the generation a claim
    /// names, and whether new placements wait. A quarantine found over
    /// moves the state on (once; every later read finds `Placing`).
    pub(super) fn standing_at(&self, now_mono_ms: u64) -> (Option<Arc<Generation>>, bool) {
        let standing = self.standing.read();
        match &*standing {
            Standing::Unopened => (None, true),
            Standing::Placing { generation } => (Some(generation.clone()), false),
            Standing::Quarantined {
                generation,
                until_mono_ms,
            } => {
                let generation = generation.clone();
                if now_mono_ms < *until_mono_ms {
                    return (Some(generation), true);
                }
                drop(standing);
                self.step(Event::Elapsed { now_mono_ms });
                (Some(generation), false)
            }
        }
    }

    /// Apply `event` to this node's standing.
    fn step(&self, event: Event) {
        let mut standing = self.standing.write();
        *standing = standing.next(event);
    }

    /// Read the store's generation, writing a new one when it holds none,
    /// and adopt it (with what is left of its quarantine). Call once before
    /// serving; until then nothing is placed.
    ///
    /// # Errors
    ///
    /// When the store fails.
    pub async fn open_generation(&self) -> Result<(), StoreError> {
        let now = self.clock.now();
        let proposal = self.propose(now, self.quarantine_ms);
        let held = self.store.open_generation(&proposal).await?;
        let written = held == proposal;
        let left_ms = self.adopt(held.clone(), now, self.quarantine_ms);
        if written {
            tracing::info!(target: "pinboard::placement", generation = %held.0, quarantine_ms = left_ms, "the store held no state: new generation, cold-start quarantine");
        } else {
            tracing::info!(target: "pinboard::placement", generation = %held.0, quarantine_ms = left_ms, "the store holds state: joined its generation");
        }
        Ok(())
    }

    /// A new generation whose quarantine lasts `quarantine_ms` from now.
    pub(super) fn propose(&self, now: Now, quarantine_ms: u64) -> Generation {
        Generation::new(
            &self.entropy.token_hex(16),
            now.wall_ms.saturating_add(quarantine_ms),
        )
    }

    /// Take `generation` as the store's and quarantine until its quarantine
    /// ends (at most `cap_ms` from now, so a skewed clock cannot stretch
    /// it); returns the time left.
    fn adopt(&self, generation: Generation, now: Now, cap_ms: u64) -> u64 {
        let left_ms = generation
            .quarantine_until_wall_ms()
            .unwrap_or(0)
            .saturating_sub(now.wall_ms)
            .min(cap_ms);
        self.step(Event::Adopted {
            generation: Arc::new(generation),
            now_mono_ms: now.mono_ms,
            left_ms,
        });
        left_ms
    }

    /// The store no longer holds this node's generation (it lost its data,
    /// or another node noticed first and wrote `held`): adopt or write one,
    /// and quarantine for the store-loss window (at least a lease TTL, see
    /// the module doc). Cached routes stay: they name the owners the store
    /// had before, which still hold their instances, and they go as usual
    /// when the worker view (re-read every refresh) no longer lists them.
    pub(super) async fn store_lost(&self, held: Option<Generation>) -> Result<(), StoreError> {
        // Epochs minted before the loss are gone from the store: the next
        // claim keeps above the durable mark.
        self.floor.reload_durable();
        let now = self.clock.now();
        let window = self.loss_quarantine_ms;
        let generation = match held {
            Some(g) => g,
            None => {
                self.store
                    .open_generation(&self.propose(now, window))
                    .await?
            }
        };
        let previous = self.standing.read().generation().cloned();
        if previous.as_deref() == Some(&generation) {
            return Ok(());
        }
        let left_ms = self.adopt(generation.clone(), now, window);
        self.counters.store_losses.inc();
        self.note_store_loss();
        tracing::warn!(
            target: "pinboard::placement",
            previous = previous.as_deref().map_or("none", |g| g.0.as_str()),
            generation = %generation.0,
            quarantine_ms = left_ms,
            "the placement store lost its data: no new placements until workers re-registered"
        );
        Ok(())
    }

    /// Compare the store's generation with this node's, and handle a loss.
    ///
    /// # Errors
    ///
    /// When the store fails.
    pub async fn check_generation(&self) -> Result<(), StoreError> {
        let held = self.store.generation().await?;
        let known = self.standing.read().generation().cloned();
        if held.as_ref() != known.as_deref() {
            self.store_lost(held).await?;
        }
        Ok(())
    }

    /// Milliseconds left of the quarantine (0 when placing).
    pub fn quarantine_left_ms(&self) -> u64 {
        match &*self.standing.read() {
            Standing::Unopened => self.quarantine_ms.max(1),
            Standing::Quarantined { until_mono_ms, .. } => {
                until_mono_ms.saturating_sub(self.clock.now().mono_ms)
            }
            Standing::Placing { .. } => 0,
        }
    }

    /// Whether this node should get traffic: the store answers (a
    /// generation check within `timeout`, which also notices a loss) and no
    /// quarantine holds new placements back.
    pub async fn readiness(&self, timeout: Duration) -> Readiness {
        match tokio::time::timeout(timeout, self.check_generation()).await {
            Err(_) => {
                return Readiness::StoreUnreachable(format!(
                    "no answer within {} ms",
                    timeout.as_millis()
                ))
            }
            Ok(Err(e)) => return Readiness::StoreUnreachable(e.to_string()),
            Ok(Ok(())) => {}
        }
        match self.quarantine_left_ms() {
            0 => Readiness::Ready,
            left_ms => Readiness::Quarantined { left_ms },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generation(id: &str) -> Arc<Generation> {
        Arc::new(Generation(id.into()))
    }

    fn adopted(id: &str, now_mono_ms: u64, left_ms: u64) -> Event {
        Event::Adopted {
            generation: generation(id),
            now_mono_ms,
            left_ms,
        }
    }

    #[test]
    fn a_quarantine_ends_when_its_time_is_up_and_not_before() {
        let unopened = Standing::Unopened;
        assert_eq!(
            unopened.next(Event::Elapsed { now_mono_ms: 9_999 }),
            Standing::Unopened,
            "time alone opens nothing"
        );
        let quarantined = unopened.next(adopted("g1", 100, 500));
        assert_eq!(
            quarantined,
            Standing::Quarantined {
                generation: generation("g1"),
                until_mono_ms: 600
            }
        );
        assert_eq!(
            quarantined.next(Event::Elapsed { now_mono_ms: 599 }),
            quarantined
        );
        assert_eq!(
            quarantined.next(Event::Elapsed { now_mono_ms: 600 }),
            Standing::Placing {
                generation: generation("g1")
            }
        );
        assert_eq!(
            Standing::Unopened.next(adopted("g1", 100, 0)),
            Standing::Placing {
                generation: generation("g1")
            },
            "a generation with no quarantine left places at once"
        );
    }

    #[test]
    fn a_store_loss_quarantines_again_and_one_loss_is_adopted_once() {
        let placing = Standing::Placing {
            generation: generation("g1"),
        };
        let lost = placing.next(adopted("g2", 1_000, 3_000));
        assert_eq!(
            lost,
            Standing::Quarantined {
                generation: generation("g2"),
                until_mono_ms: 4_000
            }
        );
        // A second request finding the same loss later changes nothing:
        // the quarantine keeps its end.
        assert_eq!(lost.next(adopted("g2", 2_000, 3_000)), lost);
        assert_eq!(placing.next(adopted("g1", 1_000, 3_000)), placing);
    }
}
