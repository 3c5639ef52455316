//! What holds a topic's claims back on SQLite: the rate budgets and topic
//! pauses live in this process's memory (one `serve` per file is the
//! SQLite deployment; PostgreSQL shares them across instances), with the
//! arithmetic of [`TokenBucket`]. `max_running` needs no state here: a
//! capped claim counts and claims in one writer transaction (`store.rs`).

use jiff::Timestamp;
use mailroom_core::limit::TokenBucket;
use mailroom_core::{Grant, Rate};
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The rate budgets and pauses of one store handle.
#[derive(Debug)]
pub(crate) struct Throttle {
    /// The budgets' clock: seconds since this.
    epoch: Instant,
    buckets: Mutex<HashMap<String, TokenBucket>>,
    /// When each paused topic may be claimed again.
    paused: Mutex<HashMap<String, Timestamp>>,
}

impl Default for Throttle {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            buckets: Mutex::default(),
            paused: Mutex::default(),
        }
    }
}

impl Throttle {
    pub(crate) fn take(&self, topic: &str, rate: Rate, want: u32) -> Grant {
        let now = self.epoch.elapsed().as_secs_f64();
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        buckets
            .entry(topic.to_string())
            .or_insert_with(|| TokenBucket::full(rate, now))
            .take(rate, want, now)
    }

    pub(crate) fn give_back(&self, topic: &str, rate: Rate, n: u32) {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(b) = buckets.get_mut(topic) {
            b.give_back(rate, n);
        }
    }

    pub(crate) fn pause(&self, topic: &str, pause: Duration) -> Timestamp {
        let end = Timestamp::now()
            .checked_add(pause)
            .unwrap_or(Timestamp::MAX);
        let mut paused = self.paused.lock().unwrap_or_else(PoisonError::into_inner);
        let until = paused.entry(topic.to_string()).or_insert(end);
        *until = (*until).max(end);
        *until
    }

    pub(crate) fn paused_for(&self, topic: &str) -> Option<Duration> {
        let paused = self.paused.lock().unwrap_or_else(PoisonError::into_inner);
        let until = paused.get(topic)?;
        let left = until.as_millisecond() - Timestamp::now().as_millisecond();
        u64::try_from(left)
            .ok()
            .filter(|&ms| ms > 0)
            .map(Duration::from_millis)
    }
}
