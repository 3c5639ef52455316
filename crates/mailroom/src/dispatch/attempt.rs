//! Running an attempt, shared by every mode: the handler under the topic's
//! timeout with panics caught, and its verdict resolved by the retry policy
//! into the completion the store records.

use super::TopicRuntime;
use super::telemetry::record_outcome;
use crate::handler::Handler;
use futures::FutureExt;
use mailroom_core::{
    Claimed, Completion, Event, EventId, FencingToken, Outcome, RetryPolicy, Store, StoreError,
};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tracing::{Instrument, error, info_span, warn};

/// Runs `work` (a handler call) under `timeout`, catching a panic. Returns
/// the handler's verdict, or the retry [`Outcome`] a panic or a timeout
/// stands for, and how long it took.
pub(super) async fn guarded<T>(
    timeout: Duration,
    work: impl Future<Output = T>,
) -> (Result<T, Outcome>, Duration) {
    let started = Instant::now();
    let verdict = match tokio::time::timeout(timeout, AssertUnwindSafe(work).catch_unwind()).await {
        Ok(Ok(verdict)) => Ok(verdict),
        Ok(Err(_)) => Err(Outcome::retry("handler panicked")),
        Err(_) => Err(Outcome::retry(format!(
            "timed out after {}",
            mailroom_core::duration::format(timeout)
        ))),
    };
    (verdict, started.elapsed())
}

/// Resolves a handler's verdict on attempt number `attempt` by `policy`,
/// with a fresh jitter spread: the completion the store records. Built-in
/// handlers and pull workers' verdicts go through here alike.
pub(crate) fn resolve(
    outcome: Outcome,
    attempt: u32,
    max_attempts: u32,
    policy: &RetryPolicy,
) -> Completion {
    let spread = rand::random::<f64>() * 2.0 - 1.0;
    outcome.resolve(attempt, max_attempts, policy, spread)
}

/// Resolves `outcome` for `event` by the topic's retry policy and records
/// the attempt's telemetry.
pub(super) fn settle(
    topic: &TopicRuntime,
    event: &Event,
    outcome: Outcome,
    elapsed: Duration,
) -> Completion {
    let completion = resolve(
        outcome,
        event.attempts,
        event.max_attempts,
        &topic.spec.retry,
    );
    record_outcome(event, &completion, Some(elapsed));
    if matches!(completion, Completion::Dead { .. }) {
        topic.died(event.id, event.attempts);
    }
    completion
}

/// Where an attempt of a single or sequential topic sends its outcome.
#[derive(Clone)]
pub(super) enum Record {
    /// The attempt records it on its own, having traded its handler slot
    /// for a place among the outcomes being recorded
    /// ([`Slot::into_recording`]), so the loop claims the next events
    /// while this outcome is committed; then it wakes the loop (a key may
    /// have unblocked). For stores that cannot share one commit between
    /// outcomes and a claim.
    Alone,
    /// Handed to the topic's loop with the handler slot, which the loop
    /// counts as free: it records the outcome and claims into the slot in
    /// one commit ([`Store::complete_and_claim`]).
    WithClaim(mpsc::UnboundedSender<Finished>),
}

/// An attempt's outcome handed to its topic's loop, holding the attempt's
/// handler slot until it is recorded.
pub(super) struct Finished {
    pub id: EventId,
    pub token: FencingToken,
    pub completion: Completion,
    pub slot: OwnedSemaphorePermit,
}

/// One attempt of a single or sequential topic: the handler, its outcome
/// resolved, then recorded with the claim's fencing token as `record`
/// says.
pub(super) async fn run_attempt(
    store: &dyn Store,
    topic: &TopicRuntime,
    handler: &dyn Handler,
    c: Claimed,
    slot: Slot,
    record: Record,
) {
    let event = &c.event;
    let span = info_span!("attempt", event_id = %event.id, topic = %event.topic,
        attempt = event.attempts, correlation_id = event.correlation_id.as_deref().unwrap_or(""));
    crate::otel::adopt(&span, event.traceparent.as_deref());
    async move {
        let (id, token) = (c.event.id, c.token);
        let completion = call_handler(store, topic, handler, &c.event).await;
        match record {
            Record::WithClaim(to_loop) => {
                let finished = Finished {
                    id,
                    token,
                    completion,
                    slot: slot.handler,
                };
                // The loop outlives its attempts: the send cannot fail.
                drop(to_loop.send(finished));
            }
            Record::Alone => {
                // What is left to record is the outcome: the event (its
                // payload) is not held while it waits for its commit.
                drop(c);
                let _recording = slot.into_recording().await;
                recorded(id, store.complete(id, token, completion).await);
                topic.wake.notify_one();
            }
        }
    }
    .instrument(span)
    .await;
}

/// The handler's call on `event`, and its verdict resolved into the
/// completion to record (after the pause a 429 asked for, if any).
async fn call_handler(
    store: &dyn Store,
    topic: &TopicRuntime,
    handler: &dyn Handler,
    event: &Event,
) -> Completion {
    let call = handler.handle(event).instrument(info_span!("handler call"));
    let (verdict, elapsed) = guarded(topic.spec.timeout, call).await;
    let outcome = verdict.unwrap_or_else(|failed| failed);
    if let Some(pause) = outcome.pause() {
        super::throttle::pause(store, topic, pause).await;
    }
    settle(topic, event, outcome, elapsed)
}

/// Logs an outcome that could not be recorded.
pub(super) fn recorded(id: EventId, result: Result<(), StoreError>) {
    match result {
        Ok(()) => {}
        Err(StoreError::StaleToken) => {
            warn!(event_id = %id, "outcome discarded: the lease was lost and the event was handed to another worker");
        }
        Err(e) => {
            // The lease will expire and the event will be rescued.
            error!(event_id = %id, error = %e, "could not record the outcome; the event will be retried after its lease");
        }
    }
}

/// An attempt's hold on its topic's capacity: a handler slot (of
/// `concurrency`), traded, once the handler's verdict is in, for a place
/// among the outcomes being recorded (`RECORDING_ROUNDS × concurrency`).
/// A topic loop claims into its free handler slots, so its next claim
/// overlaps the commit of the last attempts' outcomes (grouped by the
/// store) instead of waiting for it; and the places bound what one topic
/// hands the store's completion queue.
pub(super) struct Slot {
    pub handler: OwnedSemaphorePermit,
    pub recording: Arc<Semaphore>,
}

impl Slot {
    /// Frees the handler slot once a place among the outcomes being
    /// recorded is held; the place is held until the returned permit drops
    /// (`None` only if the semaphore was closed, which nothing does).
    async fn into_recording(self) -> Option<OwnedSemaphorePermit> {
        let place = self.recording.acquire_owned().await.ok();
        drop(self.handler);
        place
    }
}

/// Gives a claimed event back at once (pending, due now, the attempt
/// recorded as a retry), instead of leaving it to its lease.
pub(super) async fn release(store: &dyn Store, c: &Claimed, why: &str) {
    let release = Completion::Retry {
        delay: Duration::ZERO,
        error: why.into(),
    };
    let _ = store.complete(c.event.id, c.token, release).await;
}
