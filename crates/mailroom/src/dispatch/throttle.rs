//! A topic's scheduling limits as its claims meet them: the
//! `rate` budget, `max_running`, and the pause a handler's `429` +
//! `Retry-After` asks for. The dispatcher and pull workers claim through
//! [`claim`]; the store keeps the shared state and applies the limits in
//! the claim's own step (`Store::claim_limited`, `Store::pause_topic`).
//!
//! A topic without limits costs nothing per claim: no pause is read from
//! the store unless one was announced (a [`mailroom_core::pause_notice`] from
//! another instance, or this process's own 429) or the topic's first claim
//! is being made.

use super::TopicRuntime;
use mailroom_core::{
    ClaimLimits, ClaimRequest, Completion, EventId, FencingToken, LimitedClaim, Result, Store,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// How soon a topic whose `max_running` room is full asks again when no
/// local attempt ends first (attempts ending on other instances are not
/// announced).
pub(crate) const RUNNING_RECHECK: Duration = Duration::from_millis(50);

/// A topic's pause, as this process knows it.
#[derive(Debug)]
pub(crate) struct Pause {
    until: Mutex<Option<Instant>>,
    /// The store may hold a pause this process has not read yet.
    unread: AtomicBool,
}

impl Default for Pause {
    fn default() -> Self {
        Self {
            until: Mutex::new(None),
            unread: AtomicBool::new(true),
        }
    }
}

impl Pause {
    /// Another instance paused the topic: read it before the next claim.
    pub(crate) fn announced(&self) {
        self.unread.store(true, Ordering::Release);
    }

    fn set(&self, left: Duration) {
        let until = Instant::now() + left;
        let mut cur = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        *cur = Some(cur.map_or(until, |c| c.max(until)));
    }

    /// How long the topic stays paused, reading the store's pause first if
    /// one was announced.
    async fn left(&self, store: &dyn Store, topic: &str) -> Result<Option<Duration>> {
        if self.unread.swap(false, Ordering::AcqRel) {
            match store.paused_for(topic).await {
                Ok(Some(left)) => self.set(left),
                Ok(None) => {}
                Err(e) => {
                    self.unread.store(true, Ordering::Release);
                    return Err(e);
                }
            }
        }
        let cur = *self.until.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(cur
            .map(|u| u.saturating_duration_since(Instant::now()))
            .filter(|d| !d.is_zero()))
    }
}

/// Claims `req` within `topic`'s limits: `Wait` when nothing may start
/// now (the topic is paused, or the rate budget is empty).
pub(crate) async fn claim(
    store: &dyn Store,
    topic: &TopicRuntime,
    req: &ClaimRequest,
) -> Result<LimitedClaim> {
    if let Some(left) = topic.pause.left(store, &req.topic).await? {
        return Ok(LimitedClaim::Wait(left));
    }
    match limits_of(topic) {
        None => {
            let claimed = store.claim(req).await?;
            Ok(LimitedClaim::Claimed {
                claimed,
                asked: req.max,
                capped: false,
            })
        }
        Some(limits) => store.claim_limited(req, limits).await,
    }
}

/// [`claim`], recording `done` (a topic loop's outcomes) first, in the
/// same commit where the store can ([`Store::complete_and_claim`]). The
/// outcomes are recorded even when the topic is paused or its pause
/// cannot be read.
pub(crate) async fn claim_recording(
    store: &dyn Store,
    topic: &TopicRuntime,
    req: &ClaimRequest,
    done: Vec<(EventId, FencingToken, Completion)>,
) -> (Vec<Result<()>>, Result<LimitedClaim>) {
    if done.is_empty() {
        return (Vec::new(), claim(store, topic, req).await);
    }
    match topic.pause.left(store, &req.topic).await {
        Ok(None) => store.complete_and_claim(done, req, limits_of(topic)).await,
        Ok(Some(left)) => (
            store.complete_many(done).await,
            Ok(LimitedClaim::Wait(left)),
        ),
        Err(e) => (store.complete_many(done).await, Err(e)),
    }
}

/// The limits `topic`'s claims meet in the store, if it has any.
fn limits_of(topic: &TopicRuntime) -> Option<ClaimLimits> {
    let spec = &topic.spec;
    spec.is_limited().then_some(ClaimLimits {
        rate: spec.rate,
        max_running: spec.max_running,
    })
}

/// Pauses `topic` for `pause` (a handler's 429 + `Retry-After`): at once
/// in this process, and in the store for every other instance.
pub(crate) async fn pause(store: &dyn Store, topic: &TopicRuntime, pause: Duration) {
    topic.pause.set(pause);
    match store.pause_topic(&topic.spec.name, pause).await {
        Ok(until) => info!(topic = %topic.spec.name, %until, "topic paused by a 429 Retry-After"),
        Err(e) => warn!(topic = %topic.spec.name, error = %e,
            "topic paused here only: the store did not record the pause"),
    }
}
