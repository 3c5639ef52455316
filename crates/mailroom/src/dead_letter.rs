//! Dead letters handed on: a topic with a dead-letter topic
//! ([`TopicSpec::dead_letter`](crate::TopicSpec::dead_letter)) gets a copy
//! of each event that goes dead enqueued there, once per death, and that
//! topic's handler (a broker publisher) delivers it with its own retries.
//!
//! A copy is an ordinary event of the dead-letter topic: source
//! [`SOURCE`], dedup key `<event id>/<attempt>` (the attempt it died on,
//! which keeps counting across replays, so each death is one key and a
//! replayed event that dies again is copied again), and as payload a
//! [`DeadLetter`]: the dead event as it died, with its last error. The
//! original stays dead, and replayable, in its own topic.
//!
//! What makes the copy survive a crash: a death is noticed where its
//! outcome is resolved (the engine's attempts, pull workers' verdicts), and
//! the copy is enqueued once the store shows it; besides, every instance
//! rescans the topic's dead events at start and every [`RESCAN`] (a
//! rescued event that ran out of attempts dies in the store alone). The
//! dedup key makes both idempotent. The rescan covers dead events received
//! within `[retention] dedup`, the window in which a copy's own dedup row is
//! still kept, so an older copy is never enqueued twice.

use crate::dispatch::TopicRuntime;
use crate::shared::Shared;
use base64::Engine as _;
use bytes::Bytes;
use jiff::Timestamp;
use mailroom_core::{
    AttemptOutcome, Delivery, Event, EventId, EventSearch, ListFilter, NewEvent, Status, StoreError,
};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// The source of every dead-letter copy.
pub const SOURCE: &str = "dead-letter";

/// How often every instance rescans a topic's dead events for copies
/// that are missing (a crash between a death and its copy, a death the
/// store recorded alone).
pub const RESCAN: Duration = Duration::from_secs(60);

/// How often deaths noticed but not yet visible in the store are looked at.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// Events listed per page of a rescan.
const PAGE: u32 = 500;

/// A dead event as it died: the payload of its copy in the dead-letter
/// topic, and what a dead-letter handler publishes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The dead event's id.
    pub event_id: EventId,
    /// Its topic.
    pub topic: String,
    /// The attempt it died on (1-based; counts across replays).
    pub attempt: u32,
    /// The error of that attempt.
    pub error: Option<String>,
    /// Its source.
    pub source: String,
    /// Its dedup key.
    pub dedup_key: String,
    /// Its ordering key.
    pub key: Option<String>,
    /// Its type.
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// When it was received.
    pub received_at: Timestamp,
    /// Its correlation id.
    pub correlation_id: Option<String>,
    /// Its causation id.
    pub causation_id: Option<String>,
    /// Its version (absent in copies made before events had one).
    #[serde(default)]
    pub version: Option<String>,
    /// Its W3C `traceparent`.
    pub traceparent: Option<String>,
    /// The content type of its payload.
    pub content_type: Option<String>,
    /// Its payload, base64.
    pub payload_base64: String,
}

/// Why an event is not a dead-letter copy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeadLetterError {
    /// Its payload was purged by retention.
    #[error("the dead-letter copy's payload was purged")]
    Purged,
    /// Its payload is not a dead letter (an event enqueued by hand).
    #[error("not a dead-letter copy (source {SOURCE:?}): {0}")]
    Malformed(String),
}

impl DeadLetter {
    /// The dead letter of `event`, which died on attempt `attempt` with
    /// `error`; `None` when its payload was purged (there is nothing left
    /// to hand on).
    pub fn of(event: &Event, attempt: u32, error: Option<String>) -> Option<DeadLetter> {
        let payload = event.payload.as_ref()?;
        Some(DeadLetter {
            event_id: event.id,
            topic: event.topic.clone(),
            attempt,
            error,
            source: event.source.clone(),
            dedup_key: event.dedup_key.clone(),
            key: event.key.clone(),
            event_type: event.event_type.clone(),
            received_at: event.received_at,
            correlation_id: event.correlation_id.clone(),
            causation_id: event.causation_id.clone(),
            version: event.version.clone(),
            traceparent: event.traceparent.clone(),
            content_type: event.content_type.clone(),
            payload_base64: mailroom_core::event::base64_encode(payload),
        })
    }

    /// The dead letter a copy (an event of a dead-letter topic) carries.
    pub fn decode(copy: &Event) -> Result<DeadLetter, DeadLetterError> {
        let payload = copy.payload.as_ref().ok_or(DeadLetterError::Purged)?;
        serde_json::from_slice(payload).map_err(|e| DeadLetterError::Malformed(e.to_string()))
    }

    /// The dedup key of this death's copy, also the message id a
    /// publisher gives it: `<event id>/<attempt>`.
    pub fn death_id(&self) -> String {
        format!("{}/{}", self.event_id, self.attempt)
    }

    /// The dead event as it died (no history): what a publisher sends,
    /// with the same headers as for a live event.
    pub fn event(&self) -> Result<Event, DeadLetterError> {
        let payload = base64::engine::general_purpose::STANDARD
            .decode(&self.payload_base64)
            .map_err(|e| DeadLetterError::Malformed(format!("payload_base64: {e}")))?;
        Ok(Event {
            id: self.event_id,
            source: self.source.clone(),
            topic: self.topic.clone(),
            dedup_key: self.dedup_key.clone(),
            key: self.key.clone(),
            event_type: self.event_type.clone(),
            priority: 0,
            status: Status::Dead,
            attempts: self.attempt,
            max_attempts: self.attempt,
            next_attempt_at: None,
            received_at: self.received_at,
            correlation_id: self.correlation_id.clone(),
            causation_id: self.causation_id.clone(),
            version: self.version.clone(),
            traceparent: self.traceparent.clone(),
            content_type: self.content_type.clone(),
            payload: Some(Bytes::from(payload)),
            last_error: self.error.clone(),
            lease_until: None,
            history: vec![],
        })
    }

    /// The copy to enqueue into `into`, whose events get `max_attempts`.
    fn copy(&self, into: &str, max_attempts: u32) -> Result<NewEvent, serde_json::Error> {
        Ok(NewEvent {
            id: EventId::new(),
            source: SOURCE.into(),
            topic: into.into(),
            dedup_key: self.death_id(),
            key: None,
            event_type: self.event_type.clone(),
            correlation_id: self.correlation_id.clone(),
            causation_id: Some(self.event_id.to_string()),
            version: self.version.clone(),
            traceparent: self.traceparent.clone(),
            content_type: Some("application/json".into()),
            payload: Bytes::from(serde_json::to_vec(self)?),
            max_attempts,
            delivery: Delivery::Now,
            priority: 0,
        })
    }
}

/// The deaths a topic's attempts noticed, waiting for the relay task.
#[derive(Debug)]
pub(crate) struct Deaths {
    tx: mpsc::UnboundedSender<(EventId, u32)>,
    rx: Mutex<Option<mpsc::UnboundedReceiver<(EventId, u32)>>>,
}

impl Default for Deaths {
    fn default() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            tx,
            rx: Mutex::new(Some(rx)),
        }
    }
}

impl TopicRuntime {
    /// Notes that event `id` goes dead on attempt `attempt`, when the
    /// topic hands its dead letters on.
    pub(crate) fn died(&self, id: EventId, attempt: u32) {
        if self.spec.dead_letter.is_some() {
            // The receiver lives as long as the engine's relay task; a
            // send after it stopped is left to the next start's rescan.
            let _ = self.deaths.tx.send((id, attempt));
        }
    }
}

/// One topic's dead-letter relay: copies each death into `into` until
/// `shutdown`.
pub(crate) async fn run(
    shared: Arc<Shared>,
    topic: Arc<TopicRuntime>,
    into: String,
    shutdown: CancellationToken,
) {
    let Some(mut noticed) = topic
        .deaths
        .rx
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    else {
        return;
    };
    let relay = Relay {
        shared,
        topic,
        into,
    };
    let mut waiting: Vec<(EventId, u32, Instant)> = vec![];
    let mut rescan = tokio::time::interval(RESCAN);
    let mut check = tokio::time::interval(CHECK_EVERY);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            Some((id, attempt)) = noticed.recv() => {
                // The outcome is committed within the lease, or not at all.
                let until = Instant::now() + relay.topic.spec.lease;
                waiting.push((id, attempt, until));
            }
            _ = check.tick(), if !waiting.is_empty() => {
                let mut still = vec![];
                for (id, attempt, until) in waiting.drain(..) {
                    if !relay.death(id, attempt).await && Instant::now() < until {
                        still.push((id, attempt, until));
                    }
                }
                waiting = still;
            }
            _ = rescan.tick() => {
                if let Err(e) = relay.rescan().await {
                    warn!(topic = %relay.topic.spec.name, error = %e, "could not rescan dead events for their dead-letter copies; trying again later");
                }
            }
        }
    }
}

struct Relay {
    shared: Arc<Shared>,
    topic: Arc<TopicRuntime>,
    into: String,
}

impl Relay {
    /// Copies the death of `id` on `attempt` if the store shows it;
    /// `false` while it does not yet (its outcome is being committed).
    async fn death(&self, id: EventId, attempt: u32) -> bool {
        let event = match self.shared.store.get(id).await {
            Ok(Some(event)) => event,
            Ok(None) => return true,
            Err(e) => {
                debug!(event_id = %id, error = %e, "dead-letter check: store read failed");
                return false;
            }
        };
        let Some(a) = event.history.iter().find(|a| a.attempt == attempt) else {
            return false;
        };
        match (a.outcome, a.finished_at) {
            (AttemptOutcome::Dead, Some(_)) => {
                let error = a.error.clone();
                self.copy(&event, attempt, error).await.is_ok()
            }
            // Still running: its outcome is not committed yet.
            (_, None) => false,
            // The outcome was not recorded (a lost lease): no death.
            _ => true,
        }
    }

    /// Copies every dead event of the topic received within the dedup
    /// window (duplicates are dropped by the copies' dedup keys).
    async fn rescan(&self) -> Result<(), StoreError> {
        let now = self.shared.store.now().await?;
        let window = jiff::SignedDuration::try_from(self.shared.retention.dedup)
            .unwrap_or(jiff::SignedDuration::MAX);
        let from = now.checked_sub(window).unwrap_or(Timestamp::MIN);
        let mut search = EventSearch {
            filter: ListFilter {
                topic: Some(self.topic.spec.name.clone()),
                status: Some(Status::Dead),
                limit: PAGE,
                ..ListFilter::default()
            },
            received_from: Some(from),
            ..EventSearch::default()
        };
        loop {
            let page = self.shared.store.search(&search).await?;
            for event in &page.events {
                self.copy(event, event.attempts, event.last_error.clone())
                    .await?;
            }
            match page.next_cursor {
                Some(c) => search.filter.cursor = Some(c),
                None => return Ok(()),
            }
        }
    }

    /// Enqueues the copy of `event`'s death on `attempt`.
    async fn copy(
        &self,
        event: &Event,
        attempt: u32,
        error: Option<String>,
    ) -> Result<(), StoreError> {
        let Some(letter) = DeadLetter::of(event, attempt, error) else {
            warn!(event_id = %event.id, topic = %event.topic, "dead event not handed on: its payload was purged");
            return Ok(());
        };
        let max_attempts = self
            .shared
            .topic(&self.into)
            .map_or(mailroom_core::RetryPolicy::DEFAULT_MAX_ATTEMPTS, |t| {
                t.retry.max_attempts
            });
        let copy = match letter.copy(&self.into, max_attempts) {
            Ok(copy) => copy,
            Err(e) => {
                warn!(event_id = %event.id, error = %e, "dead event not handed on: it could not be encoded");
                return Ok(());
            }
        };
        let inserted = self.shared.store.insert(copy).await?;
        if !inserted.duplicate {
            debug!(event_id = %event.id, attempt, into = %self.into, "dead event handed on");
            self.shared.wake(&self.into);
        }
        Ok(())
    }
}
