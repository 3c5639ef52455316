//! Where a claim of independent events starts walking `events_claim`.
//!
//! Claiming an event moves it out of the partial index `events_claim`, but
//! its entry stays there, dead, until VACUUM removes it; autovacuum visits a
//! database at most once a minute (`autovacuum_naptime`). Every claim walks
//! the topic's pending events from the oldest, so it steps over every entry
//! claimed since the last VACUUM: measured on a drain, a claim of 64 took
//! 1.5 ms of index walk after 64,000 events, against 0.05 ms fresh, growing
//! with each event until a VACUUM.
//!
//! So each store remembers, per topic, a *floor*: the `seq` just past the
//! newest event its last claim took, when that claim came back full. The
//! next claim walks from there. Events older than the floor can still turn
//! pending (a retry falls due, a lease is rescued, an event is replayed, or
//! a transaction that took an older `seq` commits late), so the floor is
//! only a hint:
//!
//! - a walk from the floor that comes back short is followed at once by a
//!   walk of the whole topic, for the rest;
//! - while walks from the floor keep coming back full, the whole topic is
//!   walked again at least every [`RESCAN`].
//!
//! An event older than the floor therefore waits at most [`RESCAN`] longer
//! than it would have, and only while the topic has a backlog newer than it.
//! Sequential topics do not use floors: the head rule reads older events
//! anyway.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Longest stretch of claims from a floor without one walk of the whole topic.
pub(crate) const RESCAN: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
struct Floor {
    /// The next claim walks `seq >= from`.
    from: i64,
    /// When the whole topic was last walked.
    walked_all_at: Instant,
}

/// The floors of one store, per topic.
#[derive(Debug, Default)]
pub(crate) struct Floors {
    topics: Mutex<HashMap<String, Floor>>,
}

impl Floors {
    /// Where the next claim of `topic` starts: `0` (the whole topic) unless a
    /// recent claim came back full and the whole topic was walked less than
    /// [`RESCAN`] ago.
    pub(crate) fn start(&self, topic: &str, now: Instant) -> i64 {
        let topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        match topics.get(topic) {
            Some(floor) if now.saturating_duration_since(floor.walked_all_at) < RESCAN => {
                floor.from
            }
            _ => 0,
        }
    }

    /// Records a claim of `topic` that asked for `max` events and took
    /// `seqs`, after walking the whole topic if `walked_all`.
    pub(crate) fn record(
        &self,
        topic: &str,
        walked_all: bool,
        max: usize,
        seqs: impl Iterator<Item = i64>,
        now: Instant,
    ) {
        let mut topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        let (taken, newest) = seqs.fold((0_usize, i64::MIN), |(n, top), seq| (n + 1, top.max(seq)));
        if taken < max {
            // Short: the topic has no backlog past what was taken; the next
            // claim walks it whole (a short walk costs little).
            topics.remove(topic);
            return;
        }
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
                from: newest.saturating_add(1),
                walked_all_at,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_claim_sets_the_floor_past_its_newest_event() {
        let floors = Floors::default();
        let t0 = Instant::now();
        assert_eq!(floors.start("t", t0), 0);
        floors.record("t", true, 3, [5, 9, 7].into_iter(), t0);
        assert_eq!(floors.start("t", t0), 10);
        assert_eq!(floors.start("other", t0), 0);
        // Claims from the floor that come back full move it on.
        floors.record("t", false, 2, [10, 12].into_iter(), t0);
        assert_eq!(floors.start("t", t0), 13);
    }

    #[test]
    fn a_short_claim_sends_the_next_one_to_the_start() {
        let floors = Floors::default();
        let t0 = Instant::now();
        floors.record("t", true, 3, [1, 2, 3].into_iter(), t0);
        floors.record("t", false, 3, [4].into_iter(), t0);
        assert_eq!(floors.start("t", t0), 0);
        floors.record("t", true, 3, std::iter::empty(), t0);
        assert_eq!(floors.start("t", t0), 0);
    }

    #[test]
    fn the_whole_topic_is_walked_again_every_rescan() {
        let floors = Floors::default();
        let t0 = Instant::now();
        floors.record("t", true, 1, [4].into_iter(), t0);
        let later = t0 + RESCAN / 2;
        assert_eq!(floors.start("t", later), 5);
        // Full claims from the floor do not restart the clock...
        floors.record("t", false, 1, [5].into_iter(), later);
        assert_eq!(floors.start("t", t0 + RESCAN), 0);
        // ...a full walk of the whole topic does.
        floors.record("t", true, 1, [6].into_iter(), t0 + RESCAN);
        assert_eq!(floors.start("t", t0 + RESCAN + RESCAN / 2), 7);
    }
}
