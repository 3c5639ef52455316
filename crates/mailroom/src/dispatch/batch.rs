//! Batch topics: events are delivered together, and a batch succeeds or
//! fails as a whole unless the handler names the events that failed.
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

use super::attempt::{guarded, release, settle};
use super::{TopicRuntime, idle};
use crate::clock::Clock;
use crate::handler::{BatchOutcome, Handler, SharedHandler};
use mailroom_core::cron::Cron;
use mailroom_core::{BatchSettings, ClaimRequest, Claimed, Event, Store, StoreError};
use std::collections::BTreeMap;
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

impl BatchLoop {
    /// A claim of up to `max` events. The lease covers the time a partial
    /// batch is held plus the attempt.
    fn request(&self, max: u32) -> ClaimRequest {
        let spec = &self.topic.spec;
        ClaimRequest {
            per_key: None,
            ..spec.claim_request(&self.worker, max, spec.lease + self.settings.max_wait)
        }
    }
}

/// Runs one batch topic until `shutdown`, then waits for deliveries in
/// flight.
pub(crate) async fn run_batch_topic(l: BatchLoop, shutdown: CancellationToken) {
    let schedule = match l.settings.schedule.as_deref().map(Cron::parse).transpose() {
        Ok(s) => s,
        Err(e) => {
            error!(topic = %l.topic.spec.name, error = %e, "batch schedule is invalid; topic not dispatched");
            return;
        }
    };
    let deliveries = Deliveries {
        store: l.store.clone(),
        topic: l.topic.clone(),
        handler: l.handler.clone(),
        slots: Arc::new(Semaphore::new(l.topic.spec.concurrency as usize)),
        group_by: l.settings.group_by.clone(),
        tracker: TaskTracker::new(),
    };
    match schedule {
        Some(cron) => run_on_schedule(&l, &cron, &deliveries, &shutdown).await,
        None => run_by_size(&l, &deliveries, &shutdown).await,
    }
    deliveries.tracker.close();
    deliveries.tracker.wait().await;
}

/// Schedule mode: at each fire time, delivers every due event.
async fn run_on_schedule(
    l: &BatchLoop,
    cron: &Cron,
    deliveries: &Deliveries,
    shutdown: &CancellationToken,
) {
    loop {
        let now = l.clock.now();
        let Some(next) = cron.next_after(now) else {
            warn!(topic = %l.topic.spec.name, schedule = %cron, "schedule never fires again");
            return;
        };
        if !idle::sleep(idle::until(next, now), shutdown).await {
            return;
        }
        // Fire: deliver everything due now, in batches of max_size.
        loop {
            match l.store.claim(&l.request(l.settings.max_size)).await {
                Ok(batch) => {
                    let n = batch.len() as u32;
                    if n > 0 {
                        deliveries.send(batch).await;
                    }
                    if n < l.settings.max_size {
                        break;
                    }
                }
                Err(e) => {
                    warn!(topic = %l.topic.spec.name, error = %e, "claim failed at schedule");
                    break;
                }
            }
        }
    }
}

/// Size/wait mode: holds a partial batch until it is full or has waited
/// `max_wait`; at shutdown, gives back what it still holds.
async fn run_by_size(l: &BatchLoop, deliveries: &Deliveries, shutdown: &CancellationToken) {
    let mut held = Held::default();
    while !shutdown.is_cancelled() {
        let want = l.settings.max_size - held.events.len() as u32;
        match l.store.claim(&l.request(want)).await {
            Ok(more) => held.add(more, l.settings.max_wait),
            Err(e) => warn!(topic = %l.topic.spec.name, error = %e, "claim failed; retrying"),
        }
        if held.ready(l.settings.max_size) {
            deliveries.send(held.take()).await;
            continue;
        }
        let sleep = match held.flush_at {
            Some(t) => t.saturating_duration_since(Instant::now()),
            None => idle::until_due(&*l.store, &l.request(1), l.poll, l.poll).await,
        };
        if !idle::nap(&l.topic.wake, sleep, shutdown).await {
            break;
        }
    }
    // Held but never delivered: give them back at once rather than wait for the lease.
    for c in held.events {
        release(&*l.store, &c, "released at shutdown before delivery").await;
    }
}

/// A partial batch and when it is due for delivery.
#[derive(Default)]
struct Held {
    events: Vec<Claimed>,
    flush_at: Option<Instant>,
}

impl Held {
    /// Adds claimed events; the first of a batch sets its flush time: the
    /// oldest event has waited since it was received.
    fn add(&mut self, more: Vec<Claimed>, max_wait: Duration) {
        if self.events.is_empty()
            && let Some(first) = more.first()
        {
            let waited = idle::until(jiff::Timestamp::now(), first.event.received_at);
            self.flush_at = Some(Instant::now() + max_wait.saturating_sub(waited));
        }
        self.events.extend(more);
    }

    /// Whether the batch is full, or not empty and due.
    fn ready(&self, max_size: u32) -> bool {
        let due = self.flush_at.is_some_and(|t| Instant::now() >= t);
        self.events.len() as u32 >= max_size || (!self.events.is_empty() && due)
    }

    /// The batch, leaving nothing held.
    fn take(&mut self) -> Vec<Claimed> {
        self.flush_at = None;
        std::mem::take(&mut self.events)
    }
}

/// Hands flushed batches to the handler, one delivery per group, at most
/// the topic's concurrency at a time.
struct Deliveries {
    store: Arc<dyn Store>,
    topic: Arc<TopicRuntime>,
    handler: SharedHandler,
    slots: Arc<Semaphore>,
    group_by: Option<String>,
    tracker: TaskTracker,
}

impl Deliveries {
    /// Starts the deliveries of `batch`, waiting for free slots.
    async fn send(&self, batch: Vec<Claimed>) {
        for group in split(batch, self.group_by.as_deref()) {
            let Ok(permit) = self.slots.clone().acquire_owned().await else {
                return;
            };
            let (store, topic, handler) =
                (self.store.clone(), self.topic.clone(), self.handler.clone());
            self.tracker.spawn(async move {
                deliver(&*store, &topic, &*handler, group).await;
                drop(permit);
            });
        }
    }
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
    let (verdict, elapsed) = guarded(topic.spec.timeout, handler.handle_batch(&events)).await;
    let verdict = verdict.unwrap_or_else(BatchOutcome::All);
    let items: Vec<_> = batch
        .iter()
        .map(|c| {
            let outcome = verdict.for_event(c.event.id);
            let completion = settle(topic, &c.event, outcome, elapsed);
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
