//! Claiming ahead: a fast topic claims more events than it has free slots,
//! and starts the extra ones as slots free, as Graphile Worker's local
//! queue does.
//!
//! A claim costs the database about the same whether it takes 100 events
//! or 256, and so does each group of outcomes; a loop that claims only its
//! free slots takes about half its concurrency per claim when handlers are
//! fast (the attempts it just started still hold theirs). Claiming ahead
//! makes those claims full: measured on PostgreSQL (`drain --modes
//! single`), claims of 256 instead of about 120 drained 1.3× as many
//! events per second for 0.8× the database's CPU per event.
//!
//! How far ahead is bounded by what the topic started in the last
//! [`WINDOW`], so the events waiting for a slot are about that much work:
//! none for a topic whose handlers are slow or idle, at most [`AHEAD_MAX`]
//! for a fast one. A claimed event waits under its lease; one that waited
//! so long that its lease no longer covers the attempt's timeout has its
//! lease extended before it starts (`Attempts::start`). Sequential topics
//! claim ahead too: a claim hands out only heads, one per key, so a head
//! waiting for a slot keeps its key's next event waiting as long (about
//! [`WINDOW`]) and per-key order is the store's rule as before. Topics
//! with a `rate` or `max_running` do not: their limits count claims as
//! starts. Nor on a store that shares commits (SQLite):
//! there a loop records the outcomes it was handed with its next claim,
//! which already makes claims and outcome groups share one commit, and a
//! loop waiting for a slot would hold the very outcomes whose recording
//! frees it.

use crate::spec::TopicSpec;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The work a topic may hold claimed beyond its free slots, in time.
pub(super) const WINDOW: Duration = Duration::from_millis(100);
/// The most events claimed beyond the free slots.
pub(super) const AHEAD_MAX: u32 = 256;
/// The largest claim of a topic of independent events that claims ahead:
/// its free slots and the events claimed beyond them in one round trip.
/// Such a topic's loop is claim-bound (about 93 % of a drain in claim
/// calls), so the claim's fixed cost (the round trip, the commit, the
/// statement's setup) is spread over more events: measured on PostgreSQL
/// (`drain --modes single`, 3 alternating rounds), claims of up to 512
/// drained 1.05–1.17× as many events per second as claims of up to
/// [`MAX_CLAIM`](super::MAX_CLAIM), for 0.9× the database's CPU per event.
/// Sequential topics keep [`MAX_CLAIM`](super::MAX_CLAIM): their claims
/// test the head rule row by row, and larger ones were not faster.
pub(super) const AHEAD_CLAIM_MAX: u32 = 512;

/// Attempts a topic loop started recently, to size its claims ahead.
#[derive(Debug)]
pub(super) struct Ahead {
    enabled: bool,
    cap: u32,
    /// The most events one claim of the topic takes.
    claim_max: u32,
    /// (when, how many) per batch of attempts started, oldest first.
    started: VecDeque<(Instant, u32)>,
}

impl Ahead {
    /// For `spec` on a store that `shares_commits` or not: off unless its
    /// events are independent and unlimited and the store does not.
    pub(super) fn for_topic(spec: &TopicSpec, shares_commits: bool) -> Self {
        let enabled = !spec.is_limited() && !shares_commits;
        let independent = spec.mode.per_key().is_none();
        Self {
            enabled,
            cap: AHEAD_MAX.min(spec.concurrency),
            claim_max: if enabled && independent {
                AHEAD_CLAIM_MAX
            } else {
                super::MAX_CLAIM
            },
            started: VecDeque::new(),
        }
    }

    /// The most events one claim of the topic takes.
    pub(super) fn claim_max(&self) -> u32 {
        self.claim_max
    }

    /// Records `n` attempts started (or waiting for a slot) at `now`.
    pub(super) fn started(&mut self, n: u32, now: Instant) {
        if self.enabled && n > 0 {
            self.started.push_back((now, n));
        }
        self.forget_before(now);
    }

    /// How many events to claim beyond `free` slots at `now`: what the
    /// topic started in the last [`WINDOW`], at most the cap.
    pub(super) fn extra(&mut self, now: Instant) -> u32 {
        if !self.enabled {
            return 0;
        }
        self.forget_before(now);
        let recent: u32 = self.started.iter().map(|(_, n)| *n).sum();
        recent.min(self.cap)
    }

    fn forget_before(&mut self, now: Instant) {
        while let Some((at, _)) = self.started.front() {
            if now.saturating_duration_since(*at) <= WINDOW {
                break;
            }
            self.started.pop_front();
        }
    }
}

/// Whether an event claimed at `claimed_at` must have its lease extended
/// before it starts at `now`: what is left of `lease` no longer covers
/// `timeout` with a margin of [`WINDOW`].
pub(super) fn lease_too_short(
    claimed_at: Instant,
    now: Instant,
    lease: Duration,
    timeout: Duration,
) -> bool {
    let left = lease.saturating_sub(now.saturating_duration_since(claimed_at));
    left < timeout + WINDOW
}

#[cfg(test)]
mod tests {
    use super::*;
    use mailroom_core::{Mode, OnDead};

    fn spec() -> TopicSpec {
        TopicSpec::new("t").concurrency(64)
    }

    #[test]
    fn only_independent_topics_that_claim_ahead_take_larger_claims() {
        use crate::dispatch::MAX_CLAIM;
        assert_eq!(
            Ahead::for_topic(&spec(), false).claim_max(),
            AHEAD_CLAIM_MAX
        );
        assert_eq!(Ahead::for_topic(&spec(), true).claim_max(), MAX_CLAIM);
        let sequential = spec().mode(Mode::Sequential {
            on_dead: OnDead::Block,
        });
        assert_eq!(Ahead::for_topic(&sequential, false).claim_max(), MAX_CLAIM);
    }

    #[test]
    fn a_fast_topic_claims_what_it_started_in_the_window_up_to_its_cap() {
        let mut ahead = Ahead::for_topic(&spec(), false);
        let t0 = Instant::now();
        assert_eq!(ahead.extra(t0), 0, "nothing started yet: no claim ahead");
        ahead.started(20, t0);
        ahead.started(30, t0 + Duration::from_millis(50));
        assert_eq!(ahead.extra(t0 + Duration::from_millis(60)), 50);
        ahead.started(40, t0 + Duration::from_millis(90));
        assert_eq!(
            ahead.extra(t0 + Duration::from_millis(95)),
            64,
            "capped by concurrency"
        );
        assert_eq!(
            ahead.extra(t0 + Duration::from_millis(170)),
            40,
            "the first two batches left the window"
        );
        assert_eq!(ahead.extra(t0 + Duration::from_secs(1)), 0, "idle again");
    }

    #[test]
    fn limited_topics_and_sharing_stores_never_claim_ahead() {
        let now = Instant::now();
        let limited = [
            spec().max_running(4),
            spec().rate(mailroom_core::Rate::parse("10/s").expect("rate")),
        ];
        for spec in limited {
            let mut ahead = Ahead::for_topic(&spec, false);
            ahead.started(50, now);
            assert_eq!(ahead.extra(now), 0, "{spec:?}");
        }
        let mut sharing = Ahead::for_topic(&spec(), true);
        sharing.started(50, now);
        assert_eq!(sharing.extra(now), 0, "a store that shares commits");
        let mut sequential = Ahead::for_topic(
            &spec().mode(Mode::Sequential {
                on_dead: OnDead::Block,
            }),
            false,
        );
        sequential.started(50, now);
        assert_eq!(
            sequential.extra(now),
            50,
            "a sequential topic claims heads ahead"
        );
    }

    #[test]
    fn a_lease_is_extended_only_when_what_is_left_no_longer_covers_the_timeout() {
        let (lease, timeout) = (Duration::from_secs(40), Duration::from_secs(30));
        let t0 = Instant::now();
        assert!(!lease_too_short(
            t0,
            t0 + Duration::from_secs(1),
            lease,
            timeout
        ));
        assert!(!lease_too_short(
            t0,
            t0 + Duration::from_millis(9_900),
            lease,
            timeout
        ));
        assert!(lease_too_short(
            t0,
            t0 + Duration::from_millis(9_950),
            lease,
            timeout
        ));
        assert!(lease_too_short(
            t0,
            t0 + Duration::from_secs(60),
            lease,
            timeout
        ));
    }
}
