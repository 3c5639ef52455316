//! Batch topics (SPEC §3): events are delivered together.
//!
//! Size/wait mode: the loop claims greedily up to `max_size` and holds a
//! partial batch (under its lease, which covers `max_wait`) until it is full
//! or its oldest event has waited `max_wait` since it was received; wake-ups
//! from intake top it up without polling. Schedule mode: at each cron fire
//! time (UTC, from the injected [`Clock`](crate::clock::Clock)) every due
//! event is delivered in batches of at most `max_size`. With `group_by`, a
//! flushed batch is split into one delivery per value of that JSON pointer.
//!
//! A batch succeeds or fails as a whole, unless the handler reports per-event
//! verdicts; each event keeps its own history and attempt budget.

use super::{TopicRuntime, record_outcome};
use crate::clock::Clock;
use crate::handler::{BatchOutcome, Handler, SharedHandler};
use futures::FutureExt;
use mailroom_core::cron::Cron;
use mailroom_core::{BatchSettings, ClaimRequest, Claimed, Event, Outcome, Store, StoreError};
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, warn};

/// What a batch topic loop runs with.
pub(crate) struct BatchLoop {
    pub store: Arc<dyn Store>,
    pub topic: Arc<TopicRuntime>,
    pub settings: BatchSettings,
    pub handler: SharedHandler,
    pub worker: String,
    pub poll: Duration,
    pub clock: Arc<dyn Clock>,
}

/// Runs one batch topic until `shutdown`.
pub(crate) async fn run_batch_topic(l: BatchLoop, shutdown: CancellationToken) {
    let BatchLoop {
        store,
        topic,
        settings,
        handler,
        worker,
        poll,
        clock,
    } = l;
    let slots = Arc::new(Semaphore::new(topic.spec.concurrency as usize));
    let deliveries = TaskTracker::new();
    // The lease covers the time a partial batch is held plus the attempt.
    let lease = topic.spec.lease + settings.max_wait;
    let req = |max: u32| ClaimRequest {
        topic: topic.spec.name.clone(),
        worker: worker.clone(),
        max,
        lease,
        per_key: None,
    };
    let schedule = match settings.schedule.as_deref().map(Cron::parse).transpose() {
        Ok(s) => s,
        Err(e) => {
            error!(topic = %topic.spec.name, error = %e, "batch schedule is invalid; topic not dispatched");
            return;
        }
    };
    let send = |batch: Vec<Claimed>| {
        let (store, topic, handler, slots, group_by, deliveries) = (
            store.clone(),
            topic.clone(),
            handler.clone(),
            slots.clone(),
            settings.group_by.clone(),
            deliveries.clone(),
        );
        async move {
            for group in split(batch, group_by.as_deref()) {
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    return;
                };
                let (store, topic, handler) = (store.clone(), topic.clone(), handler.clone());
                deliveries.spawn(async move {
                    deliver(&*store, &topic, &*handler, group).await;
                    drop(permit);
                });
            }
        }
    };

    if let Some(cron) = schedule {
        loop {
            let now = clock.now();
            let Some(next) = cron.next_after(now) else {
                warn!(topic = %topic.spec.name, schedule = %cron, "schedule never fires again");
                break;
            };
            let wait = Duration::from_millis(
                u64::try_from(next.as_millisecond() - now.as_millisecond()).unwrap_or(0),
            );
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => break,
            }
            // Fire: deliver everything due now, in batches of max_size.
            loop {
                match store.claim(&req(settings.max_size)).await {
                    Ok(batch) => {
                        let n = batch.len() as u32;
                        if n > 0 {
                            send(batch).await;
                        }
                        if n < settings.max_size {
                            break;
                        }
                    }
                    Err(e) => {
                        warn!(topic = %topic.spec.name, error = %e, "claim failed at schedule");
                        break;
                    }
                }
            }
        }
    } else {
        let mut held: Vec<Claimed> = Vec::new();
        let mut flush_at: Option<Instant> = None;
        loop {
            if shutdown.is_cancelled() {
                break;
            }
            let want = settings.max_size - held.len() as u32;
            match store.claim(&req(want)).await {
                Ok(more) => {
                    if held.is_empty()
                        && let Some(first) = more.first()
                    {
                        // The oldest event has waited since it was received.
                        let waited = jiff::Timestamp::now().as_millisecond()
                            - first.event.received_at.as_millisecond();
                        let left = settings.max_wait.saturating_sub(Duration::from_millis(
                            u64::try_from(waited).unwrap_or(0),
                        ));
                        flush_at = Some(Instant::now() + left);
                    }
                    held.extend(more);
                }
                Err(e) => warn!(topic = %topic.spec.name, error = %e, "claim failed; retrying"),
            }
            let due = flush_at.is_some_and(|t| Instant::now() >= t);
            if held.len() as u32 >= settings.max_size || (!held.is_empty() && due) {
                send(std::mem::take(&mut held)).await;
                flush_at = None;
                continue;
            }
            let sleep = match flush_at {
                Some(t) => t.saturating_duration_since(Instant::now()),
                None => match store.next_due(&req(1)).await {
                    Ok(Some(d)) => Duration::from_millis(
                        u64::try_from(d.as_millisecond() - jiff::Timestamp::now().as_millisecond())
                            .unwrap_or(0),
                    )
                    .clamp(Duration::from_millis(5), poll),
                    _ => poll,
                },
            };
            tokio::select! {
                () = topic.wake.notified() => {}
                () = tokio::time::sleep(sleep) => {}
                () = shutdown.cancelled() => break,
            }
        }
        // Held but never delivered: give them back at once rather than wait for the lease.
        for c in held {
            let release = mailroom_core::Completion::Retry {
                delay: Duration::ZERO,
                error: "released at shutdown before delivery".into(),
            };
            let _ = store.complete(c.event.id, c.token, release).await;
        }
    }
    deliveries.close();
    deliveries.wait().await;
}

/// One delivery per `group_by` value (events without one form their own group).
fn split(batch: Vec<Claimed>, group_by: Option<&str>) -> Vec<Vec<Claimed>> {
    let Some(pointer) = group_by else {
        return vec![batch];
    };
    let mut groups: BTreeMap<Option<String>, Vec<Claimed>> = BTreeMap::new();
    for c in batch {
        let key = c
            .event
            .payload
            .as_ref()
            .and_then(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
            .and_then(|v| {
                v.pointer(pointer).map(|x| match x {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
            });
        groups.entry(key).or_default().push(c);
    }
    groups.into_values().collect()
}

/// Runs the handler on one batch under the topic's timeout, then records each
/// event's own outcome with its own fencing token.
async fn deliver(
    store: &dyn Store,
    topic: &TopicRuntime,
    handler: &dyn Handler,
    batch: Vec<Claimed>,
) {
    let events: Vec<Event> = batch.iter().map(|c| c.event.clone()).collect();
    let started = Instant::now();
    let verdict = match tokio::time::timeout(
        topic.spec.timeout,
        AssertUnwindSafe(handler.handle_batch(&events)).catch_unwind(),
    )
    .await
    {
        Ok(Ok(v)) => v,
        Ok(Err(_)) => BatchOutcome::All(Outcome::retry("handler panicked")),
        Err(_) => BatchOutcome::All(Outcome::retry(format!(
            "timed out after {}",
            mailroom_core::duration::format(topic.spec.timeout)
        ))),
    };
    let elapsed = started.elapsed();
    let items: Vec<_> = batch
        .iter()
        .map(|c| {
            let outcome = verdict.for_event(c.event.id);
            let spread = rand::random::<f64>() * 2.0 - 1.0;
            let completion = outcome.resolve(
                c.event.attempts,
                c.event.max_attempts,
                &topic.spec.retry,
                spread,
            );
            record_outcome(&c.event, &completion, Some(elapsed));
            (c.event.id, c.token, completion)
        })
        .collect();
    // One store write for the whole batch; each event keeps its own token.
    for (c, result) in batch.iter().zip(store.complete_many(items).await) {
        match result {
            Ok(()) | Err(StoreError::StaleToken) => {}
            Err(e) => {
                error!(event_id = %c.event.id, error = %e, "could not record a batch outcome; retried after its lease")
            }
        }
    }
    topic.wake.notify_one();
}
