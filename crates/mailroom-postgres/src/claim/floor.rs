//! Where a claim of independent events starts walking `queue_claim`.
//!
//! Claiming an event moves it out of the partial index `queue_claim`, but
//! its entry stays there, dead, until VACUUM removes it; autovacuum visits a
//! database at most once a minute (`autovacuum_naptime`). Every claim walks
//! the topic's pending events from the oldest, so it steps over every entry
//! claimed since the last VACUUM: measured on a drain, a claim of 64 took
//! 1.5 ms of index walk after 64,000 events, against 0.05 ms fresh, growing
//! with each event until a VACUUM.
//!
//! So each store remembers, per topic, a *floor*: the position (priority,
//! `seq`) just past the last event its last claim took, in claim order,
//! when that claim came back full. The next claim walks from there on.
//! Events older than the floor can still turn pending (a retry falls due, a
//! lease is rescued, an event is replayed, or a transaction that took an
//! older `seq` commits late), and claims from a floor leave the events
//! delivered later that fell due to the walks of the whole topic (so that
//! a busy topic's claims cost what they did before delayed delivery), so
//! the floor is only a hint:
//!
//! - a walk from the floor that comes back short is followed at once by a
//!   walk of the whole topic, for the rest;
//! - while walks from the floor keep coming back full, the whole topic is
//!   walked again at least every [`RESCAN`].
//!
//! An event older than the floor, or delivered later and due, therefore
//! waits at most [`RESCAN`] longer than it would have, and only while the
//! topic has a backlog that keeps its claims full.
//! Sequential topics do not use floors: the head rule reads older events
//! anyway.

use super::{Position, claim_order};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Longest stretch of claims from a floor without one walk of the whole topic.
pub(crate) const RESCAN: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
struct Floor {
    /// The next claim walks from this position on, in claim order.
    from: Position,
    /// When the whole topic was last walked.
    walked_all_at: Instant,
}

/// The floors of one store, per topic.
#[derive(Debug, Default)]
pub(crate) struct Floors {
    topics: Mutex<HashMap<String, Floor>>,
}

impl Floors {
    /// Where the next claim of `topic` starts: `None` (the whole topic)
    /// unless a recent claim came back full and the whole topic was walked
    /// less than [`RESCAN`] ago.
    pub(crate) fn start(&self, topic: &str, now: Instant) -> Option<Position> {
        let topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        match topics.get(topic) {
            Some(floor) if now.saturating_duration_since(floor.walked_all_at) < RESCAN => {
                Some(floor.from)
            }
            _ => None,
        }
    }

    /// Sends the next claim of `topic` to its start (events older than its
    /// floor moved ahead of it).
    pub(crate) fn forget(&self, topic: &str) {
        let mut topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        topics.remove(topic);
    }

    /// Records a claim of `topic` that asked for `max` events and took the
    /// events at `taken`, after walking the whole topic if `walked_all`.
    pub(crate) fn record(
        &self,
        topic: &str,
        walked_all: bool,
        max: usize,
        taken: impl Iterator<Item = Position>,
        now: Instant,
    ) {
        let mut topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        let (count, last) = taken.fold((0_usize, None::<Position>), |(n, last), at| {
            let later = last.is_none_or(|l| claim_order(at.0, at.1) > claim_order(l.0, l.1));
            (n + 1, if later { Some(at) } else { last })
        });
        let Some((priority, seq)) = last.filter(|_| count >= max) else {
            // Short: the topic has no backlog past what was taken; the next
            // claim walks it whole (a short walk costs little).
            topics.remove(topic);
            return;
        };
        let walked_all_at = if walked_all {
            now
        } else {
            match topics.get(topic) {
                Some(floor) => floor.walked_all_at,
                // Full from a floor another task has since removed: walk
                // the whole topic next time.
                None => return,
            }
        };
        topics.insert(
            topic.to_owned(),
            Floor {
                from: (priority, seq.saturating_add(1)),
                walked_all_at,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Positions of priority 0 at these `seq`s.
    fn at(seqs: &[i64]) -> impl Iterator<Item = Position> + '_ {
        seqs.iter().map(|&seq| (0, seq))
    }

    #[test]
    fn a_full_claim_sets_the_floor_past_its_newest_event() {
        let floors = Floors::default();
        let t0 = Instant::now();
        assert_eq!(floors.start("t", t0), None);
        floors.record("t", true, 3, at(&[5, 9, 7]), t0);
        assert_eq!(floors.start("t", t0), Some((0, 10)));
        assert_eq!(floors.start("other", t0), None);
        // Claims from the floor that come back full move it on.
        floors.record("t", false, 2, at(&[10, 12]), t0);
        assert_eq!(floors.start("t", t0), Some((0, 13)));
    }

    #[test]
    fn a_short_claim_sends_the_next_one_to_the_start() {
        let floors = Floors::default();
        let t0 = Instant::now();
        floors.record("t", true, 3, at(&[1, 2, 3]), t0);
        floors.record("t", false, 3, at(&[4]), t0);
        assert_eq!(floors.start("t", t0), None);
        floors.record("t", true, 3, at(&[]), t0);
        assert_eq!(floors.start("t", t0), None);
    }

    #[test]
    fn the_whole_topic_is_walked_again_every_rescan() {
        let floors = Floors::default();
        let t0 = Instant::now();
        floors.record("t", true, 1, at(&[4]), t0);
        let later = t0 + RESCAN / 2;
        assert_eq!(floors.start("t", later), Some((0, 5)));
        // Full claims from the floor do not restart the clock...
        floors.record("t", false, 1, at(&[5]), later);
        assert_eq!(floors.start("t", t0 + RESCAN), None);
        // ...a full walk of the whole topic does.
        floors.record("t", true, 1, at(&[6]), t0 + RESCAN);
        assert_eq!(floors.start("t", t0 + RESCAN + RESCAN / 2), Some((0, 7)));
    }
}
