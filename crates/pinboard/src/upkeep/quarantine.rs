//! Noticing the end of a quarantine (no new placements, after a start on
//! an empty store or a store loss), which nothing else logs: the request
//! path only sees that ids are placed again.
//!
//! Owns whether this node was in quarantine at the last look and whether a
//! store loss began it (then its end is a warning, the other half of the
//! loss's warning; after a cold start it is news only). Pure: the caller
//! reads the quarantine left and the store-loss count.

/// What the last look saw.
#[derive(Debug, Default)]
pub struct QuarantineWatch {
    quarantined: bool,
    after_loss: bool,
    losses: u64,
}

/// A quarantine that just ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// A store loss began it (rather than a start on an empty store).
    pub after_loss: bool,
}

impl QuarantineWatch {
    /// Takes the quarantine left (ms) and the store losses counted so far;
    /// answers a quarantine that ended since the last look.
    pub fn look(&mut self, left_ms: u64, losses: u64) -> Option<Ended> {
        let lost = losses > self.losses;
        self.losses = losses;
        if left_ms > 0 {
            self.after_loss = (self.quarantined && self.after_loss) || lost;
            self.quarantined = true;
            return None;
        }
        let ended = self.quarantined.then_some(Ended {
            after_loss: self.after_loss || lost,
        });
        self.quarantined = false;
        self.after_loss = false;
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_a_quarantine_is_said_once_with_its_cause() {
        let mut q = QuarantineWatch::default();
        assert_eq!(q.look(1000, 0), None, "a cold start");
        assert_eq!(q.look(0, 0), Some(Ended { after_loss: false }));
        assert_eq!(q.look(0, 0), None, "once");
        assert_eq!(q.look(500, 1), None, "a store loss");
        assert_eq!(q.look(100, 1), None);
        assert_eq!(q.look(0, 1), Some(Ended { after_loss: true }));
        // A loss noticed and over between two looks.
        assert_eq!(q.look(0, 2), None, "never seen in quarantine");
    }
}
